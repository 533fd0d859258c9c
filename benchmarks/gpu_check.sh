#!/usr/bin/env bash
# Two checks on a CUDA device, each a few minutes; each writes JSON under benchmarks/out/.
#
# 1. Decoding: extract 20,000 ShareGPT tokens of SmolLM2-135M, train a `quick` head on the EAGLE-3
#    default layers, then run the target alone, Hugging Face prompt lookup, chain, tree, hybrid and
#    auto side by side on 5 MT-Bench and 5 held-out ShareGPT prompts × 64 tokens, every output
#    checked against the target's, and profile a round (CUDA-synchronised timers).
#    Writes evaluate-cuda.json.
# 2. The scaling curve at GPU scale: 1M reply tokens of the target's own greedy replies generated
#    and extracted (layers 2, 15, 27) on the GPU, then the curve's recipe trained to 1.0e8
#    token-passes (64 windows a step, lr 4e-3) and measured at 6 points from 3.2M, with the same
#    columns as benchmarks/scaling_curve.py (evaluation on the CPU). Writes scaling_curve_cuda.json
#    and .png, beside the CPU curve. Stage times go to stdout.
#
#     bash benchmarks/gpu_check.sh [decode|curve|all]   # after: bash deploy/setup.sh, with a CUDA torch in .venv
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
.venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this check needs a GPU')"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 PYTHONPATH=.
export PREFECT_HOME="${PREFECT_HOME:-$(mktemp -d)}"
work="${LAYERWAVE_GPU_WORK:-gpu-check}"  # ignored by git: stores and heads stay out of the repository
if [[ "$what" == decode || "$what" == all ]]; then
    .venv/bin/python benchmarks/evaluate.py --device cuda --tokens 20000 --limit 5 --max-new-tokens 64 \
        --out benchmarks/out/evaluate-cuda.json
fi
if [[ "$what" == curve || "$what" == all ]]; then
    SECONDS=0
    .venv/bin/layerwave generate --model smollm2-135m --device cuda --dtype bfloat16 --tokens 1000000 --turns 1 \
        --max-prompt-tokens 512 --batch-size 256 --shard-size 1024 --out "$work/regen-1m"
    echo "generation: ${SECONDS} s"; SECONDS=0
    .venv/bin/layerwave extract --model smollm2-135m --device cuda --dtype bfloat16 --corpus "regen:$work/regen-1m" \
        --tokens 4000000 --layers 2,15,27 --store "$work/curve-1m.zarr"
    echo "extraction: ${SECONDS} s"; SECONDS=0
    beside=(); [[ -f benchmarks/out/scaling_curve.json ]] && beside=(--beside benchmarks/out/scaling_curve.json)
    .venv/bin/python benchmarks/scaling_curve.py --store "$work/curve-1m.zarr" --device cuda --batch-size 64 \
        --lr 4e-3 --first 3200000 --points 6 --work "$work/curve-heads" --out benchmarks/out/scaling_curve_cuda.json \
        "${beside[@]}"
    echo "curve: ${SECONDS} s"
fi
