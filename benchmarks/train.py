"""Draft-training speed from the store, beside what online training would add, in the same run.

    python benchmarks/train.py [--tokens 6144] [--steps 6] [--out benchmarks/out/train.json]

Trains an EAGLE-3 head (k = 3, the EAGLE-3 default layers) on SmolLM2-135M activations with the
`quick` preset at TTT 3 and TTT 7 and reports training tokens/s. The baseline is the target
forward with output_hidden_states over the same windows: the cost per token an online trainer
(which recomputes the target's states every epoch) pays on top, which the store removes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.extract import extract  # noqa: E402
from tasks.data import load_model  # noqa: E402
from tasks.heads.train_data import StoreBatches  # noqa: E402
from tasks.heads.train_head import preset, train  # noqa: E402
from tasks.select.layer_ids import eagle3_default  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=6144)
    parser.add_argument("--steps", type=int, default=6, help="training steps timed per TTT setting")
    parser.add_argument("--store", help="reuse an extracted store instead of extracting into a temp dir")
    parser.add_argument("--out", default="benchmarks/out/train.json")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="layerwave-train-bench-"))
    store = args.store or str(workdir / "bench.zarr")
    key = extract(model=args.model, corpus="sharegpt", tokens=args.tokens, store=store)["model_key"]
    n_layers = load_model.load(args.model, "cpu", "auto").num_layers
    layers = eagle3_default(n_layers)
    rows = []
    for ttt in (3, 7):
        config = replace(preset("quick"), ttt_steps=ttt, eval_every=10**9)
        _, record = train(store, key, layers, workdir / f"ttt{ttt}", config, log=lambda _: None, stop_after=args.steps)
        rows.append({"ttt_steps": ttt, "steps": record["steps"], "tokens_per_s": record["tokens_per_s"],
                     "trainable_parameters": record["trainable_parameters"]})
        print(f"TTT {ttt}: {record['tokens_per_s']:.0f} training tokens/s over {record['steps']} steps")
    quick = preset("quick")
    data = StoreBatches(store, key, layers, seq_len=quick.seq_len, batch_size=quick.batch_size, seed=0)
    online = target_forward_tokens_per_s(args.model, data, args.steps)
    print(f"target forward (what online training adds per token): {online:.0f} tokens/s")
    result = {"model": args.model, "layers": layers, "tokens_in_store": args.tokens, "preset": "quick",
              "seq_len": quick.seq_len, "batch_size": quick.batch_size, "draft_vocab_size": quick.draft_vocab_size,
              "torch_threads": torch.get_num_threads(), "training": rows, "target_forward_tokens_per_s": online,
              "online_slowdown_ttt3": rows[0]["tokens_per_s"] / (1 / (1 / rows[0]["tokens_per_s"] + 1 / online))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"an online trainer at TTT 3 would run {result['online_slowdown_ttt3']:.2f}x slower; wrote {args.out}")


if __name__ == "__main__":
    main()
