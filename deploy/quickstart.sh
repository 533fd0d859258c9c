#!/usr/bin/env bash
# One command from a fresh clone: install, then run the whole pipeline on the built-in default
# (smollm2-135m, quick preset, ./layerwave.zarr; embedded Prefect, no server): let the model
# answer ShareGPT prompts itself, extract 20,000 tokens of those conversations, analyse every
# layer, propose layer sets, train and evaluate a draft head for the EAGLE-3
# default and the best proposals, and write layerwave.reports/smollm2-135m/report.md.
# Re-running skips every finished stage.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
.venv/bin/layerwave run "$@"
