#!/usr/bin/env bash
# The main job, offline: install, train the quickstart model on data/sample, then translate.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/tfm train --config configs/quickstart.yaml --overwrite
.venv/bin/tfm translate "Ein Mann fährt Fahrrad."
.venv/bin/tfm translate "Die Frau liest ein Buch im Park."
