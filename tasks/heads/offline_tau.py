"""Offline τ: chain speculative decoding simulated along stored replies, without running the target.

On documents whose replies are the target's own greedy output, real greedy decoding of a reply's
prompt retraces that reply token for token. So a round can be replayed from the store: the head
reads the target's states up to the last accepted token and drafts `depth` tokens, feeding back
its own outputs; the drafts are accepted while they equal the reply's next tokens, plus one bonus
token; the next round starts after them.

One parallel pass gives every round's drafts: a draft can only be accepted while every earlier
draft of its round equalled the reply, and then the head has been fed exactly the reply's
tokens, so teacher forcing along the reply (the TTT unroll, with the chain's positions and
attention) computes each draft that matters. Draft i at pair position p (target state at p,
token p+1) predicts token p+i+2.

Drafts copied from the context (`--draft lookup`) are replayed round by round: they depend only
on the tokens so far, which along the reply are the reply's own, and on how much of the last
copy was accepted (the 2-gram rule of float32 decoding on a CPU, tasks/decode/decoders.py).
Hybrid drafting verifies the head's chain and the copy as one tree, so its round accepts the
longer of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from store.errors import LayerwaveError
from tasks.decode.context_lookup import LOOKUP_TOKENS, ContextLookup, common_prefix
from tasks.heads.draft_head import DraftHead
from tasks.heads.train_data import StoreBatches
from tasks.heads.ttt import shift_left


@dataclass(frozen=True)
class Reply:
    start: int  # position (in its document) of the reply's first token, which prefill produces
    stop: int  # one past its last token: the first EOS, the document's end, or start + max_new_tokens


def replies_in(token_id: np.ndarray, loss_mask: np.ndarray, eos: int | None, max_new_tokens: int | None,
               whole_only: bool = False) -> list[Reply]:
    """The assistant replies of one document (runs of loss-masked tokens), each cut after its first
    EOS and at `max_new_tokens`, as decoding would stop. `whole_only` drops replies that the
    document cuts short (no EOS and fewer than `max_new_tokens`: extraction truncated them), whose
    real decoding would go on past the stored text."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], loss_mask.astype(np.int8), [0]])))
    out = []
    for a, b in zip(edges[::2], edges[1::2]):
        if a == 0:  # a reply with no prompt before it: nothing to decode from
            continue
        a, b = int(a), int(b)
        stop = b
        if eos is not None:
            ends = np.flatnonzero(token_id[a:b] == eos)
            stop = a + int(ends[0]) + 1 if len(ends) else b
        ended = stop < b or (eos is not None and token_id[stop - 1] == eos)
        if max_new_tokens is not None:
            ended, stop = ended or stop - a >= max_new_tokens, min(stop, a + max_new_tokens)
        if ended or not whole_only:
            out.append(Reply(a, stop))
    return out


def whole_first_reply(token_id: np.ndarray, loss_mask: np.ndarray, eos: int | None,
                      max_new_tokens: int | None) -> list[Reply]:
    """The document's first reply if the document holds it whole (else nothing): what real decoding
    of the document's first prompt replays (`--bench heldout`)."""
    starts = np.flatnonzero(loss_mask)
    replies = replies_in(token_id, loss_mask, eos, max_new_tokens, whole_only=True)
    return replies[:1] if replies and len(starts) and replies[0].start == starts[0] else []


@torch.no_grad()
def draft_matches(head: DraftHead, aux: torch.Tensor, token_id: torch.Tensor, positions: torch.Tensor,
                  depth: int) -> np.ndarray:
    """bool (depth, T): draft i at pair position p equals token p+i+2 of the document."""
    targets = torch.arange(head.config.draft_vocab_size, device=aux.device) + head.d2t
    ids, pos = token_id[None], positions[None]
    hidden = head.fuse(aux[None])
    cache: list = []
    matches = []
    for i in range(depth):
        hidden = head.step(hidden, shift_left(ids, i + 1, 0), pos + i, cache)
        drafted = targets[head.logits(hidden).argmax(-1)]
        matches.append((drafted == shift_left(ids, i + 2, -1))[0])
    return torch.stack(matches).cpu().numpy()


