"""What whole documents keep, against cutting them where a shard ends, on the same budget.

    python benchmarks/whole_documents.py [--model smollm2-135m] [--tokens 400000] [--shard-tokens 2048]
                                         [--out benchmarks/out/whole_documents.json]

Plans the same seeded ShareGPT budget twice with the model's tokenizer (no forward pass): as
extraction does (`tasks.extract.plan.plan_tokens`: each document whole in one shard, padding
where no document fits) and, as the baseline, with the earlier rule that cut a document where a
shard ended. 2,048-token shards are what an all-layer SmolLM2-135M store gets by default. Reports
documents, documents cut short (and cut inside a reply, or left with no reply token), loss-masked
tokens (what a draft head learns from) and padding.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tasks.data import load_model
from tasks.data.corpus import load_corpus
from tasks.data.render import render
from tasks.extract.plan import PADDING, documents_in, plan_tokens


class Rendered:
    """The corpus, each conversation tokenized once on first use (both planners read the same)."""

    def __init__(self, tokenizer, conversations):
        self.tokenizer, self.conversations, self.cache = tokenizer, conversations, {}

    def __len__(self) -> int:
        return len(self.conversations)

    def __getitem__(self, record: int):
        if record not in self.cache:
            ids, mask = render(self.tokenizer, self.conversations[record])
            self.cache[record] = SimpleNamespace(token_ids=ids, loss_mask=mask)
        return self.cache[record]


def cut_at_shard_ends(corpus: Rendered, tokens: int, max_length: int, shard_tokens: int, seed: int) -> list[tuple]:
    """The baseline: (record, kept length) per document, cut where a shard ends or the budget does."""
    kept, filled = [], 0
    for record in np.random.default_rng(seed).permutation(len(corpus)):
        if filled >= tokens:
            break
        limit = min(max_length, shard_tokens - filled % shard_tokens, tokens - filled)
        length = min(len(corpus[int(record)].token_ids), limit)
        if length:
            kept.append((int(record), length))
            filled += length
    return kept


def summary(corpus: Rendered, kept: list[tuple], max_length: int, padding: int) -> dict:
    cut = [(r, n) for r, n in kept if n < min(len(corpus[r].token_ids), max_length)]
    mask = {r: corpus[r].loss_mask for r, _ in kept}
    return {"documents": len(kept), "cut_short": len(cut),
            "cut_inside_a_reply": sum(bool(mask[r][n - 1] and mask[r][n:].any()) for r, n in cut),
            "left_without_a_reply_token": sum(bool(not mask[r][:n].any() and mask[r].any()) for r, n in cut),
            "loss_masked_tokens": int(sum(mask[r][:n].sum() for r, n in kept)), "padding_tokens": padding}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=400_000)
    parser.add_argument("--shard-tokens", type=int, default=2048)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--out", default="benchmarks/out/whole_documents.json")
    args = parser.parse_args()
    tokenizer = load_model.load(args.model, "cpu", "auto").tokenizer
    corpus = Rendered(tokenizer, load_corpus("sharegpt"))
    before = summary(corpus, cut_at_shard_ends(corpus, args.tokens, args.max_length, args.shard_tokens, 0),
                     args.max_length, 0)
    plan = plan_tokens(tokenizer, corpus, tokens=args.tokens, max_length=args.max_length,
                       shard_tokens=args.shard_tokens, seed=0)
    whole = [(int(record), b - a) for (a, b), record in zip(documents_in(plan.doc), plan.source_record)]
    after = summary(corpus, whole, args.max_length, int((plan.doc == PADDING).sum()))
    result = {"model": args.model, "tokens": args.tokens, "shard_tokens": args.shard_tokens,
              "max_length": args.max_length, "cut_at_shard_ends": before, "whole_documents": after,
              "loss_masked_ratio": after["loss_masked_tokens"] / before["loss_masked_tokens"]}
    for name in ("cut_at_shard_ends", "whole_documents"):
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in result[name].items()))
    print(f"loss-masked tokens, whole documents vs cut: {result['loss_masked_ratio']:.3f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
