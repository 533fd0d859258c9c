#!/usr/bin/env bash
# One command from a fresh clone: install, then run the main job on the built-in default
# (smollm2-135m over ShareGPT into ./layerwave.zarr, then its layer statistics; embedded Prefect,
# no server). For other models, corpora or stores run `.venv/bin/layerwave extract|analyze --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
.venv/bin/layerwave extract
# Each document's first token carries massive activations that swamp the statistics of the
# middle layers (effective rank ~1.2 instead of ~175 for SmolLM2), so the quick start drops it.
.venv/bin/layerwave analyze --drop-first-token --json layerwave.reports/smollm2-135m/analysis.json
