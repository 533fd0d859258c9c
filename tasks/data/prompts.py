"""Evaluation prompts: MT-Bench first turns, held-out ShareGPT prompts, or any JSONL, chat-templated."""

from __future__ import annotations

import numpy as np

from store import paths, schema
from store.access import open_existing
from store.artefacts import location
from store.errors import LayerwaveError
from tasks.data.corpus import load_corpus
from tasks.data.regen_corpus import read_generated
from tasks.extract.plan import documents_in
from tasks.heads.offline_tau import whole_first_reply
from tasks.heads.train_data import heldout_documents

BENCHES = "mt-bench, sharegpt, heldout, jsonl:PATH"


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
    group = open_existing(store, paths.activations(model_key))
    if group is None:
        return set()
    spec = group.attrs.get("corpus", {}).get("spec", "")
    used = [int(i) for i in group["source_record"][:]]
    if spec.startswith("regen:"):  # a generated corpus: its conversations' own ShareGPT records
        conversations_records, manifest = read_generated(location(spec[6:]))[1:]
        if manifest["source"]["spec"] != "sharegpt":
            return set()
        return {conversations_records[i] for i in used}
    return set(used) if spec == "sharegpt" else set()


def encode_turn(tokenizer, turn: str) -> list[int]:
    """One user turn, chat-templated with the generation prompt."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])


def encode_prompts(tokenizer, turns: list[str], max_positions: int, max_new_tokens: int) -> list[list[int]]:
    """Chat-template each turn with the generation prompt; refuse prompts that leave no room."""
    return checked_prompts([encode_turn(tokenizer, turn) for turn in turns], max_positions, max_new_tokens)


def fitting_prompts(tokenizer, turns: list[str], max_positions: int, max_new_tokens: int,
                    limit: int | None) -> list[list[int]]:
    """The first `limit` turns, in order, that leave room for `max_new_tokens`: a sample of
    ShareGPT holds prompts longer than a small model's context, which a sample may skip."""
    prompts = []
    for turn in turns:
        if limit is not None and len(prompts) >= limit:
            break
        ids = encode_turn(tokenizer, turn)
        if len(ids) + max_new_tokens <= max_positions:
            prompts.append(ids)
    return checked_prompts(prompts, max_positions, max_new_tokens)


def checked_prompts(prompts: list[list[int]], max_positions: int, max_new_tokens: int) -> list[list[int]]:
    """The prompts, once each is known to leave room for `max_new_tokens` and there is one at all."""
    if max_new_tokens < 1:
        raise LayerwaveError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    for number, ids in enumerate(prompts):
        if len(ids) + max_new_tokens > max_positions:
            raise LayerwaveError(f"prompt {number} has {len(ids)} tokens; with --max-new-tokens {max_new_tokens} "
                                 f"it exceeds the model's context of {max_positions}; lower --max-new-tokens or "
                                 "shorten the prompt")
    if not prompts:
        raise LayerwaveError("the benchmark has no prompts; check --bench and --limit")
    return prompts


def heldout_prompts(store: str | None, model_key: str, seed: int, holdout: float, limit: int | None,
                    eos: int | None, max_new_tokens: int) -> list[list[int]]:
    """The exact prompt tokens of the held-out documents (the head's held-out split) whose first
    reply the store holds whole, so real decoding replays what `τ_offline --first-turn-only`
    simulates."""
    if not store:
        raise LayerwaveError("--bench heldout replays a store's held-out documents; pass --store")
    group = open_existing(store, paths.activations(model_key))
    if group is None:
        raise LayerwaveError(f"no activations for {model_key} in {store}; run `layerwave extract` first")
    doc, token_id, mask = group[schema.DOC][:], group[schema.TOKEN_ID][:], group[schema.LOSS_MASK][:]
    heldout = heldout_documents(int(doc.max()) + 1 if len(doc) else 0, holdout, seed)
    prompts = []
    for a, b in documents_in(doc):
        if not heldout[doc[a]]:
            continue
        reply = whole_first_reply(token_id[a:b], mask[a:b], eos, max_new_tokens)
        if reply:
            prompts.append(token_id[a: a + reply[0].start].tolist())
    if not prompts:
        raise LayerwaveError(f"no held-out document of {store} holds a whole first reply after its prompt")
    return prompts[:limit] if limit else prompts
