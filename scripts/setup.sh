#!/usr/bin/env bash
# Create .venv and install tfm into it, with the extras named as arguments (e.g. `setup.sh dev` for the tests; none:
# what training and translating need). torch comes first and is kept if already there: the default is the 2.13.0
# CPU wheel; a GPU user sets TORCH_SPEC (or pre-installs a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
extras=$(IFS=,; echo "$*")
.venv/bin/pip install --quiet -e ".${extras:+[$extras]}"
