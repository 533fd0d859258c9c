"""Choose documents and lay them out in shards, before any forward pass.

Documents are taken in a seeded random order until the token budget is filled. A document never
crosses a shard boundary: one that would is truncated there (as `--max-length` truncates long
ones), so each shard is a self-contained set of documents that one task forwards and writes
whole, and no token is forwarded twice.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from store.errors import LayerwaveError
from tasks.data.render import render


@dataclass
class TokenPlan:
    token_id: np.ndarray  # int32 (token,)
    doc: np.ndarray  # int32 (token,): document number in the store
    position: np.ndarray  # int32 (token,): position inside its document
    loss_mask: np.ndarray  # bool (token,)
    source_record: np.ndarray  # int32 (document,): index of each document in the corpus

    @property
    def n_tokens(self) -> int:
        return len(self.token_id)

    def digest(self) -> str:
        """Content hash of the tokenized corpus: equal plans write equal stores."""
        h = hashlib.sha256()
        for array in (self.token_id, self.doc, self.position, self.loss_mask, self.source_record):
            h.update(np.ascontiguousarray(array).tobytes())
        return h.hexdigest()


def plan_tokens(tokenizer, conversations, *, tokens: int, max_length: int, shard_tokens: int, seed: int) -> TokenPlan:
    """Pick and truncate documents to exactly `tokens` tokens (fewer if the corpus runs out)."""
    if tokens < 1:
        raise LayerwaveError(f"--tokens must be at least 1 (got {tokens})")
    if max_length < 2:
        raise LayerwaveError(f"--max-length must be at least 2 (got {max_length})")
    order = np.random.default_rng(seed).permutation(len(conversations))
    pieces, sources, filled = [], [], 0
    for record in order:
        if filled >= tokens:
            break
        room_in_shard = shard_tokens - filled % shard_tokens
        limit = min(max_length, room_in_shard, tokens - filled)
        ids, mask = render(tokenizer, conversations[record])
        ids, mask = ids[:limit], mask[:limit]
        if len(ids) == 0:
            continue
        pieces.append((ids, mask))
        sources.append(int(record))
        filled += len(ids)
    if not pieces:
        raise LayerwaveError("the corpus rendered to no tokens; give it non-empty conversations")
    lengths = [len(ids) for ids, _ in pieces]
    return TokenPlan(
        token_id=np.concatenate([ids for ids, _ in pieces]).astype(np.int32),
        doc=np.repeat(np.arange(len(pieces), dtype=np.int32), lengths),
        position=np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]),
        loss_mask=np.concatenate([mask for _, mask in pieces]),
        source_record=np.asarray(sources, dtype=np.int32),
    )


def documents_in(doc: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each run of equal `doc` values: the documents of a shard."""
    if len(doc) == 0:
        return []
    cuts = np.flatnonzero(np.diff(doc)) + 1
    bounds = np.concatenate([[0], cuts, [len(doc)]])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def plan_hash(plan: TokenPlan, settings: dict) -> str:
    """Identity of an extraction: the tokens plus every setting that changes stored values."""
    h = hashlib.sha256(plan.digest().encode())
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]
