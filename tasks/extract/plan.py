"""Choose documents and lay them out in shards, before any forward pass.

Documents are taken in a seeded random order until the token budget is filled, and each goes
whole into one shard: one that does not fit the room left in a shard waits while the next
documents fill that room (a few are looked ahead), and whatever room no document fits is padding
(`doc` −1, no loss, never forwarded). So every shard is a self-contained set of whole documents
that one task forwards and writes, no token is forwarded twice, and only documents longer than
`--max-length` are truncated (or than a shard, where `--chunks-per-shard` makes shards shorter).
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
    truncated: int = 0  # documents longer than --max-length (or a shard), cut to it

    @property
    def n_tokens(self) -> int:
        return len(self.token_id)

    def digest(self) -> str:
        """Content hash of the tokenized corpus: equal plans write equal stores."""
        h = hashlib.sha256()
        for array in (self.token_id, self.doc, self.position, self.loss_mask, self.source_record):
            h.update(np.ascontiguousarray(array).tobytes())
        return h.hexdigest()


PADDING = -1  # the `doc` of filler tokens at a shard's end: no document, no loss, zero hidden states
LOOKAHEAD = 32  # documents that may wait for a shard with room before the room is padded


def plan_tokens(tokenizer, conversations, *, tokens: int, max_length: int, shard_tokens: int, seed: int) -> TokenPlan:
    """Lay out `tokens` positions (padding included) of whole documents, shard by shard."""
    if tokens < 1:
        raise LayerwaveError(f"--tokens must be at least 1 (got {tokens})")
    if max_length < 2:
        raise LayerwaveError(f"--max-length must be at least 2 (got {max_length})")
    longest = min(max_length, shard_tokens)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stream = (int(record) for record in np.random.default_rng(seed).permutation(len(conversations)))
    pieces, waiting, filled, exhausted, cut = [], [], 0, False, set()
    while filled < tokens:
        space = min(shard_tokens - filled % shard_tokens, tokens - filled)
        fitting = next((w for w in waiting if len(w[1]) <= space), None)
        while fitting is None and not exhausted and len(waiting) < LOOKAHEAD:
            record = next(stream, None)
            if record is None:
                exhausted = True
                break
            ids, mask = render(tokenizer, conversations[record])
            if len(ids):
                if len(ids) > longest:
                    cut.add(record)
                waiting.append((record, ids[:longest], mask[:longest]))
                fitting = waiting[-1] if len(waiting[-1][1]) <= space else None
        if fitting is not None:
            waiting.remove(fitting)
            pieces.append(fitting)
            filled += len(fitting[1])
        elif waiting:  # the room fits nothing waiting: pad it, the next shard takes them
            pieces.append((PADDING, np.full(space, pad_id), np.zeros(space, dtype=bool)))
            filled += space
        else:
            break  # the corpus ran out
    if not pieces:
        raise LayerwaveError("the corpus rendered to no tokens; give it non-empty conversations")
    documents = [record for record, _, _ in pieces if record != PADDING]
    if not documents:
        shortest = min(len(ids) for _, ids, _ in waiting)
        raise LayerwaveError(f"--tokens {tokens} holds no whole document (the shortest of the {len(waiting)} looked at "
                             f"has {shortest} tokens); give more --tokens")
    numbers = iter(range(len(documents)))
    lengths = [len(ids) for _, ids, _ in pieces]
    doc = [PADDING if record == PADDING else next(numbers) for record, _, _ in pieces]
    return TokenPlan(
        token_id=np.concatenate([ids for _, ids, _ in pieces]).astype(np.int32),
        doc=np.repeat(np.asarray(doc, dtype=np.int32), lengths),
        position=np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]),
        loss_mask=np.concatenate([mask for _, _, mask in pieces]).astype(bool),
        source_record=np.asarray(documents, dtype=np.int32),
        truncated=len(cut.intersection(documents)),
    )


def documents_in(doc: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each run of equal `doc` values: the documents of a shard (padding is none)."""
    if len(doc) == 0:
        return []
    cuts = np.flatnonzero(np.diff(doc)) + 1
    bounds = np.concatenate([[0], cuts, [len(doc)]])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if doc[a] != PADDING]


def plan_hash(plan: TokenPlan, settings: dict) -> str:
    """Identity of an extraction: the tokens plus every setting that changes stored values."""
    h = hashlib.sha256(plan.digest().encode())
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]
