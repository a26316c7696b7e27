"""A character-level transformer language model on text that needs no download: the Python
standard library's own source files of the running interpreter (or any text file you give).

- :func:`stdlib_corpus`: the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` (no
  ``site-packages``, no ``test``/``tests`` folders), split into train / validation / test **by
  file** (a seeded permutation of the sorted paths), each split cut to a number of characters;
  :func:`text_corpus`: one text file cut into three contiguous parts.
- :class:`CharVocab`: the characters of the training split (id 0 for any other character).
- :class:`CharTransformer`: token and position embeddings, ``n_layers`` pre-LayerNorm blocks
  (causal multi-head self-attention through ``F.scaled_dot_product_attention``, a GELU MLP),
  dropout on the embeddings and on each residual branch, a final LayerNorm and a linear head.
- :data:`LAYER_GROUPS`: the model's layer groups for :class:`~hypergrad.PerGroup` (weight
  decay per layer group: the embeddings, the attention and MLP matrices, the head, and the
  LayerNorms and biases), matched by regular expressions on the parameter names
  (``hypergrad.tasks.charlm.PerGroup`` is the core class, kept here for configs that name it).
- :func:`charlm_task`: the :class:`~hypergrad.Task` of ``hypergrad-run experiment=charlm``:
  random windows of the training text as mini-batches (step ``t`` draws its batch from
  ``(seed, t)``: the same in every run), ``E`` = the validation cross-entropy (nats per
  character) on fixed windows, ``evaluate`` = validation and test **bits per character**.

Bits per character here are per character of the text as Python reads it (UTF-8 decoded), the
cross-entropy in nats divided by ``ln 2``.
"""

from __future__ import annotations

import hashlib
import math
import sys
import sysconfig
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import HypergradWarning
from ..hyperparams import HyperParams, PerGroup
from ..optim import Optimizer
from ..problem import InnerProblem, InnerState
from ..rng import keeps_rng
from ..task import Task

__all__ = ["Corpus", "stdlib_corpus", "text_corpus", "CharVocab", "CharTransformer",
           "transformer_factory", "PerGroup", "LAYER_GROUPS", "layer_groups", "CharBatches",
           "charlm_task", "bits_per_char"]

LN2 = math.log(2.0)


@dataclass
class Corpus:
    """Three texts and where they came from (``source``; ``files``: per split, for a corpus of
    files)."""

    train: str
    val: str
    test: str
    source: str
    files: dict[str, list[str]] = field(default_factory=dict)

    def digest(self) -> str:
        """A short hash of the three texts (results record which corpus they measured)."""
        h = hashlib.sha256()
        for s in (self.train, self.val, self.test):
            h.update(s.encode("utf-8", "replace"))
        return h.hexdigest()[:16]


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files (sorted; no site-packages, no test folders)."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "__pycache__"}
    return sorted(p for p in base.rglob("*.py")
                  if not skip.intersection(p.relative_to(base).parts))


def _take(files: Sequence[Path], limit: int, base: Path) -> tuple[str, list[str]]:
    parts, used, n = [], [], 0
    for f in files:
        if n >= limit:
            break
        text = f.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        used.append(str(f.relative_to(base)))
        n += len(text) + 2
    return "\n\n".join(parts)[:limit], used


