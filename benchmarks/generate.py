"""Reply generation speed: continuous batching and padded batches against one prompt at a time,
same run, in float32 and in bfloat16.

    python benchmarks/generate.py [--prompts 64] [--max-new-tokens 128] [--batch-sizes 32]
                                  [--dtypes float32,bfloat16] [--out benchmarks/out/generate.json]

The same ShareGPT first turns are answered greedily by SmolLM2-135M with Hugging Face `generate`
one prompt at a time in float32 (the baseline); then, with the model in each dtype (`layerwave
generate --dtype`), in padded batches sorted by prompt length (`tasks.data.generate.generate_batch`,
left padding, Hugging Face's KV cache: the path for sliding-window models) and continuously batched
as `layerwave generate` runs them (`tasks.data.continuous_batching`: each prompt prefilled alone
into its slot, a slot whose reply ends takes the next prompt). Prints reply tokens/s, the ratio to
the baseline and how many replies equal the baseline's; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tasks.data import load_model
from tasks.data.corpus import load_corpus
from tasks.data.continuous_batching import generate_continuous
from tasks.data.generate import generate_batch, source_order


def prompts_of(tokenizer, count: int, max_prompt_tokens: int) -> list[list[int]]:
    corpus = load_corpus("sharegpt")
    prompts = []
    for record in source_order(len(corpus), 0):
        turn = next(m for m in corpus[record] if m["role"] == "user")
        ids = tokenizer.apply_chat_template([turn], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]
        if len(ids) <= max_prompt_tokens:
            prompts.append(list(ids))
        if len(prompts) == count:
            return prompts
    return prompts


def timed(fn) -> tuple[list[list[int]], float]:
    began = time.perf_counter()
    replies = fn()
    return replies, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--batch-sizes", default="32")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", default="benchmarks/out/generate.json")
    args = parser.parse_args()
    loaded = load_model.load(args.model, "cpu", "float32")
    eos = loaded.tokenizer.eos_token_id
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else eos
    prompts = sorted(prompts_of(loaded.tokenizer, args.prompts, args.max_prompt_tokens), key=len)
    generate_batch(loaded.model, prompts[:2], 4, eos, pad, 0.0)  # warm-up, untimed

    def one_at_a_time():
        return [generate_batch(loaded.model, [p], args.max_new_tokens, eos, pad, 0.0)[0] for p in prompts]

    single, single_s = timed(one_at_a_time)
    single_rate = sum(map(len, single)) / single_s
    print(f"one prompt at a time: {sum(map(len, single))} reply tokens in {single_s:.1f}s, {single_rate:.1f} tokens/s")
    rows = []
    for dtype in args.dtypes.split(","):
        model = load_model.load(args.model, "cpu", dtype).model
        generate_batch(model, prompts[:2], 4, eos, pad, 0.0)  # warm-up, untimed
        for size, batching in ((int(s), b) for s in args.batch_sizes.split(",") for b in ("padded", "continuous")):
            def batched():
                if batching == "continuous":
                    return generate_continuous(model, prompts, args.max_new_tokens, eos, 0.0, size)
                return [r for i in range(0, len(prompts), size)
                        for r in generate_batch(model, prompts[i: i + size], args.max_new_tokens, eos, pad, 0.0)]

            replies, seconds = timed(batched)
            rate = sum(map(len, replies)) / seconds
            same = sum(a == b for a, b in zip(replies, single))
            rows.append({"dtype": dtype, "batch_size": size, "batching": batching, "tokens": sum(map(len, replies)),
                         "seconds": seconds, "tokens_per_s": rate, "ratio": rate / single_rate,
                         "replies_identical_to_baseline": same})
            print(f"{dtype}, {batching} batches of {size}: {rows[-1]['tokens']} reply tokens in {seconds:.1f}s, "
                  f"{rate:.1f} tokens/s, {rate / single_rate:.2f}x; {same}/{len(prompts)} replies identical to "
                  "float32 one at a time")
    result = {"model": args.model, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "threads": torch.get_num_threads(), "baseline": {"tokens": sum(map(len, single)), "seconds": single_s,
                                                               "tokens_per_s": single_rate},
              "batched": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
