"""Which copy rule drafts the context best: τ of lookup rules replayed along the target's greedy replies.

    python benchmarks/lookup_rules.py [--model smollm2-135m] [--prompts 80] [--max-new-tokens 128]
                                      [--out benchmarks/out/lookup_rules.json]

Greedy speculative decoding emits the target's greedy reply whatever drafts it, and a round
accepts a copied draft exactly as far as it equals the reply's next tokens. So the τ of a copy
rule is a function of the prompt and the reply alone: the replies are generated once (continuously
batched, in the precision decoding uses), and every rule is replayed along them, without the target. The baseline is
Hugging Face's prompt lookup (its 2-gram, else 1-gram, at the earliest occurrence, 10 tokens),
replayed the same way. Prints τ per rule and bench with a bootstrap 95% interval over prompts;
writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tasks.data import load_model
from tasks.data.continuous_batching import generate_continuous
from tasks.data.prompts import first_turns, fitting_prompts
from tasks.decode.context_lookup import ContextLookup
from tasks.precision import resolve_precision

RULES = {  # name: ContextLookup(min_ngram, max_ngram, max_tokens)
    "2-4 gram, 8 tokens (today)": (2, 4, 8),
    "1-4 gram, 8 tokens": (1, 4, 8),
    "2-8 gram, 8 tokens": (2, 8, 8),
    "3-8 gram, 8 tokens": (3, 8, 8),
    "2-4 gram, 16 tokens": (2, 4, 16),
    "2-4 gram, 32 tokens": (2, 4, 32),
    "1-8 gram, 16 tokens": (1, 8, 16),
    "2-8 gram, 16 tokens": (2, 8, 16),
}


def hf_prompt_lookup(context: list[int], max_tokens: int = 10, max_ngram: int = 2) -> list[int]:
    """Hugging Face's `prompt_lookup_num_tokens` rule: the earliest earlier occurrence of the last
    2-gram (else 1-gram) and up to `max_tokens` tokens after it, never past the context's end."""
    for n in range(max_ngram, 0, -1):
        suffix = context[-n:]
        for start in range(len(context) - n):
            if context[start:start + n] == suffix:
                return context[start + n:start + n + max_tokens]
    return []


def replayed_tau(prompt: list[int], reply: list[int], propose, extend) -> float:
    """τ of a copy rule along `reply`: the prefill gives the first token, then each round commits
    the accepted drafts and the target's own next token."""
    extend(prompt + reply[:1])
    position, rounds = 1, 0
    while position < len(reply):
        drafts = propose()[:len(reply) - position - 1]
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == reply[position + accepted]:
            accepted += 1
        extend(reply[position:position + accepted + 1])
        position += accepted + 1
        rounds += 1
    return (len(reply) - 1) / rounds if rounds else 1.0


def rule_tau(rule: tuple[int, int, int] | str, prompt: list[int], reply: list[int]) -> float:
    if rule == "hf":
        context: list[int] = []
        return replayed_tau(prompt, reply, lambda: hf_prompt_lookup(context), context.extend)
    lookup = ContextLookup([], *rule)
    return replayed_tau(prompt, reply, lookup.propose, lookup.extend)


def mean_ci95(values: np.ndarray, seed: int = 0, resamples: int = 2000) -> tuple[float, list[float]]:
    means = np.random.default_rng(seed).choice(values, (resamples, len(values))).mean(axis=1)
    return float(values.mean()), [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=80)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="benchmarks/out/lookup_rules.json")
    args = parser.parse_args()
    dtype = resolve_precision("auto", load_model.pick_device("cpu"))  # bfloat16 where native, as decoding runs
    loaded = load_model.load(args.model, "cpu", dtype)
    eos = loaded.tokenizer.eos_token_id
    max_positions = loaded.model.config.max_position_embeddings
    result = {"model": args.model, "dtype": dtype, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
              "benches": {}}
    for bench in ("mt-bench", "sharegpt"):
        prompts = fitting_prompts(loaded.tokenizer, first_turns(bench, None), max_positions, args.max_new_tokens,
                                  args.prompts)
        replies = generate_continuous(loaded.model, prompts, args.max_new_tokens, eos, 0.0, 32)
        rows = {}
        for name, rule in [("Hugging Face prompt lookup (2-gram, earliest, 10 tokens)", "hf"), *RULES.items()]:
            taus = np.array([rule_tau(rule, prompt, reply) for prompt, reply in zip(prompts, replies)])
            tau, interval = mean_ci95(taus)
            rows[name] = {"rule": rule, "tau": tau, "ci95": interval}
            print(f"{bench:9s} {name:58s} τ {tau:.3f} ({interval[0]:.3f}–{interval[1]:.3f})", flush=True)
        result["benches"][bench] = {"prompts": len(prompts), "reply_tokens": sum(map(len, replies)), "rules": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
