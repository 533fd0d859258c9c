"""Draft-training throughput and what it buys, recipe against recipe, in the same run.

    python benchmarks/train.py [--model smollm2-135m] [--tokens 30000] [--passes 90000]
                               [--store S] [--out benchmarks/out/train.json]

Extracts a training store of the EAGLE-3 default layers (`extract --layers`) from ShareGPT, then
trains one head per recipe for the same number of epochs (so the same token-passes) from the same
seed, and reports training token-passes/s and held-out accuracy per TTT step at the end. The
baseline row is today's `quick` recipe (float32, batch 1, lr 1e-3); the others change the
precision (bfloat16 autocast over float32 master weights), the batch (learning rate scaled with
its square root) and the draft vocabulary. Also timed: the target forward with
output_hidden_states over the same windows, the cost per token an online trainer pays on top.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.extract import extract  # noqa: E402
from tasks.data import load_model  # noqa: E402
from tasks.heads.train_data import StoreBatches  # noqa: E402
from tasks.heads.train_head import held_out_metrics, preset, train  # noqa: E402
from tasks.select.layer_ids import eagle3_default  # noqa: E402

QUICK = preset("quick")
RECIPES = {  # name: overrides of the quick preset
    "float32, batch 1 (quick today)": {},
    "bfloat16, batch 1": {"precision": "bfloat16"},
    "bfloat16, batch 4, lr x2": {"precision": "bfloat16", "batch_size": 4, "lr": 2 * QUICK.lr},
    "bfloat16, batch 8, lr x2.8": {"precision": "bfloat16", "batch_size": 8, "lr": math.sqrt(8) * QUICK.lr},
    "bfloat16, batch 4, lr x2, vocab 4096": {"precision": "bfloat16", "batch_size": 4, "lr": 2 * QUICK.lr,
                                             "draft_vocab_size": 4096},
}


def target_forward_tokens_per_s(model_name: str, data: StoreBatches, batches: int) -> float:
    loaded = load_model.load(model_name, "cpu", "auto")
    tokens, elapsed = 0, 0.0
    for i, batch in enumerate(data.batches(data.plan(0))):
        if i == batches:
            break
        began = time.perf_counter()
        with torch.inference_mode():
            loaded.model(input_ids=batch.input_ids, attention_mask=batch.valid.long(), output_hidden_states=True)
        elapsed += time.perf_counter() - began
        tokens += batch.tokens
    return tokens / elapsed


def epoch_tokens(store: str, key: str, layers: list[int]) -> int:
    """Token-passes of one epoch: every training window's tokens, whatever the batch."""
    data = StoreBatches(store, key, layers, seq_len=QUICK.seq_len, batch_size=1, seed=QUICK.seed)
    return sum(b - a for _, windows in data.plan(0) for a, b in windows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=30000, help="tokens in the training store")
    parser.add_argument("--passes", type=int, default=90000, help="token-passes per recipe (whole epochs)")
    parser.add_argument("--store", help="reuse a store (all layers or a training store) instead of extracting one")
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), help="which recipes to run")
    parser.add_argument("--out", default="benchmarks/out/train.json")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="layerwave-train-bench-"))
    layers = eagle3_default(load_model.num_hidden_layers(args.model))
    store = args.store or str(workdir / "train.zarr")
    key = extract(model=args.model, corpus="sharegpt", tokens=args.tokens, store=store, layers=layers)["model_key"]
    per_epoch = epoch_tokens(store, key, layers)
    epochs = max(1, round(args.passes / per_epoch))
    print(f"{args.model} {layers}: {per_epoch} token-passes per epoch, {epochs} epochs per recipe")
    rows = []
    for name in args.recipes:
        config = replace(QUICK, epochs=epochs, eval_every=10**9, **RECIPES[name])
        head, record = train(store, key, layers, workdir / f"head-{len(rows)}", config, log=lambda _: None)
        data = StoreBatches(store, key, layers, seq_len=config.seq_len, batch_size=config.batch_size, seed=config.seed)
        eos = load_model.load(args.model, "cpu", "auto").tokenizer.eos_token_id
        accuracy = held_out_metrics(head, data, config, eos)["accuracy"]
        rows.append({"recipe": name, "config": asdict(config), "steps": record["steps"],
                     "token_passes": record["token_passes"], "token_passes_per_s": record["tokens_per_s"],
                     "held_out_accuracy": accuracy, "trainable_parameters": record["trainable_parameters"]})
        print(f"{name}: {record['tokens_per_s']:.0f} token-passes/s "
              f"({record['tokens_per_s'] / rows[0]['token_passes_per_s']:.2f}x), {record['steps']} steps, "
              "held-out accuracy " + " / ".join(f"{a:.3f}" for a in accuracy), flush=True)
    data = StoreBatches(store, key, layers, seq_len=QUICK.seq_len, batch_size=QUICK.batch_size, seed=0)
    online = target_forward_tokens_per_s(args.model, data, 6)
    print(f"target forward (what online training adds per token): {online:.0f} tokens/s")
    result = {"model": args.model, "layers": layers, "tokens_in_store": args.tokens, "epochs": epochs,
              "token_passes_per_epoch": per_epoch, "torch_threads": torch.get_num_threads(),
              "recipes": rows, "target_forward_tokens_per_s": online,
              "speedup_vs_today": {row["recipe"]: row["token_passes_per_s"] / rows[0]["token_passes_per_s"]
                                   for row in rows}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