def stdlib_corpus(train_chars: int = 1_000_000, val_chars: int = 100_000,
                  test_chars: int = 200_000, seed: int = 0,
                  fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                  root: str | Path | None = None) -> Corpus:
    """The running interpreter's standard library, split by file: a permutation of the sorted
    files (``seed``) is cut by ``fractions`` into train / validation / test files, and each
    split's files are concatenated and cut to its number of characters."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    files = stdlib_files(base)
    if len(files) < 3:
        raise ValueError(f"stdlib_corpus: found {len(files)} .py files under {base}; give a "
                         f"text file instead (corpus='file', text_file=...).")
    perm = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    order = [files[i] for i in perm]
    n_tr = int(round(fractions[0] * len(order)))
    n_va = int(round(fractions[1] * len(order)))
    splits = {"train": order[:n_tr], "val": order[n_tr:n_tr + n_va],
              "test": order[n_tr + n_va:]}
    empty = [name for name, part in splits.items() if not part]
    if empty:
        raise ValueError(f"stdlib_corpus: fractions={tuple(fractions)} of the {len(files)} .py "
                         f"files under {base} leave {empty} without a file; give more files or "
                         f"other fractions, or a text file instead (corpus='file', "
                         f"text_file=...).")
    texts, used = {}, {}
    for name, limit in (("train", train_chars), ("val", val_chars), ("test", test_chars)):
        texts[name], used[name] = _take(splits[name], limit, base)
    return Corpus(texts["train"], texts["val"], texts["test"],
                  f"Python {sys.version.split()[0]} standard library ({base})", used)


def text_corpus(path: str | Path, fractions: tuple[float, float, float] = (0.9, 0.05, 0.05)
                ) -> Corpus:
    """Any text file (UTF-8), cut into three contiguous parts (train, validation, test)."""
    from .bundled import user_file

    data = user_file(path, "text_corpus",
                     "give a UTF-8 text file (hypergrad-run: task.text_file=<path>)").read_bytes()
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in data:
        # UTF-16 text of ASCII characters is valid UTF-8 with a NUL after each character
        raise ValueError(f"text_corpus: {path} holds NUL bytes or a UTF-16 byte-order mark: it "
                         f"is UTF-16 (or binary), not UTF-8 text; re-encode it, e.g. `iconv -f "
                         f"utf-16 -t utf-8 {path} > text.txt`.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:  # replacing them would merge every such character in one
        raise ValueError(f"text_corpus: {path} is not UTF-8 (byte {err.start} is "
                         f"{data[err.start:err.start + 1]!r}); re-encode it, e.g. `iconv -f "
                         f"latin1 -t utf-8 {path} > text.txt`.") from None
    if len(text) < 1000:
        raise ValueError(f"text_corpus: {path} has {len(text)} characters; give at least "
                         f"1000 (its validation and test parts are 5 % of it each).")
    a = int(fractions[0] * len(text))
    b = a + int(fractions[1] * len(text))
    return Corpus(text[:a], text[a:b], text[b:], f"text file {path}")


UNSEEN_SHARE = 0.01
"""The share of a validation or test text's characters outside the training text's vocabulary
above which :func:`charlm_task` warns (each is id 0, one "unknown" character)."""


def _warn_unseen(part: str, text: Corpus, ids: Tensor) -> None:
    """Warn where much of the validation or test text is made of characters the training text
    lacks: they all read as one unknown character, so the validation loss (what tuning
    minimises) and the bits per character measure mostly how well the model predicts it."""
    unseen = int((ids == 0).sum())
    if unseen <= UNSEEN_SHARE * ids.numel():
        return
    chars = sorted(set(text.val if part == "validation" else text.test) - set(text.train))
    warnings.warn(f"charlm_task: {unseen} of the {ids.numel()} characters of the {part} text of "
                  f"{text.source} ({unseen / ids.numel():.0%}) never occur in its training text "
                  f"(e.g. {''.join(chars[:10])!r}) and all read as one unknown character: its "
                  f"losses measure mostly that. Give a text whose parts share their characters "
                  f"(the file is cut 90 / 5 / 5 % in order: mix or reorder its contents).",
                  HypergradWarning, stacklevel=4)  # past charlm_task and keeps_rng's wrapper


class CharVocab:
    """The characters of a text, sorted; id 0 is any character not in it."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.index = {c: i + 1 for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars) + 1

    def encode(self, text: str) -> Tensor:
        get = self.index.get
        return torch.tensor([get(c, 0) for c in text], dtype=torch.long)

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        chars = ["\ufffd", *self.chars]
        return "".join(chars[int(i)] for i in ids)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention and a GELU MLP, each a residual
    branch with dropout."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, mlp_ratio: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"Block: d_model={d_model} must be a multiple of n_heads={n_heads}.")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, mlp_ratio * d_model)
        self.out = nn.Linear(mlp_ratio * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, n, h, d // h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(b, n, d)
        x = x + self.drop(self.proj(a))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class CharTransformer(nn.Module):
    """A small GPT-style character model: ``forward(ids (B, L)) -> logits (B, L, vocab)``."""

    def __init__(self, vocab: int, context: int, d_model: int = 64, n_layers: int = 2,
                 n_heads: int = 4, dropout: float = 0.1, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(context, d_model))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dropout, mlp_ratio)
                                    for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("weight") and p.ndim == 2:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("proj.weight",
                                                                        "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        nn.init.normal_(self.pos, 0.0, 0.01)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.drop(self.embed(ids) + self.pos[: ids.shape[1]])
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))  # type: ignore[no-any-return]


