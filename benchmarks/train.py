"""Draft-training throughput and what it buys, recipe against recipe, in the same run.

    python benchmarks/train.py [--model smollm2-135m] [--tokens 60000] [--passes 200000]
                               [--store S] [--out benchmarks/out/train.json]

Extracts a training store of the EAGLE-3 default layers (`extract --layers`) from ShareGPT, then
trains one head per recipe for the same number of epochs (so the same token-passes) from the same
seed, and reports training token-passes/s (held-out evaluation not counted) beside what they buy:
held-out accuracy over all reply positions per TTT step, and τ_offline of a depth-4 chain. The
baseline row is `quick` as it was when training in float32 was all there was (TTT 3, loss on
replies only, batch 1, lr 1e-3, draft vocabulary counted on input tokens); the later rows add
bfloat16 autocast (float32 master weights), then today's `quick` in float32 and at `--precision
auto` (bfloat16 where native), then `quick` with half the draft vocabulary. Also timed: the
target forward with output_hidden_states over the same windows, the cost per token an online
trainer pays on top.
"""

from __future__ import annotations

import argparse
import json
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
from tasks.heads.train_head import preset, train  # noqa: E402
from tasks.precision import resolve_precision  # noqa: E402
from tasks.select.layer_ids import eagle3_default  # noqa: E402

QUICK = preset("quick", precision=resolve_precision("auto", torch.device("cpu")))  # as `layerwave train` runs it here
FLOAT32_QUICK = {"precision": "float32", "ttt_steps": 3, "loss_on_prompt": False, "ttt_warmup": 0.0,
                 "attend_self": 0.0, "draft_vocab_from": "input"}
RECIPES = {  # name: overrides of today's quick preset
    "float32, TTT 3, replies only (quick before bfloat16)": FLOAT32_QUICK,
    "+ bfloat16 autocast": FLOAT32_QUICK | {"precision": "bfloat16"},
    "quick today in float32": {"precision": "float32"},
    f"quick today ({QUICK.precision}: TTT 4, one-step unrolls for the first 75%, loss on prompts too)": {},
    f"quick today ({QUICK.precision}), draft vocabulary 4,096": {"draft_vocab_size": 4096},
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
    parser.add_argument("--tokens", type=int, default=60000, help="tokens in the training store")
    parser.add_argument("--passes", type=int, default=200_000, help="token-passes per recipe (whole epochs)")
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
        _, record = train(store, key, layers, workdir / f"head-{len(rows)}", config, log=lambda _: None)
        final = record["final"]
        rows.append({"recipe": name, "config": asdict(config), "steps": record["steps"],
                     "token_passes": record["token_passes"], "token_passes_per_s": record["tokens_per_s"],
                     "held_out_accuracy": final["accuracy"], "coverage": final["coverage"][0],
                     "tau_offline": final["tau_offline"], "layer_use": final.get("layer_use"),
                     "trainable_parameters": record["trainable_parameters"]})
        print(f"{name}: {record['tokens_per_s']:.0f} token-passes/s "
              f"({record['tokens_per_s'] / rows[0]['token_passes_per_s']:.2f}x), {record['steps']} steps, "
              "held-out accuracy " + " / ".join(f"{a:.3f}" for a in final["accuracy"])
              + f", τ_offline {final['tau_offline']['tau']:.3f}", flush=True)
    data = StoreBatches(store, key, layers, seq_len=QUICK.seq_len, batch_size=QUICK.batch_size, seed=0)
    online = target_forward_tokens_per_s(args.model, data, 6)
    print(f"target forward (what online training adds per token): {online:.0f} tokens/s")
    result = {"model": args.model, "layers": layers, "tokens_in_store": args.tokens, "epochs": epochs,
              "token_passes_per_epoch": per_epoch, "torch_threads": torch.get_num_threads(),
              "recipes": rows, "target_forward_tokens_per_s": online,
              "speedup_vs_float32": {row["recipe"]: row["token_passes_per_s"] / rows[0]["token_passes_per_s"]
                                     for row in rows}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
