"""Shard sizing of continuously batched generation: slots and conversations per shard, same run.

    python benchmarks/generate_shards.py [--prompts 256] [--max-new-tokens 256]
                                         [--sizes 64:32,256:64,256:128] [--out benchmarks/out/generate_shards.json]

`layerwave generate` answers each shard's conversations with one continuously batched call, and a
shard ends by draining its slots: its last replies decode a few rows at a time. The same ShareGPT
first turns (bfloat16, greedy) are generated in shards of S conversations with B slots, for each
`S:B` of `--sizes`; the first is the baseline (the CLI's defaults). Prints reply tokens/s and the
ratio to the baseline; writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from generate import prompts_of, timed
from tasks.data import load_model
from tasks.data.continuous_batching import generate_continuous


def sharded(model, prompts: list[list[int]], shard: int, slots: int, max_new_tokens: int, eos: int):
    """The replies, one continuously batched call per shard (prompts sorted by length within it, as
    `tasks.data.generate` sorts them)."""
    replies = []
    for start in range(0, len(prompts), shard):
        replies += generate_continuous(model, sorted(prompts[start: start + shard], key=len), max_new_tokens, eos,
                                       0.0, slots)
    return replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--sizes", default="64:32,256:64,256:128", help="shard:slots pairs, the baseline first")
    parser.add_argument("--out", default="benchmarks/out/generate_shards.json")
    args = parser.parse_args()
    loaded = load_model.load(args.model, "cpu", "bfloat16")
    eos = loaded.tokenizer.eos_token_id
    prompts = prompts_of(loaded.tokenizer, args.prompts, args.max_prompt_tokens)
    generate_continuous(loaded.model, prompts[:2], 4, eos, 0.0, 2)  # warm-up, untimed
    rows = []
    for shard, slots in (map(int, pair.split(":")) for pair in args.sizes.split(",")):
        replies, seconds = timed(lambda: sharded(loaded.model, prompts, shard, slots, args.max_new_tokens, eos))
        tokens = sum(map(len, replies))
        baseline = rows[0]["tokens_per_s"] if rows else tokens / seconds
        rows.append({"shard_size": shard, "slots": slots, "tokens": tokens, "seconds": seconds,
                     "tokens_per_s": tokens / seconds, "ratio": tokens / seconds / baseline})
        print(f"shards of {shard}, {slots} slots: {tokens} reply tokens in {seconds:.1f}s, "
              f"{rows[-1]['tokens_per_s']:.1f} tokens/s, {rows[-1]['ratio']:.2f}x", flush=True)
    result = {"model": args.model, "dtype": "bfloat16", "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "max_prompt_tokens": args.max_prompt_tokens, "threads": torch.get_num_threads(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
