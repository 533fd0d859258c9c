"""Replayed decoding: the target's greedy replies to a benchmark's prompts, generated and stored
once per model, then every head's chain τ simulated along them (tasks/heads/offline_tau.py).

Greedy speculative decoding is lossless: with any head it emits the target's greedy reply token
for token, and a round accepts a draft exactly when it equals the reply's next token. So chain τ
simulated along the stored reply is the τ real decoding measures, up to floating-point
differences between one full forward and cached incremental ones (the study checks it against
real decoding). The target then runs once per prompt instead of once per head and prompt, which
is what lets a CPU measure 40 prompts × 2 benchmarks for every final head.

The replies are generated one prompt at a time (batch 1, no padding), as real decoding runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from store.artefacts import write_text
from store.errors import LayerwaveError
from store.paths import Workspace
from tasks.data.prompts import first_turns, used_records
from tasks.data.regen_corpus import read_generated
from tasks.decode.evaluate import load_pair
from tasks.heads.offline_tau import offline_tau
from tasks.heads.train_data import StoreBatches

BENCHES = ("mt-bench", "sharegpt")


def write_prompts(store: str, model_key: str, bench: str, count: int) -> Path:
    """A JSONL of `count` first user turns of `bench` for the target to answer; ShareGPT ones are
    those the training store did not use, in the evaluation's own seeded order."""
    if bench not in BENCHES:
        raise LayerwaveError(f"cannot replay --bench {bench!r}; use one of {', '.join(BENCHES)}")
    exclude = used_records(store, model_key) if bench == "sharegpt" else frozenset()
    turns = first_turns(bench, count, exclude=exclude)
    return write_text(Workspace(store).replay_prompts(model_key, bench),
                      "".join(json.dumps({"prompt": turn}) + "\n" for turn in turns))


REPLAY_CHUNK_TOKENS = 512  # chunks of 0.5 to 8 MiB for widths 512 to 8192


def whole_corpus(corpus: Path) -> dict:
    """Extraction settings that store a generated corpus whole: every token, in one shard (no
    padding, and the layout replay stores have always had, so their stage keys hold)."""
    tokens = sum(len(conversation.token_ids) for conversation in read_generated(corpus)[0])
    return {"tokens": tokens, "tokens_per_chunk": REPLAY_CHUNK_TOKENS,
            "chunks_per_shard": -(-tokens // REPLAY_CHUNK_TOKENS)}


def replay_data(store: str, model_key: str, bench: str, layers: list[int]) -> StoreBatches:
    """The stored replies of `bench`, every document "held out" (none was trained on)."""
    return StoreBatches(Workspace(store).replay_store(model_key, bench), model_key, layers, seq_len=1, batch_size=1,
                        seed=0, holdout=1.0)


def replay_tau(head, store: str, model_key: str, bench: str, depth: int, eos: int | None,
               max_new_tokens: int, drafts: str = "chain") -> dict:
    """τ of `head`'s `drafts` (chain or hybrid) along every stored reply of `bench`, each cut at
    `max_new_tokens`."""
    data = replay_data(store, model_key, bench, head.config.layers)
    return {**offline_tau(head, data, depth, eos, max_new_tokens, first_turn_only=True, drafts=drafts),
            "method": "replay"}


@task(name="replay-head", cache_policy=NO_CACHE)
def replay_task(model: str, head: str, store: str, model_key: str, bench: str, depth: int,
                max_new_tokens: int) -> dict:
    """One head's τ on `bench`, replayed along the target's stored replies (no speed-up: the
    target does not run)."""
    target, drafter = load_pair(model, head, "cpu")
    return {**replay_tau(drafter, store, model_key, bench, depth, target.tokenizer.eos_token_id, max_new_tokens),
            "speedup": None, "lossless": None}
