"""Speculative decoding on SmolLM2-135M side by side: the target alone, Hugging Face prompt
lookup, the context's copy alone (lookup), and a store-trained head as chain, EAGLE-2 tree,
hybrid (head + copy) and auto, on the same prompts in the same run; then where a round's time
goes.

    python benchmarks/evaluate.py [--tokens 20000] [--limit 5] [--max-new-tokens 64] [--depth 4]
                                  [--tree 4x16] [--store S --head DIR] [--device cpu]
                                  [--precision auto] [--benches mt-bench,sharegpt]
                                  [--out benchmarks/out/evaluate.json]

Extracts ShareGPT activations and trains a `quick` head on the EAGLE-3 default layers (or reuses
`--head`, trained on `--store`), then runs `layerwave evaluate --compare` on MT-Bench first turns
and held-out ShareGPT prompts: τ, tokens/s and the median per-prompt speed-up over the target
alone with its 95% interval, every output checked token for token against the target's.

The profile times each part of chain (depth `--depth`), tree and hybrid rounds on the first
bench's first 5 prompts, in milliseconds and in plain decoding steps, and the target's forward
time per number of tokens verified, in float32 and in bfloat16 (where native): a round pays off
only when τ exceeds its cost in plain steps. Writes benchmarks/out/evaluate.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.cli import comparison_table  # noqa: E402
from flows.evaluate import evaluate  # noqa: E402
from flows.extract import extract  # noqa: E402
from flows.train import train_head  # noqa: E402
from tasks.data.registry import resolve  # noqa: E402
from tasks.data import load_model  # noqa: E402
from tasks.decode.context_lookup import LOOKUP_TOKENS  # noqa: E402
from tasks.decode.decoders import PROMPT_LOOKUP_TOKENS, drafted  # noqa: E402
from tasks.decode.evaluate import bench_prompts, load_pair  # noqa: E402
from tasks.decode.round_profile import profile_rounds, profile_table  # noqa: E402
from tasks.decode.tree_shape import TreeShape  # noqa: E402
from tasks.precision import bf16_native  # noqa: E402

PROFILED_PROMPTS = 5  # the round profile runs on the first bench's first prompts


@torch.no_grad()
def verify_seconds(target, sizes: list[int], prefix: int = 256, repeats: int = 15) -> dict[int, float]:
    """Median seconds of one target forward over `size` new tokens after a cached `prefix`."""
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
    parser.add_argument("--tree", default=f"{TreeShape.topk}x{TreeShape.tokens}", help="tree shape: top-k x tokens")
    parser.add_argument("--head", help="reuse this trained head (with the --store it was trained on)")
    parser.add_argument("--benches", default="mt-bench,sharegpt", help="comma-separated")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    parser.add_argument("--precision", default="auto", help="the target's: auto (bfloat16 where native), float32 "
                        "or bfloat16")
    parser.add_argument("--out", default="benchmarks/out/evaluate.json")
    args = parser.parse_args()
    if args.head and not args.store:
        parser.error("--head needs the --store it was trained on (its ShareGPT records are held out)")
    workdir = Path(tempfile.mkdtemp(prefix="layerwave-eval-bench-"))
    store = args.store or str(workdir / "bench.zarr")
    if args.head:
        head, record = args.head, json.loads((Path(args.head) / "training.json").read_text())
        trained = {"out": head, **{k: record[k] for k in ("layers", "steps", "trainable_parameters", "final") if k in record}}
    else:
        head = str(workdir / "head")
        extract(model=args.model, corpus="sharegpt", tokens=args.tokens, store=store, device=args.device)
        trained = dataclasses.asdict(train_head(model=args.model, store=store, out=head, preset_name="quick",
                                                device=args.device))
    topk, tokens = (int(n) for n in args.tree.split("x"))
    results = {"model": args.model, "tokens_in_store": None if args.head else args.tokens, "head": trained,
               "benches": {}}
    for bench in args.benches.split(","):
        result = evaluate(model=args.model, head=head, bench=bench, limit=args.limit,
                          max_new_tokens=args.max_new_tokens, depth=args.depth, store=store, tree_topk=topk,
                          tree_tokens=tokens, device=args.device, precision=args.precision, compare=True)
        results["benches"][bench] = result  # per-prompt rows included, for the contention guard and re-analysis
        print(comparison_table(result))
        write(results, args.out)  # each bench as it finishes
    target, drafter = load_pair(args.model, head, args.device, args.precision)
    prompts = bench_prompts(args.benches.split(",")[0], target, min(args.limit, PROFILED_PROMPTS),
                            args.max_new_tokens, store, resolve(args.model).key, head)
    eos = target.tokenizer.eos_token_id
    results["profile"], step = [], None
    for name in ("chain", "tree", "hybrid"):
        decode = drafted(name, target.model, drafter, max_new_tokens=args.max_new_tokens, depth=args.depth, eos=eos,
                         temperature=0.0, generator=None, tree=TreeShape(topk, tokens))
        results["profile"].append(profile_rounds(target.model, name, decode, prompts, args.max_new_tokens, eos, step))
        step = results["profile"][0]["plain_step_ms"] / 1000
        print(profile_table(results["profile"][-1]))
    sizes = sorted({1, args.depth + 1, tokens + 1, PROMPT_LOOKUP_TOKENS + 1, args.depth + LOOKUP_TOKENS + 1})
    results["verify_seconds"] = {}
    for precision in ("float32", "bfloat16") if bf16_native(target.device) else ("float32",):
        seconds = verify_seconds(load_model.load(args.model, args.device, precision).model, sizes)
        results["verify_seconds"][precision] = {str(n): s for n, s in seconds.items()}
        print(f"{precision} target forward after 256 cached tokens: " + ", ".join(
            f"{n} token{'s' * (n > 1)} {1000 * s:.0f} ms ({s / seconds[1]:.2f}x)" for n, s in seconds.items()))
    write(results, args.out)
    print(f"wrote {args.out}")


def write(results: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
