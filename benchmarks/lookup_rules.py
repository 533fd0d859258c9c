"""Which copy rule drafts the context best: copy rules replayed along the target's greedy replies.

    python benchmarks/lookup_rules.py [--model smollm2-135m] [--prompts 80] [--max-new-tokens 128]
                                      [--priced-as benchmarks/out/evaluate.json] [--decode N]
                                      [--out benchmarks/out/lookup_rules.json]

Greedy speculative decoding emits the target's greedy reply whatever drafts it, and a round
accepts a copied draft exactly as far as it equals the reply's next tokens. So what a copy rule
buys is a function of the prompt and the reply alone: the replies are generated once
(continuously batched, in the precision decoding uses; kept under benchmarks/work/), and every
rule is replayed along them without the target. The baseline is Hugging Face's prompt lookup (the
last 2-gram, else 1-gram, at its earliest occurrence; 10 tokens), replayed the same way. Each
rule matches the longest suffix of up to 4 tokens down to its shortest (2-gram or 1-gram) at its
most recent occurrence, and copies a fixed length, or twice what the last copy got accepted
between two bounds (tasks/decode/context_lookup.py).

A wider verify costs more, so each round is also priced: the target's forward over 1 + drafted
tokens after 256 cached tokens, measured here, in plain steps (a forward over 1). The estimate
of the speed-up is reply tokens / Σ round prices: it leaves out what every rule pays alike (the
lm_head rows, Python), so it ranks rules rather than predicting a decoder's speed. Prints τ
(reply tokens per round, pooled over prompts, with a bootstrap 95% interval), drafted tokens per
round and the estimate per rule and bench; writes JSON. `--decode N` then decodes each bench's
first N prompts for real, the target alone beside Hugging Face prompt lookup and `lookup 8`
(the rule before), `lookup` and `lookup 32`, as `evaluate --compare` does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from evaluate import verify_seconds
from tasks.data import load_model
from tasks.data.continuous_batching import generate_continuous
from tasks.data.prompts import first_turns, fitting_prompts
from tasks.decode.context_lookup import ContextLookup, common_prefix
from tasks.decode.decoders import baseline, decoder
from tasks.decode.side_by_side import side_by_side, summarize
from tasks.heads.offline_tau import summarize_rounds
from tasks.precision import resolve_precision

WIDTHS = (1, 2, 3, 5, 9, 17, 33)  # verified tokens whose forward is timed; others interpolated


class HuggingFaceRule:
    """`prompt_lookup_num_tokens`: the earliest earlier occurrence of the last 2-gram (else
    1-gram) and up to 10 tokens after it, never past the context's end."""

    def __init__(self, max_tokens: int = 10, max_ngram: int = 2):
        self.tokens: list[int] = []
        self.max_tokens, self.max_ngram = max_tokens, max_ngram

    def extend(self, tokens: list[int]) -> None:
        self.tokens += tokens

    def propose(self) -> list[int]:
        context = self.tokens
        for n in range(self.max_ngram, 0, -1):
            suffix = context[-n:]
            for start in range(len(context) - n):
                if context[start:start + n] == suffix:
                    return context[start + n:start + n + self.max_tokens]
        return []


def rule(min_ngram: int, first: int, most: int):
    """A fresh ContextLookup whose copies are `first` to `most` tokens long (fixed when equal)."""
    return lambda: ContextLookup([], min_ngram, 4, most, first)


RULES = {  # name: a fresh rule (propose(), extend(tokens)) per reply
    "Hugging Face prompt lookup": HuggingFaceRule,
    "2-gram, 8 tokens (before)": rule(2, 8, 8),
    "1-gram, 8 tokens": rule(1, 8, 8),
    "2-gram, 4 tokens": rule(2, 4, 4),
    "1-gram, 4 tokens": rule(1, 4, 4),
    "2-gram, 16 tokens": rule(2, 16, 16),
    "2-gram, 32 tokens": rule(2, 32, 32),
    "1-gram, 16 tokens": rule(1, 16, 16),
    "1-gram, 32 tokens": rule(1, 32, 32),
    "2-gram, 4 to 32": rule(2, 4, 32),
    "1-gram, 4 to 32": rule(1, 4, 32),
    "2-gram, 8 to 32": rule(2, 8, 32),
    "1-gram, 8 to 32": rule(1, 8, 32),
    "1-gram, 2 to 32": rule(1, 2, 32),
}


def replayed_rounds(prompt: list[int], reply: list[int], rule) -> list[tuple[int, int]]:
    """(drafted, accepted) of each round along `reply`: the prefill gives the first token, then
    each round commits the accepted drafts and the target's own next token."""
    rule.extend(prompt + reply[:1])
    position, rounds = 1, []
    while position < len(reply):
        drafts = rule.propose()[:len(reply) - position - 1]
        accepted = common_prefix(drafts, reply[position:])
        rule.extend(reply[position:position + accepted + 1])
        position += accepted + 1
        rounds.append((len(drafts), accepted))
    return rounds


def price(seconds: dict[int, float]):
    """Plain steps a round that verifies `width` tokens costs: interpolated between timed widths,
    and beyond the widest at the slope of a line fitted through all of them."""
    widths = np.array(sorted(seconds), dtype=float)
    steps = np.array([seconds[w] / seconds[1] for w in sorted(seconds)])
    slope = np.polyfit(widths, steps, 1)[0]
    return lambda width: float(np.interp(width, widths, steps) + max(0.0, width - widths[-1]) * slope)


