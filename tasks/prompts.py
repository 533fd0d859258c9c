"""Evaluation prompts: MT-Bench first turns, held-out ShareGPT prompts, or any JSONL, chat-templated."""

from __future__ import annotations

import numpy as np

from store import schema
from store.access import open_existing
from store.errors import LayerwaveError
from tasks.corpus import load_corpus

BENCHES = "mt-bench, sharegpt, jsonl:PATH"


def first_turns(bench: str, limit: int | None, exclude: set[int] = frozenset(), seed: int = 0) -> list[str]:
    """The first user turn of each conversation; ShareGPT ones in a seeded order, skipping `exclude`."""
    if bench == "mt-bench" or bench.startswith("jsonl:"):
        conversations = list(enumerate(load_corpus(bench)))
    elif bench == "sharegpt":
        corpus = load_corpus("sharegpt")
        order = np.random.default_rng([seed, 2]).permutation(len(corpus))
        conversations = [(int(i), corpus[i]) for i in order if int(i) not in exclude]
    else:
        raise LayerwaveError(f"unknown --bench {bench!r}; use one of {BENCHES}")
    turns = [next(m["content"] for m in c if m["role"] == "user") for _, c in conversations]
    return turns[:limit] if limit else turns


def used_records(store: str | None, model_key: str) -> set[int]:
    """Corpus records a store's extraction used (so held-out prompts never overlap training data)."""
    if not store:
        return set()
    group = open_existing(store, schema.activations_path(model_key))
    if group is None or group.attrs.get("corpus", {}).get("spec") != "sharegpt":
        return set()
    return set(int(i) for i in group["source_record"][:])


def encode_prompts(tokenizer, turns: list[str], max_positions: int, max_new_tokens: int) -> list[list[int]]:
    """Chat-template each turn with the generation prompt; refuse prompts that leave no room."""
    if max_new_tokens < 1:
        raise LayerwaveError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    prompts = []
    for number, turn in enumerate(turns):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        if len(ids) + max_new_tokens > max_positions:
            raise LayerwaveError(f"prompt {number} has {len(ids)} tokens; with --max-new-tokens {max_new_tokens} "
                                 f"it exceeds the model's context of {max_positions}; lower --max-new-tokens or "
                                 "shorten the prompt")
        prompts.append(list(ids))
    if not prompts:
        raise LayerwaveError("the benchmark has no prompts; check --bench and --limit")
    return prompts
