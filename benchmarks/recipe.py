"""The draft-head recipe, one change at a time, at equal token-passes, on one training store.

    python benchmarks/recipe.py --store STORE [--model smollm2-135m] [--passes 400000]
                                [--rows N ...] [--out benchmarks/out/recipe.json]

STORE is a training store of the EAGLE-3 default layers, best of the target's own replies:
`layerwave generate --dtype bfloat16`, then `layerwave extract --corpus regen:DIR --layers 2,15,27`.
Row 0 is the `quick` recipe before this ablation (draft vocabulary counted on input tokens, raw
layers, batch 1, TTT 3); each later row adds one change to the best recipe so far, and keeps it
unless held-out step-0 accuracy falls by more than 0.005 (a change that hurts is not carried
into the next rows). Every head trains from seed 0 for the same whole number of epochs (so the same
token-passes) with bfloat16 autocast.

Columns: held-out accuracy over every reply position per TTT step, the draft vocabulary's coverage
(share of held-out reply positions whose target argmax it holds), the shuffled-layer diagnostic
(step-0 accuracy lost when one layer's states are shuffled), τ_offline of chain drafting (depth 4)
along the held-out replies with its 95% interval, training token-passes/s. Beside them, the
feature-free baseline: the target's most frequent argmax after the input token, counted on the
training documents. Each row is saved as it finishes and skipped on a re-run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from store import schema  # noqa: E402
from tasks.data import load_model  # noqa: E402
from tasks.heads.train_data import StoreBatches  # noqa: E402
from tasks.heads.train_head import preset, train  # noqa: E402
from tasks.select.layer_ids import eagle3_default  # noqa: E402

TOLERANCE = 0.005  # a change is kept unless step-0 accuracy falls by more than this (seed noise)
HOLDOUT = 0.15  # of the documents: enough held-out replies (100+) for a τ_offline interval that ranks rows
BEFORE = replace(preset("quick"), precision="bfloat16", draft_vocab_from="input", ttt_steps=3, batch_size=1,
                 lr=1e-3, layer_scaling=False, loss_on_prompt=False, ttt_warmup=0.0, attend_self=0.0)
CHANGES = [  # (row name, what it adds to the row before)
    ("quick before the ablation", {}),
    ("+ draft vocabulary of target argmaxes", {"draft_vocab_from": "argmax"}),
    ("+ each layer scaled by 1/RMS", {"layer_scaling": True}),
    ("+ batch 4 windows, lr 2e-3", {"batch_size": 4, "lr": 2e-3}),
    ("+ loss on prompt positions", {"loss_on_prompt": True}),
    ("+ TTT 4 (= chain depth)", {"ttt_steps": 4}),
]


def bigram_accuracy(data: StoreBatches) -> float:
    """Held-out accuracy over reply positions of "the target's most frequent argmax after this
    input token" (counted on the training documents): what a head gets without the target's states."""
    group = data.group
    token, argmax = group[schema.TOKEN_ID][:].astype(np.int64), group[schema.TOPK_IDS][:, 0].astype(np.int64)
    inside = data.doc >= 0
    held = inside & data.heldout_docs[np.maximum(data.doc, 0)]
    # positions t whose next token is a reply token of the same document: step 0 predicts argmax[t + 1] from token[t + 1]
    same = np.r_[data.doc[1:] == data.doc[:-1], False] & np.r_[data.loss_mask[1:], False]
    width = int(max(token.max(), argmax.max())) + 1
    pairs = np.unique(token[1:][(inside & ~held)[1:]] * width + argmax[1:][(inside & ~held)[1:]], return_counts=True)
    best: dict[int, tuple[int, int]] = {}
    for pair, count in zip(*pairs):
        x, y = divmod(int(pair), width)
        if count > best.get(x, (-1, 0))[1]:
            best[x] = (y, int(count))
    scored = np.flatnonzero(same & held)
    guesses = np.array([best.get(int(x), (-1, 0))[0] for x in token[scored + 1]])
    return float(np.mean(guesses == argmax[scored + 1])) if len(scored) else float("nan")


def train_row(store: str, key: str, layers: list[int], work: Path, config) -> dict:
    _, record = train(store, key, layers, work, config, log=lambda line: None)
    final = record["final"]
    return {"config": asdict(config), "steps": record["steps"], "token_passes": record["token_passes"],
            "token_passes_per_s": record["tokens_per_s"], "accuracy": final["accuracy"],
            "accuracy_in_vocab": final["accuracy_in_vocab"], "coverage": final["coverage"][0],
            "layer_use": final["layer_use"], "tau_offline": final["tau_offline"]}


def print_row(name: str, row: dict) -> None:
    tau = row["tau_offline"]
    print(f"{name}: accuracy " + " / ".join(f"{a:.3f}" for a in row["accuracy"])
          + f", coverage {row['coverage']:.3f}, τ_offline {tau['tau']:.3f} [{tau['tau_ci95'][0]:.3f}, "
          f"{tau['tau_ci95'][1]:.3f}], layer drop " + ", ".join(f"{k}: {v:.3f}" for k, v in row["layer_use"]["drop"].items())
          + f", {row['token_passes_per_s']:.0f} token-passes/s", flush=True)


def open_rows(args) -> tuple:
    """What every row of a recipe benchmark shares: the model's store key and EAGLE-3 default layers,
    the output file, where heads go, and the result so far (rows already measured are kept) with the
    store's sizes (windows of a batch-1 epoch, its token-passes) and the feature-free baseline on
    the rows' held-out split."""
    key = load_model.load(args.model, "cpu", "auto").provenance["key"]
    layers = eagle3_default(load_model.num_hidden_layers(args.model))
    out = Path(args.out)
    work = Path(args.work or out.with_suffix(".heads"))
    result = json.loads(out.read_text()) if out.exists() else {"rows": {}}
    data = StoreBatches(args.store, key, layers, seq_len=BEFORE.seq_len, batch_size=1, seed=0, holdout=HOLDOUT)
    plan = data.plan(0)
    result.update(model=args.model, layers=layers, store_tokens=int(len(data.doc)), windows_per_epoch=len(plan),
                  token_passes_per_epoch=sum(b - a for _, windows in plan for a, b in windows),
                  bigram_accuracy=bigram_accuracy(data))
    return key, layers, out, work, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--passes", type=int, default=400_000, help="token-passes per row (whole epochs)")
    parser.add_argument("--rows", type=int, nargs="*", default=list(range(len(CHANGES))))
    parser.add_argument("--work", default=None, help="where the heads go (default: beside --out)")
    parser.add_argument("--out", default="benchmarks/out/recipe.json")
    args = parser.parse_args()
    key, layers, out, work, result = open_rows(args)
    per_epoch = result["token_passes_per_epoch"]
    epochs = max(1, round(args.passes / per_epoch))
    result["epochs"] = epochs
    print(f"{args.model} {layers}: {per_epoch} token-passes per epoch, {epochs} epochs per row; feature-free "
          f"baseline {result['bigram_accuracy']:.3f}", flush=True)
    kept, best = replace(BEFORE, epochs=epochs, eval_every=10**9, chain_depth=4, holdout=HOLDOUT), -1.0
    for index, (name, change) in enumerate(CHANGES):
        config = replace(kept, **change)
        if name not in result["rows"]:
            if index not in args.rows:
                continue
            result["rows"][name] = train_row(args.store, key, layers, work / f"row-{index}", config)
            print_row(name, result["rows"][name])
        row = result["rows"][name]
        row["kept"] = row["accuracy"][0] >= best - TOLERANCE
        if row["kept"]:
            kept, best = config, max(best, row["accuracy"][0])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
