#!/usr/bin/env bash
# The decoding comparison on a CUDA device, in a few minutes: extract 20,000 ShareGPT tokens of
# SmolLM2-135M, train a `quick` head on the EAGLE-3 default layers, then run the target alone,
# Hugging Face prompt lookup, chain, tree and auto side by side on 5 MT-Bench and 5 held-out
# ShareGPT prompts × 64 tokens, every output checked against the target's, and profile a round
# (CUDA-synchronised timers). Writes benchmarks/out/evaluate-cuda.json.
#
#     bash benchmarks/gpu_check.sh          # after: bash deploy/setup.sh, with a CUDA torch in .venv
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this check needs a GPU')"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
export PREFECT_HOME="${PREFECT_HOME:-$(mktemp -d)}"
.venv/bin/python benchmarks/evaluate.py --device cuda --tokens 20000 --limit 5 --max-new-tokens 64 \
    --out benchmarks/out/evaluate-cuda.json "$@"
