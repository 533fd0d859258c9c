"""torch.compile and a static KV cache for the target's decode step and verify forward, same run.

    python benchmarks/compile_step.py [--model smollm2-135m] [--widths 1,5,17] [--dtype bfloat16]
                                      [--out benchmarks/out/compile_step.json]

A speculative round costs the target's forward over the verified tokens plus drafting, and the
baseline it must beat is one plain decoding step, so both sides would gain from a faster forward.
For each width (1 = a plain step; 5 = a depth-4 chain's verify; 17 = a 4x16 tree's), after 256
cached tokens, the median of 15 forwards (the last position's logits, as a step computes them):
Hugging Face's dynamic cache in eager mode (what `generate` and layerwave's decoders run: the
baseline), a preallocated static cache in eager mode, and the static cache under `torch.compile`
(one graph per width, `dynamic=False`). Each compiled width runs in its own process, so an abort
inside a generated kernel is recorded, not fatal. Prints each in milliseconds and in plain steps
(the eager dynamic 1-token forward); writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache, StaticCache

from tasks.data import load_model

PREFIX = 256
REPEATS = 15


def forward_over(forward, cache, width: int):
    """One call of `forward` over `width` new tokens after the cached prefix (a dynamic cache is
    cropped back after it, a static one is overwritten by the next)."""
    ids = torch.randint(100, 40000, (1, width))
    positions = torch.arange(PREFIX, PREFIX + width)

    def run():
        with torch.inference_mode():
            forward(input_ids=ids, cache=cache, cache_position=positions, position_ids=positions[None],
                    use_cache=True, logits_to_keep=1)
        if isinstance(cache, DynamicCache):
            cache.crop(-width)
    return run


def median_ms(run) -> float:
    """Median milliseconds of `run` after two untimed warm-ups."""
    times = []
    for repeat in range(REPEATS + 2):
        began = time.perf_counter()
        run()
        if repeat >= 2:
            times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def filled(model, cache):
    """`cache` holding the same random prefix every configuration decodes after."""
    prefix = torch.randint(100, 40000, (1, PREFIX), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(input_ids=prefix, cache=cache, cache_position=torch.arange(PREFIX), use_cache=True, logits_to_keep=1)
    return cache


def static_cache(model):
    return filled(model, StaticCache(config=model.config, max_cache_len=4 * PREFIX))


def compiled_row(model, width: int) -> dict:
    """The compiled static-cache forward at one width: seconds of its first call (the compile) and
    its median milliseconds after."""
    run = forward_over(torch.compile(model, dynamic=False), static_cache(model), width)
    began = time.perf_counter()
    run()
    return {"compile_seconds": time.perf_counter() - began, "ms": median_ms(run)}


def compiled_in_child(args, width: int) -> dict:
    """`compiled_row` in a child process; an abort becomes the row's `error`."""
    child = subprocess.run([sys.executable, __file__, "--model", args.model, "--dtype", args.dtype,
                            "--compiled-width", str(width)], capture_output=True, text=True)
    if child.returncode != 0:
        lines = [line for line in child.stderr.splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit status {child.returncode}"}
    return json.loads(child.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--widths", default="1,5,17")
    parser.add_argument("--compiled-width", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="benchmarks/out/compile_step.json")
    args = parser.parse_args()
    model = load_model.load(args.model, "cpu", args.dtype).model.eval()
    if args.compiled_width is not None:
        print(json.dumps(compiled_row(model, args.compiled_width)))
        return
    dynamic = filled(model, DynamicCache(config=model.config))
    static = static_cache(model)
    rows = [{"width": width, "eager_dynamic_ms": median_ms(forward_over(model, dynamic, width)),
             "eager_static_ms": median_ms(forward_over(model, static, width))}
            for width in map(int, args.widths.split(","))]
    for row in rows:
        row["compiled_static"] = compiled_in_child(args, row["width"])
    plain_step = next((row["eager_dynamic_ms"] for row in rows if row["width"] == 1), rows[0]["eager_dynamic_ms"])
    for row in rows:
        compiled = row["compiled_static"]
        line = (f"width {row['width']:>2}: eager dynamic {row['eager_dynamic_ms']:.1f} ms "
                f"({row['eager_dynamic_ms'] / plain_step:.2f} steps), eager static {row['eager_static_ms']:.1f} ms "
                f"({row['eager_static_ms'] / plain_step:.2f}), compiled static ")
        line += (f"{compiled['ms']:.1f} ms ({compiled['ms'] / plain_step:.2f}; compiled in "
                 f"{compiled['compile_seconds']:.0f} s)" if "ms" in compiled else f"failed: {compiled['error']}")
        print(line, flush=True)
    result = {"model": args.model, "dtype": args.dtype, "prefix": PREFIX, "repeats": REPEATS,
              "threads": torch.get_num_threads(), "plain_step_ms": plain_step, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
