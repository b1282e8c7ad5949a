#!/usr/bin/env bash
# Run the core's tests against the oldest supported torch in a side environment.
# PyPI's Linux x86_64 torch 2.4 wheels are CUDA builds (~2.7 GB with their nvidia-* deps).
# Usage: tools/check_oldest_torch.sh [TORCH_VERSION] [VENV_DIR]
set -euo pipefail
version=${1:-2.4.1}
venv=${2:-/tmp/venv-torch-$version}
root=$(cd "$(dirname "$0")/.." && pwd)
python3 -m venv "$venv"
"$venv/bin/pip" install -q "torch==$version" pytest pytest-timeout "setuptools>=70.1"
"$venv/bin/pip" install -q --no-deps -e "$root"
cd "$root"
"$venv/bin/python" -m flagos_torchfl detect
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest tests/foundation -q -p no:cacheprovider
