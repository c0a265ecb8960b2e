#!/usr/bin/env bash
# Install and run the test suite (fast tests; add -m slow for the long ones).
# Multi30k is read from $TFM_MULTI30K, by default ../shared/data/multi30k beside the project.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TFM_MULTI30K="${TFM_MULTI30K:-$(cd .. && pwd)/shared/data/multi30k}"
exec .venv/bin/python -m pytest -q "$@"