def transformer_factory(d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                        dropout: float = 0.1, mlp_ratio: int = 4
                        ) -> Callable[[int, int], nn.Module]:
    """``(vocab, context) -> CharTransformer`` (the ``model`` group's ``charlm`` option)."""
    return lambda vocab, context: CharTransformer(vocab, context, d_model, n_layers, n_heads,
                                                  dropout, mlp_ratio)


LAYER_GROUPS = {"embed": r"^(embed|pos)",
                "attention": r"\.(qkv|proj)\.weight$",
                "mlp": r"\.(fc|out)\.weight$",
                "head": r"^head\.weight$",
                "norm_bias": r"(ln|bias)"}
"""The layer groups of :class:`CharTransformer` for :class:`~hypergrad.PerGroup` (the first
pattern that matches a parameter's name wins): the embeddings, the attention matrices, the MLP
matrices, the head, and the LayerNorms and biases together."""


def layer_groups() -> dict[str, str]:
    """A copy of :data:`LAYER_GROUPS`."""
    return dict(LAYER_GROUPS)


class CharBatches:
    """Step ``t`` -> ``(x, y)``: ``batch_size`` windows of ``context`` characters of the training
    ids at offsets drawn from ``(seed, t)``, and the next characters (the same batch at step
    ``t`` in every run, nothing stored)."""

    def __init__(self, ids: Tensor, batch_size: int, context: int, seed: int = 0) -> None:
        if ids.numel() <= context + 1:
            raise ValueError(f"CharBatches: {ids.numel()} training characters; need more than "
                             f"context + 1 = {context + 1}.")
        self.ids, self.batch_size, self.context, self.seed = ids, batch_size, context, seed
        self.span = torch.arange(context + 1)

    def __call__(self, t: int) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + t)
        start = torch.randint(0, self.ids.numel() - self.context - 1, (self.batch_size,),
                              generator=g)
        w = self.ids[start[:, None] + self.span]
        return w[:, :-1], w[:, 1:]


def windows(ids: Tensor, context: int, limit: int | None = None) -> tuple[Tensor, Tensor]:
    """Non-overlapping windows of ``ids`` (inputs and next characters), at most ``limit``."""
    n = (ids.numel() - 1) // context
    if limit is not None:
        n = min(n, limit)
    x = ids[: n * context].reshape(n, context)
    y = ids[1: n * context + 1].reshape(n, context)
    return x, y


def bits_per_char(model: Any, x: Tensor, y: Tensor, chunk: int = 64) -> float:
    """Mean cross-entropy of ``model`` on windows ``(x, y)``, in bits per character."""
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], chunk):
            logits = model(x[i:i + chunk])
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           y[i:i + chunk].reshape(-1), reduction="sum"))
            n += y[i:i + chunk].numel()
    return total / n / LN2


