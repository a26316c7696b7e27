#!/usr/bin/env bash
# The device-aware tests on a CUDA device: every test file whose problems come from
# hypergrad.testing.digits_case, which builds them on $HYPERGRAD_TEST_DEVICE (here cuda), and
# test_config's hypergrad-run device=cuda, so the library's own paths (Trainer defaults, bounds, start points, hvp strategies, resume, the CLI)
# run with the model, data and hyperparameters on the GPU. Usage, on a GPU machine, from the
# repository root:
#
#     bash experiments/benchmarks/cuda_tests.sh --prepare      # here, once: .gpu/site
#     bash experiments/benchmarks/cuda_tests.sh [SECONDS] [OUT] # there (the device tool: carry .gpu)
#
# SECONDS: pytest's wall-clock limit (default 420: on an H200, 15 workers ran 476 tests in 333 s,
# seven of them past a 150 s per-test limit); at the limit pytest gets SIGINT and still writes
# the failures so far. OUT: where pytest.log and junit.xml go (default $OUT, else .). WORKERS:
# pytest-xdist's workers (default 14); TESTS: other test files or node ids (default: the list
# below). Hydra, OmegaConf, antlr4 and the joblib launcher are not in the device machines'
# image: --prepare copies them (pure Python) from .venv's site-packages into .gpu/site, which
# .git/info/exclude ignores ($SITE names another folder).
set -o pipefail
if [ "${1:-}" = "--prepare" ]; then
    src=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") || exit 2
    mkdir -p .gpu/site .git/info
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    for d in hydra omegaconf antlr4 hydra_plugins hydra_core-*.dist-info omegaconf-*.dist-info \
             antlr4_python3_runtime-*.dist-info hydra_joblib_launcher-*.dist-info; do
        cp -r "$src"/$d .gpu/site/ || exit 2
    done
    find .gpu -name __pycache__ -prune -exec rm -rf {} +
    du -sh .gpu/site
    exit 0
fi
OUT=${2:-${OUT:-.}}
export PYTHONPATH=$PWD/${SITE:-.gpu/site}:$PWD PYTHONUNBUFFERED=1 HYPERGRAD_TEST_DEVICE=cuda
# one CPU thread per worker: 14 workers of 16 threads each on 16 cores (and their subprocesses)
# left seven tests past 150 s on an H200 that take 1-2 s each on 2 CPU cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
nvidia-smi -L
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" || exit 2
T="defaults trainer trainer_methods online forward reverse reverse_tape implicit init_hyperparams
   errors finite_diff hvp auto_methods registry run_folder cli testing memory_estimates
   cuda_paths auto_compile distributed config sparse_problem"
FILES=${TESTS:-$(for t in $T; do printf 'tests/test_%s.py ' "$t"; done)}
# -p no:benchmark: pytest-benchmark (in the image) warns beside xdist, and warnings are errors
# SIGINT at the limit: pytest stops and still prints the failures so far (SIGTERM lost them)
timeout -s INT -k 30 "${1:-420}" python3 -m pytest -p no:cacheprovider -p no:benchmark -n ${WORKERS:-14} -v \
    --tb=short -rf --timeout 200 --durations 15 --junitxml "$OUT/junit.xml" $FILES 2>&1 \
    | tee "$OUT/pytest.log" | grep -E "FAILED|ERROR|passed|failed" | tail -60