def simulate_rounds(matches: np.ndarray | list[np.ndarray], reply: Reply, copied_from: np.ndarray | None = None
                    ) -> list[int]:
    """Tokens each round adds (accepted drafts + the bonus, cut at the reply's end), from the
    round after prefill to the end of the reply. A list of match arrays is one tree of chains
    verified together: each round keeps the longest accepted chain. With `copied_from` (the
    document's token ids) the context's copy is one more branch, replayed round by round: its
    length depends on how much of the last copy was accepted."""
    branches = matches if isinstance(matches, list) else [matches]
    copy = None if copied_from is None else ContextLookup(copied_from[:reply.start + 1].tolist())
    gains = []
    last = reply.start  # position of the last token generated so far
    while last < reply.stop - 1:
        pair, left = last - 1, reply.stop - 1 - last  # the head's newest pair: target state at last−1, token `last`
        accepted = max((accepted_drafts(branch, pair, left) for branch in branches), default=0)
        if copy:
            accepted = max(accepted, common_prefix(copy.propose()[:left], copied_from[last + 1:]))
        gain = min(accepted + 1, left)
        gains.append(gain)
        if copy:
            copy.extend(copied_from[last + 1:last + 1 + gain].tolist())
        last += gain
    return gains


def accepted_drafts(matches: np.ndarray, pair: int, left: int) -> int:
    """Drafts of the round at `pair` accepted before the first miss, at most `left` (the reply's end)."""
    accepted = 0
    while accepted < min(matches.shape[0], left) and matches[accepted, pair]:
        accepted += 1
    return accepted


def summarize_rounds(gains_per_reply: list[list[int]], depth: int, seed: int = 0, resamples: int = 1000) -> dict:
    """τ = tokens per round; per-position acceptance; a bootstrap 95% interval over replies."""
    gains = [g for reply in gains_per_reply for g in reply]
    if not gains:
        raise LayerwaveError("no reply to simulate: the held-out documents have no assistant tokens after a "
                             "prompt; use a store extracted from a generated corpus (--corpus regen:DIR)")
    tokens = np.array([sum(r) for r in gains_per_reply], dtype=float)
    rounds = np.array([len(r) for r in gains_per_reply], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(tokens), size=(resamples, len(tokens)))
    boot = tokens[picks].sum(1) / np.maximum(rounds[picks].sum(1), 1)
    accepted = np.array(gains) - 1
    return {"tau": float(tokens.sum() / rounds.sum()), "tau_ci95": [float(np.quantile(boot, 0.025)),
                                                                     float(np.quantile(boot, 0.975))],
            "per_position": [float(np.mean(accepted > i)) for i in range(depth)], "rounds": int(rounds.sum()),
            "replies": len(gains_per_reply), "tokens": int(tokens.sum()), "depth": depth}


DRAFTS = ("chain", "lookup", "hybrid")


def simulate_documents(head: DraftHead | None, documents, depth: int, eos: int | None, max_new_tokens: int | None = None,
                       first_turn_only: bool = False, limit: int | None = None,
                       drafts: str = "chain") -> list[list[int]]:
    """Tokens per round of every reply of `documents` ((aux, token_id, position, loss_mask) each),
    the first `limit` documents that have a reply to simulate (all by default), drafted by the
    head's chain of `depth`, the context's copy (no head), or both as hybrid drafting's tree."""
    if drafts not in DRAFTS:
        raise LayerwaveError(f"unknown drafts {drafts!r}; use one of {', '.join(DRAFTS)}")
    gains, simulated = [], 0
    for aux, token_id, positions, loss_mask in documents:
        replies = (whole_first_reply(token_id, loss_mask, eos, max_new_tokens) if first_turn_only
                   else replies_in(token_id, loss_mask, eos, max_new_tokens))
        if not replies:
            continue
        if limit is not None and simulated >= limit:
            break
        simulated += 1
        branches = []
        if drafts != "lookup":
            device = head.d2t.device
            branches.append(draft_matches(head, torch.from_numpy(aux).to(device),
                                          torch.from_numpy(token_id).long().to(device),
                                          torch.from_numpy(positions).long().to(device), depth))
        gains += [simulate_rounds(branches, reply, None if drafts == "chain" else token_id) for reply in replies]
    return gains


def offline_tau(head: DraftHead, data: StoreBatches, depth: int, eos: int | None,
                max_new_tokens: int | None = None, first_turn_only: bool = False, limit: int | None = None,
                drafts: str = "chain") -> dict:
    """τ_offline over the held-out documents of `data` (the head's own held-out split), the first
    `limit` of them that have a reply to simulate (all by default), for `drafts` as in
    `simulate_documents`."""
    if data.layers != head.config.layers:
        raise LayerwaveError(f"the head reads layers {head.config.layers}; the data was opened for {data.layers}")
    documents = (document for _, shard_documents in data.heldout_shards() for document in shard_documents)
    gains = simulate_documents(head, documents, depth, eos, max_new_tokens, first_turn_only, limit, drafts)
    return summarize_rounds(gains, depth if drafts == "chain" else max(depth, LOOKUP_TOKENS))