def summary(per_reply: list[list[tuple[int, int]]], costs: dict) -> dict:
    """Pooled τ with its bootstrap interval over replies (as offline τ reports it), drafted tokens
    per round, and the speed-up estimate under each of `costs` (reply tokens after the first /
    Σ round prices)."""
    pooled = summarize_rounds([[a + 1 for _, a in rounds] for rounds in per_reply], 0, resamples=2000)
    rounds = [r for reply in per_reply for r in reply]
    return {"tau": pooled["tau"], "tau_ci95": pooled["tau_ci95"],
            "drafted_per_round": sum(d for d, _ in rounds) / len(rounds),
            "estimated_speedup": {name: pooled["tokens"] / sum(cost(d + 1) for d, _ in rounds)
                                  for name, cost in costs.items()}}


def greedy_replies(loaded, bench: str, count: int, max_new_tokens: int, cache: Path) -> tuple[list, list]:
    """The prompts and the target's greedy replies, generated once and kept in `cache`."""
    if cache.is_file():
        kept = json.loads(cache.read_text())
        return kept["prompts"], kept["replies"]
    prompts = fitting_prompts(loaded.tokenizer, first_turns(bench, None), loaded.model.config.max_position_embeddings,
                              max_new_tokens, count)
    replies = generate_continuous(loaded.model, prompts, max_new_tokens, loaded.tokenizer.eos_token_id, 0.0, 32)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"prompts": prompts, "replies": replies}))
    return prompts, replies


DECODED = ("prompt-lookup", "lookup 8", "lookup", "lookup 32")  # lookup 8: the rule before (float32 on a CPU)


def decoded(loaded, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """Real decoding of `prompts`, side by side with the target alone: Hugging Face prompt lookup
    and layerwave's copy at fixed 8 and 32 tokens and at lengths that follow acceptance."""
    target, eos = loaded.model, loaded.tokenizer.eos_token_id
    options = {"max_new_tokens": max_new_tokens, "depth": 4, "eos": eos, "temperature": 0.0,
               "generator": torch.Generator().manual_seed(0), "tree": None}
    rows = side_by_side(baseline(target, max_new_tokens, eos, 0.0),
                        [decoder(name, target, None, **options) for name in DECODED], prompts, progress=print)
    return {name: {k: v for k, v in summarize(decoded_rows, None).items() if k != "rows"}
            for name, decoded_rows in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=80)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--priced-as", help="also price rounds with the verify_seconds an evaluate.py JSON recorded "
                                            "(each precision there), e.g. bfloat16 on a CPU that has it")
    parser.add_argument("--decode", type=int, default=0, help="also decode this many of each bench's prompts for "
                                                               "real: the target alone beside each copy rule")
    parser.add_argument("--out", default="benchmarks/out/lookup_rules.json")
    args = parser.parse_args()
    dtype = resolve_precision("auto", load_model.pick_device("cpu"))  # bfloat16 where native, as decoding runs
    loaded = load_model.load(args.model, "cpu", dtype)
    seconds = {f"{dtype} here": verify_seconds(loaded.model, list(WIDTHS))}
    if args.priced_as:
        recorded = json.loads(Path(args.priced_as).read_text())["verify_seconds"]
        seconds |= {f"{precision} recorded": {int(w): s for w, s in timed.items()}
                    for precision, timed in recorded.items()}
    costs = {name: price(timed) for name, timed in seconds.items()}
    for name, cost in costs.items():
        print(f"{name}: target forward after 256 cached tokens, in plain steps: "
              + ", ".join(f"{w}: {cost(w):.2f}" for w in WIDTHS), flush=True)
    result = {"model": args.model, "dtype": dtype, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
              "verify_seconds": {name: {str(w): s for w, s in timed.items()} for name, timed in seconds.items()},
              "priced_as": args.priced_as, "benches": {}}
    for bench in ("mt-bench", "sharegpt"):
        cache = Path(f"benchmarks/work/lookup_rules-{args.model}-{dtype}-{bench}-{args.prompts}x{args.max_new_tokens}.json")
        prompts, replies = greedy_replies(loaded, bench, args.prompts, args.max_new_tokens, cache)
        rows = {}
        for name, rule in RULES.items():
            rows[name] = summary([replayed_rounds(p, r, rule()) for p, r in zip(prompts, replies)], costs)
            row = rows[name]
            print(f"{bench:9s} {name:30s} τ {row['tau']:.3f} ({row['tau_ci95'][0]:.3f}–{row['tau_ci95'][1]:.3f}), "
                  f"{row['drafted_per_round']:.1f} drafted a round, estimate "
                  + ", ".join(f"{x:.2f}x ({name})" for name, x in row["estimated_speedup"].items()), flush=True)
        result["benches"][bench] = {"prompts": len(prompts), "reply_tokens": sum(map(len, replies)), "rules": rows}
        if args.decode:
            result["benches"][bench]["decoded"] = real = decoded(loaded, prompts[:args.decode], args.max_new_tokens)
            for name, row in real.items():
                print(f"{bench:9s} decoded: {name:14s} τ {row['tau']:.2f}, {row['speedup']:.2f}x "
                      f"({row['speedup_ci95'][0]:.2f}–{row['speedup_ci95'][1]:.2f}), lossless {row['lossless']}",
                      flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
