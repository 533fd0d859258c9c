"""Acceptance length and wall-clock speed-up of a store-trained head on SmolLM2-135M, chain and
EAGLE-2 tree drafting, against plain Hugging Face greedy generation on the same prompts in the
same run.

    python benchmarks/evaluate.py [--tokens 20000] [--limit 5] [--max-new-tokens 64] [--depth 4]
                                  [--tree-topk 8] [--tree-tokens 32] [--store S --head DIR]
                                  [--benches mt-bench,sharegpt] [--out benchmarks/out/evaluate.json]

Extracts ShareGPT activations, trains a `quick` head on the EAGLE-3 default layers (or reuses
`--head`, trained on `--store`), and runs greedy speculative decoding, chain then tree, on
MT-Bench first turns (and held-out ShareGPT prompts), checking every output is token-for-token
the plain output. Writes benchmarks/out/evaluate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.evaluate import evaluate  # noqa: E402
from flows.extract import extract  # noqa: E402
from flows.train import train_head  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--store", help="reuse a store (default: a temp dir)")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4, help="chain length and tree depth")
    parser.add_argument("--tree-topk", type=int, default=8)
    parser.add_argument("--tree-tokens", type=int, default=32)
    parser.add_argument("--head", help="reuse this trained head (with the --store it was trained on)")
    parser.add_argument("--benches", default="mt-bench,sharegpt", help="comma-separated")
    parser.add_argument("--out", default="benchmarks/out/evaluate.json")
    args = parser.parse_args()
    if args.head and not args.store:
        parser.error("--head needs the --store it was trained on (its ShareGPT records are held out)")
    workdir = Path(tempfile.mkdtemp(prefix="layerwave-eval-bench-"))
    store = args.store or str(workdir / "bench.zarr")
    if args.head:
        head, record = args.head, json.loads((Path(args.head) / "training.json").read_text())
        trained = {"out": head, **{k: record[k] for k in ("layers", "steps", "trainable_parameters", "final")}}
    else:
        head = str(workdir / "head")
        extract(model=args.model, corpus="sharegpt", tokens=args.tokens, store=store)
        trained = train_head(model=args.model, store=store, out=head, preset_name="quick")
    results = {"model": args.model, "tokens_in_store": args.tokens, "head": trained, "benches": {}}
    for bench in args.benches.split(","):
        for draft in ("chain", "tree"):
            result = evaluate(model=args.model, head=head, bench=bench, limit=args.limit,
                              max_new_tokens=args.max_new_tokens, depth=args.depth, store=store, draft=draft,
                              tree_topk=args.tree_topk, tree_tokens=args.tree_tokens)
            results["benches"].setdefault(bench, {})[draft] = {k: v for k, v in result.items() if k != "rows"}
            print(f"{bench} {draft}: τ {result['tau']:.2f}, speed-up {result['speedup']:.2f}x "
                  f"({result['tokens_per_s']:.1f} vs {result['baseline_tokens_per_s']:.1f} tokens/s), "
                  f"lossless {result['lossless']}, per position " + " ".join(f"{p:.2f}" for p in result["per_position"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
