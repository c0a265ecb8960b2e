#!/usr/bin/env bash
# Install and run the test suite (fast tests; add -m slow for the long ones).
# Multi30k is read from $TFM_MULTI30K, by default ../shared/data/multi30k beside the project;
# Tatoeba English-Chinese from $TFM_TATOEBA, by default ../shared/data/tatoeba-cmn-eng.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export TFM_MULTI30K="${TFM_MULTI30K:-$(cd .. && pwd)/shared/data/multi30k}"
export TFM_TATOEBA="${TFM_TATOEBA:-$(cd .. && pwd)/shared/data/tatoeba-cmn-eng}"
exec .venv/bin/python -m pytest -q "$@"
