#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one call of at most 8 minutes on a fresh machine:
#   1. the redirect unit tests and the CUDA-script corpus with the `cuda` backend selected
#      (there the redirection must change nothing: each script's losses are compared with the
#      same script run without flagos_torchfl);
#   2. the overhead benchmark with the `cuda` backend (activation is a no-op there: ratio ~1.00).
# Usage, from anywhere:  bash benchmarks/gpu_check.sh
# Optional: WHEELS=/path/to/wheels to install torch/transformers/pytest without an index.
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
say() { echo "== [$(( $(date +%s) - START ))s] $*"; }

need_install=0
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || need_install=1
if [ "$need_install" = 1 ]; then
    say "installing torch with CUDA (none usable found)"
    if [ -n "${WHEELS:-}" ]; then
        timeout 240 pip install -q --no-index --find-links "$WHEELS" torch transformers pytest pytest-timeout
    else
        timeout 240 pip install -q torch transformers pytest pytest-timeout
    fi
fi
for module in transformers pytest pytest_timeout; do
    python -c "import $module" 2>/dev/null || timeout 120 pip install -q "${module//_/-}" \
        ${WHEELS:+--no-index --find-links "$WHEELS"}
done
timeout 60 pip install -q -e . --no-deps
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
python -m flagos_torchfl detect || true

export FL_BACKEND=cuda
say "tests: redirect units + corpus (backend cuda)"
timeout 210 python -m pytest tests/redirect tests/e2e/corpus -q -p no:cacheprovider --timeout 200
tests_rc=$?

say "benchmark: redirect overhead (backend cuda, 11 pairs)"
timeout 150 python benchmarks/redirect_overhead.py --backend cuda --pairs 11
bench_rc=$?

say "done: tests exit $tests_rc, benchmark exit $bench_rc"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
