#!/usr/bin/env bash
# One command from a fresh clone: install, then run the main job on the built-in default
# (smollm2-135m over ShareGPT into ./layerwave.zarr, then its layer statistics; embedded Prefect,
# no server). For other models, corpora or stores run `.venv/bin/layerwave extract|analyze --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
.venv/bin/layerwave extract
.venv/bin/layerwave analyze --json layerwave.reports/smollm2-135m/analysis.json
