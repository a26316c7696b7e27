#!/usr/bin/env bash
# The device-aware tests on a CUDA device: every test file whose problems come from
# hypergrad.testing.digits_case, which builds them on $HYPERGRAD_TEST_DEVICE (here cuda), so the
# library's own paths (Trainer defaults, bounds, start points, hvp strategies, resume, the CLI)
# run with the model, data and hyperparameters on the GPU. Usage, on a GPU machine, from the
# repository root:
#
#     bash experiments/benchmarks/cuda_tests.sh [SECONDS] [OUT]
#
# SECONDS: pytest's wall-clock limit (default 420; 14 workers ran 364 tests in 254 s on an H100);
# OUT: where pytest.log and junit.xml go (default $OUT, else .). Hydra, OmegaConf, antlr4 and the
# joblib launcher are not in the device machines' image: copy them from .venv's site-packages
# into an ignored folder and name it in $SITE (default .gpu/site), as docs/benchmarks.md says.
set -o pipefail
OUT=${2:-${OUT:-.}}
export PYTHONPATH=$PWD/${SITE:-.gpu/site}:$PWD PYTHONUNBUFFERED=1 HYPERGRAD_TEST_DEVICE=cuda
nvidia-smi -L
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" || exit 2
T="defaults trainer trainer_methods online forward reverse reverse_tape implicit init_hyperparams
   errors finite_diff hvp auto_methods registry run_folder cli testing memory_estimates
   cuda_paths auto_compile distributed"
FILES=$(for t in $T; do printf 'tests/test_%s.py ' "$t"; done)
# -p no:benchmark: pytest-benchmark (in the image) warns beside xdist, and warnings are errors
timeout -k 5 "${1:-420}" python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 14 -v \
    --tb=short -rf --timeout 150 --durations 15 --junitxml "$OUT/junit.xml" $FILES 2>&1 \
    | tee "$OUT/pytest.log" | grep -E "FAILED|ERROR|passed|failed" | tail -60
