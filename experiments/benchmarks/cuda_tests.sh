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
# SECONDS: pytest's wall-clock limit (default 420; 14 workers ran 364 tests in 254 s on an H100,
# 10 of them past a 90 s per-test limit); OUT: where pytest.log and junit.xml go (default $OUT,
# else .). Hydra, OmegaConf, antlr4 and the joblib launcher are not in the device machines'
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
nvidia-smi -L
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" || exit 2
T="defaults trainer trainer_methods online forward reverse reverse_tape implicit init_hyperparams
   errors finite_diff hvp auto_methods registry run_folder cli testing memory_estimates
   cuda_paths auto_compile distributed config"
FILES=$(for t in $T; do printf 'tests/test_%s.py ' "$t"; done)
# -p no:benchmark: pytest-benchmark (in the image) warns beside xdist, and warnings are errors
timeout -k 5 "${1:-420}" python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 12 -v \
    --tb=short -rf --timeout 200 --durations 15 --junitxml "$OUT/junit.xml" $FILES 2>&1 \
    | tee "$OUT/pytest.log" | grep -E "FAILED|ERROR|passed|failed" | tail -60
