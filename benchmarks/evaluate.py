"""Acceptance length and wall-clock speed-up of a store-trained head on SmolLM2-135M, chain and
EAGLE-2 tree drafting, against plain Hugging Face greedy generation on the same prompts in the
same run.

    python benchmarks/evaluate.py [--tokens 20000] [--limit 5] [--max-new-tokens 64] [--depth 4]
                                  [--trees 8x32] [--store S --head DIR]
                                  [--benches mt-bench,sharegpt] [--out benchmarks/out/evaluate.json]

Extracts ShareGPT activations, trains a `quick` head on the EAGLE-3 default layers (or reuses
`--head`, trained on `--store`), and runs greedy speculative decoding, chain then one tree per
`--trees` shape (top-k x tokens), on MT-Bench first turns (and held-out ShareGPT prompts),
checking every output is token-for-token the plain output.

Speed-up is τ times (plain time per token / time per round), so each line also prints the τ a
head would need for 1.5x at the round cost measured here, and the run ends with the target's
forward time per number of tokens verified: on a memory-bound CPU, verifying k tokens costs far
less than k single-token steps, but not nothing. Writes benchmarks/out/evaluate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.evaluate import evaluate  # noqa: E402
from flows.extract import extract  # noqa: E402
from flows.train import train_head  # noqa: E402
from tasks import load_model  # noqa: E402

GOAL = 1.5  # the speed-up issue 6 asks for


def tree_shapes(text: str) -> list[tuple[int, int]]:
    """"8x32,4x12" → [(8, 32), (4, 12)]: top-k children per node x tokens verified per round."""
    return [tuple(int(n) for n in shape.split("x")) for shape in text.split(",") if shape]


@torch.no_grad()
def verify_seconds(model: str, sizes: list[int], prefix: int = 256, repeats: int = 15) -> dict[int, float]:
    """Median seconds of one target forward over `size` new tokens after a cached `prefix`, on the
    device the evaluations ran on (the same cached model)."""
    target = load_model.load(model, "auto", "auto").model
    cache = target(input_ids=torch.randint(0, 1000, (1, prefix), device=target.device), use_cache=True).cache
    seconds = {}
    for size in sizes:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            target(input_ids=torch.randint(0, 1000, (1, size), device=target.device), cache=cache, use_cache=True,
                   output_hidden_states=True)
            if target.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
            cache.crop(-size)
        seconds[size] = sorted(times)[repeats // 2]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--store", help="reuse a store (default: a temp dir)")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4, help="chain length and tree depth")
    parser.add_argument("--trees", default="8x32", help="tree shapes, top-k x tokens, comma-separated")
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
    results = {"model": args.model, "tokens_in_store": None if args.head else args.tokens, "head": trained, "benches": {}}
    shapes = tree_shapes(args.trees)
    drafts = [("chain", "chain", 1, args.depth)] + [(f"tree {k}x{n}", "tree", k, n) for k, n in shapes]
    for bench in args.benches.split(","):
        for name, draft, topk, tokens in drafts:
            result = evaluate(model=args.model, head=head, bench=bench, limit=args.limit,
                              max_new_tokens=args.max_new_tokens, depth=args.depth, store=store, draft=draft,
                              tree_topk=topk, tree_tokens=tokens)
            needed = GOAL * result["tau"] / result["speedup"]
            results["benches"].setdefault(bench, {})[name] = {**{k: v for k, v in result.items() if k != "rows"},
                                                              "tau_needed_for_goal": needed}
            print(f"{bench} {name}: τ {result['tau']:.2f}, speed-up {result['speedup']:.2f}x "
                  f"({result['tokens_per_s']:.1f} vs {result['baseline_tokens_per_s']:.1f} tokens/s), "
                  f"lossless {result['lossless']}, per position " + " ".join(f"{p:.2f}" for p in result["per_position"])
                  + f"; {GOAL}x needs τ {needed:.2f} at this round cost")
    sizes = sorted({1, args.depth + 1, *(n + 1 for _, n in shapes)})
    seconds = verify_seconds(args.model, sizes)
    results["verify_seconds"] = {str(n): s for n, s in seconds.items()}
    print("target forward after 256 cached tokens: " + ", ".join(
        f"{n} token{'s' * (n > 1)} {1000 * s:.0f} ms ({s / seconds[1]:.2f}x)" for n, s in seconds.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
