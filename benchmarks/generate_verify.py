"""What drafting would cost inside batched generation: a verify forward of k+1 tokens per row
against a decode step of one, same rows, same cache, same run.

    python benchmarks/generate_verify.py [--rows 128] [--context 300] [--tokens 1,3,5,9] [--repeats 5]
                                         [--out benchmarks/out/generate_verify.json]

Generation decodes one token per row per step, and at 64-128 rows a step is far from the CPU's
bfloat16 peak (attention over each row's cache, small products). Drafting from the context's own
n-grams (the target's greedy replies repeat: `lookup_rules.py`) would verify k+1 tokens per row in
one forward instead: it pays where the tokens accepted per step exceed what the wider forward costs
in decode steps. `--rows` rows with `--context` cached tokens each (bfloat16, SmolLM2), in a static
cache written in place (as generation's slot cache is) and of one size for every width, so that
each forward attends over as many keys; each forward is timed `--repeats` times, each after the
last. Prints each width's cost in decode steps; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import StaticCache

from tasks.data import load_model


@torch.inference_mode()
def seconds_per_forward(model, rows: int, context: int, capacity: int, width: int, repeats: int) -> float:
    """The fastest of `repeats` forwards of `width` tokens per row, after a prefill of `context`."""
    cache = StaticCache(config=model.config, max_cache_len=capacity)
    prompt = torch.randint(100, 1000, (rows, context), generator=torch.Generator().manual_seed(0))
    model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
    ids = torch.randint(100, 1000, (rows, width), generator=torch.Generator().manual_seed(width))
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        began = time.perf_counter()
        model(input_ids=ids, cache=cache, use_cache=True)
        times.append(time.perf_counter() - began)
    return min(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--tokens", default="1,3,5,9", help="tokens per row per forward, the decode step (1) first")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/out/generate_verify.json")
    args = parser.parse_args()
    model = load_model.load(args.model, "cpu", "bfloat16").model
    widths = [int(width) for width in args.tokens.split(",")]
    capacity = args.context + (args.repeats + 1) * max(widths)
    forwards = []
    for width in widths:
        seconds = seconds_per_forward(model, args.rows, args.context, capacity, width, args.repeats)
        steps = seconds / forwards[0]["seconds"] if forwards else 1.0
        forwards.append({"tokens_per_row": width, "seconds": seconds, "decode_steps": steps})
        print(f"{width} token(s) per row: {seconds * 1e3:.0f} ms, {steps:.2f} decode steps", flush=True)
    result = {"model": args.model, "dtype": "bfloat16", "rows": args.rows, "context": args.context,
              "cache": capacity, "threads": torch.get_num_threads(), "forwards": forwards}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
