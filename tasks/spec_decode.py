"""Speculative decoding with a Hugging Face target and an EAGLE-3 draft head (chain drafting, greedy).

Per round: the head drafts `depth` tokens after the last accepted one; the target verifies them
in one forward pass (which also yields the hidden states the head reads next); the longest prefix
matching the target's own greedy choices is kept, plus the target's next token (the bonus). Both
KV caches are rolled back to the accepted prefix. Greedy output is therefore the target's own
greedy output, token for token; every evaluation checks that against plain decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tasks.draft_head import DraftHead


class HeadDrafter:
    """The draft head with its KV cache over (target hidden state at t, token t+1) pairs."""

    def __init__(self, head: DraftHead):
        self.head = head.eval()
        self.past = None  # (k, v) over committed pairs
        self.hidden = None  # the head's output at the last committed pair
        self.length = 0  # committed pairs = next pair's position

    @torch.no_grad()
    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Commit pairs (aux row t, token t+1) for the next positions; aux (n, k·H), tokens (n,)."""
        positions = torch.arange(self.length, self.length + len(next_tokens))[None]
        out, self.past = self.head.decode(self.head.fuse(aux[None]), next_tokens[None], positions, self.past)
        self.hidden, self.length = out[:, -1:], self.length + len(next_tokens)

    @torch.no_grad()
    def propose(self, depth: int) -> list[int]:
        """Draft `depth` target-vocabulary tokens after the last committed pair (cache left as it was)."""
        hidden, past, tokens = self.hidden, self.past, []
        for step in range(depth):
            draft_id = int(self.head.logits(hidden)[0, -1].argmax())
            tokens.append(draft_id + int(self.head.d2t[draft_id]))
            if step + 1 < depth:
                position = torch.tensor([[self.length + step]])
                hidden, past = self.head.decode(hidden, torch.tensor([[tokens[-1]]]), position, past)
        return tokens


@dataclass
class Generation:
    tokens: list[int]
    forwards: int = 0  # target verification forwards (prefill excluded)
    accepted: list[int] = field(default_factory=list)  # drafts accepted per round
    seconds: float = 0.0

    @property
    def tau(self) -> float:
        """Tokens per target forward, the bonus token included."""
        return (sum(self.accepted) + len(self.accepted)) / max(self.forwards, 1)


def aux_states(hidden_states, layers: list[int]) -> torch.Tensor:
    """(T, k·H) float32: the selected HF hidden_states entries of batch row 0, concatenated."""
    return torch.cat([hidden_states[layer][0].float() for layer in layers], dim=-1)


@torch.no_grad()
def speculative_generate(target, layers: list[int], drafter, prompt: list[int], max_new_tokens: int, depth: int,
                         eos_token_id: int | None) -> Generation:
    began = time.perf_counter()
    ids = torch.tensor([prompt])
    out = target(input_ids=ids, output_hidden_states=True, use_cache=True)
    cache = out.past_key_values
    generated = [int(out.logits[0, -1].argmax())]
    drafter.observe(aux_states(out.hidden_states, layers), torch.tensor(prompt[1:] + generated))
    result = Generation(tokens=generated)
    while not _finished(result.tokens, max_new_tokens, eos_token_id):
        drafts = drafter.propose(depth)
        out = target(input_ids=torch.tensor([[result.tokens[-1], *drafts]]), past_key_values=cache,
                     output_hidden_states=True, use_cache=True)
        choices = out.logits[0].argmax(-1).tolist()
        accepted = 0
        while accepted < depth and drafts[accepted] == choices[accepted]:
            accepted += 1
        new = drafts[:accepted] + [choices[accepted]]
        rejected = depth - accepted
        if rejected:
            cache.crop(-rejected)  # a negative count removes that many positions (transformers 4.x and 5.x)
        drafter.observe(aux_states(out.hidden_states, layers)[: accepted + 1], torch.tensor(new))
        result.forwards += 1
        result.accepted.append(accepted)
        result.tokens += new
    result.tokens = _trim(result.tokens, max_new_tokens, eos_token_id)
    result.seconds = time.perf_counter() - began
    return result


@torch.no_grad()
def plain_generate(target, prompt: list[int], max_new_tokens: int, eos_token_id: int | None) -> Generation:
    """The baseline: the target's own greedy decoding with Hugging Face `generate`."""
    began = time.perf_counter()
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_token_id,
                          pad_token_id=eos_token_id if eos_token_id is not None else 0)
    tokens = _trim(out[0, len(prompt):].tolist(), max_new_tokens, eos_token_id)
    return Generation(tokens=tokens, forwards=len(tokens), seconds=time.perf_counter() - began)


def _finished(tokens: list[int], max_new_tokens: int, eos_token_id: int | None) -> bool:
    return len(tokens) >= max_new_tokens or (eos_token_id is not None and eos_token_id in tokens)


def _trim(tokens: list[int], max_new_tokens: int, eos_token_id: int | None) -> list[int]:
    """Cut at the first EOS (kept) and at the token budget."""
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    return tokens[:max_new_tokens]