@keeps_rng
def charlm_task(hyperparams: HyperParams, optimizer: Optimizer,
                model: Callable[[int, int], nn.Module], steps: int = 1000,
                batch_size: int = 16, context: int = 64, seed: int = 0, data_seed: int = 0,
                corpus: str = "stdlib", text_file: str | None = None,
                train_chars: int = 1_000_000, val_chars: int = 100_000,
                test_chars: int = 200_000, val_windows: int = 64,
                eval_windows: int | None = 512, dtype: str = "float32",
                device: str = "cpu") -> Task:
    """The character-level LM task (see the module docstring).

    ``seed`` fixes the model's initialisation, the batches and the dropout masks;
    ``data_seed`` the split of the files. ``E`` is the validation cross-entropy (nats per
    character) on ``val_windows`` fixed windows of the validation text; ``evaluate`` reports
    ``val_bpc`` and ``test_bpc`` on up to ``eval_windows`` windows of each (``None``: all).
    ``corpus="file"`` reads ``text_file`` instead of the standard library (cut 90 / 5 / 5 % in
    order: ``data_seed`` and the ``*_chars`` sizes apply to the standard library only). ``device``:
    :func:`~hypergrad.tasks.bundled.device_of`."""
    from .bundled import device_of, dtype_of

    dt, dev = dtype_of(dtype), device_of(device)
    if corpus == "stdlib" and text_file:  # the file was ignored: the report read as its own
        raise ValueError(f"charlm_task: text_file={text_file!r} with corpus='stdlib', which "
                         f"reads the standard library, not the file; give corpus='file' to "
                         f"read it (hypergrad-run: task.corpus=file), or drop text_file.")
    if corpus == "stdlib":
        text = stdlib_corpus(train_chars, val_chars, test_chars, seed=data_seed)
    elif corpus == "file":
        if not text_file:
            raise ValueError("charlm_task: corpus='file' needs text_file=<path>.")
        text = text_corpus(text_file)
    else:
        raise ValueError(f"charlm_task: corpus={corpus!r}; use 'stdlib' or 'file'.")
    vocab = CharVocab(text.train)
    train_ids = vocab.encode(text.train).to(dev)  # the batches are drawn there
    val_ids, test_ids = vocab.encode(text.val).to(dev), vocab.encode(text.test).to(dev)
    fix = ("larger val_chars and test_chars" if corpus == "stdlib" else
           f"the validation and test parts are 5 % of the file each: at least "
           f"{20 * (context + 1)} characters for context={context}")
    for part, ids in (("validation", val_ids), ("test", test_ids)):
        if ids.numel() <= context:
            raise ValueError(f"charlm_task: the {part} text of {text.source} has {ids.numel()} "
                             f"characters, fewer than context + 1 = {context + 1} (one window); "
                             f"give a longer text ({fix}) or a smaller context.")
    for part, ids in (("validation", val_ids), ("test", test_ids)):
        _warn_unseen(part, text, ids)
    xv, yv = windows(val_ids, context, val_windows)
    ev_val = windows(val_ids, context, eval_windows)
    ev_test = windows(test_ids, context, eval_windows)
    torch.manual_seed(seed)
    net = model(len(vocab), context).to(device=dev, dtype=dt)

    def train_loss(m: Any, batch: Any, hp: Any) -> Tensor:
        x, y = batch
        logits = m(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def val_loss(m: Any, hp: Any) -> Tensor:
        logits = m(xv)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yv.reshape(-1))

    problem = InnerProblem(net, train_loss, optimizer, hyperparams,
                           CharBatches(train_ids, batch_size, context, seed), steps, val_loss,
                           seed=seed)

    def evaluate(state: InnerState) -> dict[str, float]:
        m = problem.model(state)
        return {"val_bpc": bits_per_char(m, *ev_val), "test_bpc": bits_per_char(m, *ev_test)}

    def extra(lam: Tensor) -> dict[str, Any]:
        # model_learned.pt holds token ids: without the characters they stand for it could be
        # used only by rebuilding the same text (the standard library of the same Python)
        return {"vocab": "".join(vocab.chars),
                "vocab_note": "token id i + 1 is vocab[i]; id 0 is any other character"}

    # the test text is read by evaluate only: a resume must see an edit of it too
    task = Task(problem, evaluate, name="charlm", extra=extra,
                fingerprint={"task.corpus_digest": text.digest()})
    task.corpus = text  # type: ignore[attr-defined]
    task.vocab = vocab  # type: ignore[attr-defined]
    return task
