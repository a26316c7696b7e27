"""Scale-out over processes with ``torch.distributed``, launched by ``torchrun``: forward mode's
tangent columns split across ranks, mini-batches split across ranks, or both on a 2-D mesh
(data x columns); reverse mode's mini-batches split.

- :mod:`~hypergrad.distributed.process`: the process group (:func:`launch`, :func:`init`,
  rank, world size, failed collectives as :class:`~hypergrad.errors.DistributedError`).
- :mod:`~hypergrad.distributed.mesh`: the ``data x columns`` mesh, sums over its groups, the
  column assignment.
- :mod:`~hypergrad.distributed.shard`: a rank's shard of every mini-batch.
- :mod:`~hypergrad.distributed.parallel`: :class:`ParallelForward`, :class:`ParallelReverse`.
- :mod:`~hypergrad.distributed.strategy`: :class:`Ranks`, the Trainer's strategy under torchrun.

Example (``torchrun --nproc_per_node=2 tune.py``; ``python tune.py`` gives the same result)::

    with hypergrad.distributed.launch():
        result = hypergrad.Trainer(problem, strategy=hypergrad.distributed.Ranks()).fit()
"""

from __future__ import annotations

from .mesh import Mesh, assign_columns, mesh
from .parallel import ParallelForward, ParallelReverse, column_parallel, data_parallel
from .process import (
    DEFAULT_TIMEOUT,
    TIMEOUT_ENV,
    active,
    barrier,
    broadcast_object,
    device,
    init,
    is_writer,
    launch,
    launched,
    rank,
    world_size,
)
from .shard import shard_batch
from .strategy import Ranks

__all__ = ["launch", "init", "launched", "active", "rank", "world_size", "is_writer", "device",
           "barrier", "broadcast_object", "Mesh", "mesh", "assign_columns", "shard_batch",
           "ParallelForward", "ParallelReverse", "column_parallel", "data_parallel", "Ranks",
           "DEFAULT_TIMEOUT", "TIMEOUT_ENV"]
