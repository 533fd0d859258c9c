#!/usr/bin/env bash
# One command from a fresh clone: install, then run the main job on the built-in default
# (smollm2-135m over ShareGPT into ./layerwave.zarr, embedded Prefect, no server).
# Extra arguments go to `layerwave extract`, e.g. `bash deploy/quickstart.sh --tokens 5000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
exec .venv/bin/layerwave extract "$@"
