"""Speculative decoding with a Hugging Face target and an EAGLE-3 draft head, the context's own
n-grams, or both.

Per round (chain drafting; tasks/decode/tree_decode.py verifies trees instead, with the same
loop): the drafter drafts tokens after the last accepted one; the target verifies them
in one forward pass (which also yields the hidden states the head reads next); an accepted prefix
is kept plus one token from the target (the bonus, or the correction at the first rejection), and
both KV caches are rolled back to it. Greedy: a draft is accepted when it is the target's own
argmax, so the output is the target's greedy output token for token (every evaluation checks
it). Sampling (temperature > 0): standard speculative rejection sampling, which leaves the
target's sampling distribution unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from tasks.decode.context_lookup import FIRST_COPY_TOKENS, LOOKUP_TOKENS, ContextLookup, common_prefix
from tasks.decode.sampling import draw
from tasks.decode.stopwatch import NO_STOPWATCH, Stopwatch
from tasks.decode.target_choices import TargetChoices
from tasks.decode.tree_decode import DraftTree, draft_tree, tree_round
from tasks.decode.tree_shape import TreeShape
from tasks.heads.draft_head import DraftHead
from tasks.precision import bf16_native


class HeadDrafter:
    """The draft head with its KV cache over (target hidden state at t, token t+1) pairs."""

    drafts_trees = False  # its trees are asked for with a `TreeShape`

    def __init__(self, head: DraftHead, stopwatch: Stopwatch = NO_STOPWATCH):
        self.head = head.eval()
        self.stopwatch = stopwatch  # times each draft step for the round profile
        self.past = None  # (k, v) over committed pairs
        self.hidden = None  # the head's output at the last committed pair
        self.length = 0  # committed pairs = next pair's position
        self.device = head.d2t.device
        self.targets = torch.arange(head.config.draft_vocab_size, device=self.device) + head.d2t  # draft → target id

    @torch.no_grad()
    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Commit pairs (aux row t, token t+1) for the next positions; aux (n, k·H), tokens (n,)."""
        positions = torch.arange(self.length, self.length + len(next_tokens), device=self.device)[None]
        out, self.past = self.head.decode(self.head.fuse(aux[None]), next_tokens[None], positions, self.past)
        self.hidden, self.length = out[:, -1:], self.length + len(next_tokens)

    @torch.no_grad()
    def propose(self, depth: int, temperature: float = 0.0, generator=None) -> tuple[list[int], list]:
        """Draft `depth` target-vocabulary tokens after the last committed pair (cache left as it
        was), with the draft's distribution over the target vocabulary for each when sampling (on
        the CPU, where the sampling generator lives)."""
        hidden, past, tokens, distributions = self.hidden, self.past, [], []
        for step in range(depth):
            with self.stopwatch.part(f"draft step {step + 1}"):
                logits = self.head.logits(hidden)[0, -1].float()
                if temperature > 0:
                    q = torch.zeros(self.head.config.vocab_size)
                    q[self.targets.cpu()] = torch.softmax(logits / temperature, dim=-1).cpu()
                    tokens.append(draw(q, generator))
                    distributions.append(q)
                else:
                    tokens.append(int(self.targets[int(logits.argmax())]))
                if step + 1 < depth:
                    position = torch.tensor([[self.length + step]], device=self.device)
                    hidden, past = self.head.decode(hidden, torch.tensor([[tokens[-1]]], device=self.device),
                                                    position, past)
        return tokens, distributions

    def propose_tree(self, depth: int, shape: TreeShape) -> DraftTree:
        """An EAGLE-2 dynamic tree `depth` levels deep after the last committed pair."""
        with self.stopwatch.part("draft tree"):
            return draft_tree(self, depth, shape)


class LookupDrafter:
    """Drafts copied from the context (`ContextLookup`), no head: prompt lookup in this loop.
    A copied draft is certain (its draft distribution one-hot), so rejection sampling accepts it
    with the target's own probability and keeps the target's distribution."""

    drafts_trees = False

    def __init__(self, first_token: int, vocab_size: int, max_tokens: int = LOOKUP_TOKENS, min_ngram: int = 2,
                 first_tokens: int = FIRST_COPY_TOKENS):
        self.lookup = ContextLookup([first_token], min_ngram, max_tokens=max_tokens,
                                    first_tokens=first_tokens)  # observe brings the rest
        self.vocab_size = vocab_size

    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        self.lookup.extend(next_tokens.tolist())

    def propose(self, depth: int, temperature: float = 0.0, generator=None) -> tuple[list[int], list]:
        """Up to `depth` copied tokens (none where the context never ended this way before)."""
        drafts = self.lookup.propose()[:depth]
        certain = [] if temperature == 0 else [torch.zeros(self.vocab_size).index_fill_(0, torch.tensor(token), 1.0)
                                               for token in drafts]
        return drafts, certain


class HybridDrafter(HeadDrafter):
    """The head's chain and the context's copy drafted together, verified as one tree whose two
    branches share the prefix they agree on: the copy drafts repeated stretches for free, the
    head what the context cannot. Both drafts are deterministic (the head's argmax), so the tree
    walk's sampling keeps the target's distribution."""

    drafts_trees = True

    def __init__(self, head: DraftHead, first_token: int, stopwatch: Stopwatch = NO_STOPWATCH, min_ngram: int = 2):
        super().__init__(head, stopwatch)
        self.lookup = ContextLookup([first_token], min_ngram)  # observe brings the rest

    def observe(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        super().observe(aux, next_tokens)
        self.lookup.extend(next_tokens.tolist())

    def propose_tree(self, depth: int, shape: TreeShape | None = None) -> DraftTree:
        """The head's `depth`-token chain beside the copy (`shape` is the chain's: unused)."""
        with self.stopwatch.part("lookup"):
            copied = self.lookup.propose()
        return DraftTree.from_chains([self.propose(depth)[0], copied])


def for_drafting(head: DraftHead, device: torch.device) -> DraftHead:
    """The head in bfloat16 where the device computes it natively (CUDA; CPUs with bfloat16
    instructions, where a draft step reads half the bytes and runs on faster kernels: the draft
    lm_head's product measured 1.8 → 0.3 ms on this project's CPU), else as trained. Only the
    drafts change, never the output: the target verifies every token in its own precision."""
    return head.to(torch.bfloat16) if bf16_native(device) else head


def accept_greedy(target_logits: torch.Tensor, drafts: list[int]) -> list[int]:
    """Drafts equal to the target's argmax, then the target's own next token."""
    return accept_choices(target_logits.argmax(-1).tolist(), drafts)


def accept_greedy_lazily(lm_head, hidden: torch.Tensor, drafts: list[int]) -> list[int]:
    """`accept_greedy` from the target's final hidden states (T, H), its logits computed only where
    cheap (tasks/decode/target_choices.py; argmax ignores any monotone logit capping)."""
    return accept_choices(TargetChoices(lm_head, hidden), drafts)


def accept_choices(choices, drafts: list[int]) -> list[int]:
    """Drafts while they equal the target's choices (indexable by position, one more than the
    drafts), then its own next."""
    accepted = common_prefix(drafts, choices)
    return drafts[:accepted] + [choices[accepted]]


def accept_sampled(target_probs: torch.Tensor, draft_probs: list, drafts: list[int], generator=None) -> list[int]:
    """Rejection sampling (Leviathan et al. 2023): keep draft d with probability min(1, p(d)/q(d));
    at the first rejection sample from max(0, p − q) renormalised; if all pass, sample the bonus
    from p. Emitted tokens are distributed exactly as sampling the target alone."""
    for i, token in enumerate(drafts):
        p, q = target_probs[i], draft_probs[i]
        if float(torch.rand((), generator=generator)) < min(1.0, float(p[token] / q[token])):
            continue
        residual = (p - q).clamp(min=0)
        residual = residual / residual.sum() if residual.sum() > 0 else p
        return drafts[:i] + [draw(residual, generator)]
    return drafts + [draw(target_probs[len(drafts)], generator)]


@dataclass
class Generation:
    tokens: list[int]
    forwards: int = 0  # target forwards after the prefill (whose logits give the first token)
    accepted: list[int] = field(default_factory=list)  # drafts accepted per round (none recorded: not drafted)
    seconds: float = 0.0

    @property
    def tau(self) -> float:
        """Tokens per target forward after the prefill, the bonus token included."""
        return (len(self.tokens) - 1) / self.forwards if self.forwards else 1.0


def aux_states(hidden_states, layers: list[int]) -> torch.Tensor:
    """(T, k·H) float32: the selected HF hidden_states entries of batch row 0, concatenated
    ((T, 0) for a drafter that reads none)."""
    if not layers:
        return hidden_states[0][0, :, :0].float()
    return torch.cat([hidden_states[layer][0].float() for layer in layers], dim=-1)


@torch.no_grad()
def chain_round(target, cache, drafter, last: int, depth: int, temperature: float = 0.0, generator=None,
                stopwatch: Stopwatch = NO_STOPWATCH):
    """One chain round: draft up to `depth` tokens after `last`, verify them in one target forward, crop
    the rejected ones from the target's cache. Returns what `tree_round` returns."""
    drafts, draft_probs = drafter.propose(depth, temperature, generator)
    greedy = temperature == 0  # then the logits are computed lazily, from the body's output
    with stopwatch.part("verify: target layers"):
        out = (target.get_decoder() if greedy else target)(
            input_ids=torch.tensor([[last, *drafts]], device=target.device), cache=cache, output_hidden_states=True,
            use_cache=True)
    with stopwatch.part("target lm_head and accept"):
        new = (accept_greedy_lazily(target.get_output_embeddings(), out.last_hidden_state[0], drafts) if greedy
               else accept_sampled(torch.softmax(out.logits[0].float() / temperature, -1).cpu(), draft_probs, drafts,
                                   generator))
    with stopwatch.part("cache crop"):
        rejected = len(drafts) - (len(new) - 1)
        if rejected:
            cache.crop(-rejected)  # a negative count removes that many positions
    return new, out.hidden_states, torch.arange(len(new), device=target.device)


@torch.no_grad()
def speculative_generate(target, layers: list[int], drafter, prompt: list[int], max_new_tokens: int, depth: int,
                         eos_token_id: int | None, temperature: float = 0.0, generator=None,
                         tree: TreeShape | None = None, stopwatch: Stopwatch = NO_STOPWATCH) -> Generation:
    """Chain drafting `depth` tokens per round, or with `tree` an EAGLE-2 tree `depth` levels deep.
    `stopwatch` times each part of every round (and "round", the whole of it) for the profile."""
    began = time.perf_counter()
    ids = torch.tensor([prompt], device=target.device)
    # A cache that keeps every position of every layer: a sliding-window layer's own cache (Gemma-3)
    # forgets what lies beyond its window, so it can neither be cropped there nor gathered by position.
    out = target(input_ids=ids, output_hidden_states=True, use_cache=True, logits_to_keep=1, cache=DynamicCache())
    cache = out.cache
    first = out.logits[0, -1:].float()
    generated = (accept_sampled(torch.softmax(first / temperature, -1).cpu(), [], [], generator) if temperature > 0
                 else accept_greedy(first, []))
    drafter.observe(aux_states(out.hidden_states, layers), torch.tensor(prompt[1:] + generated, device=target.device))
    result = Generation(tokens=generated)
    while not _finished(result.tokens, max_new_tokens, eos_token_id):
        with stopwatch.part("round"):
            if tree is None and not drafter.drafts_trees:
                new, hidden_states, rows = chain_round(target, cache, drafter, result.tokens[-1], depth, temperature,
                                                       generator, stopwatch)
            else:
                new, hidden_states, rows = tree_round(target, cache, drafter, result.tokens[-1], depth, tree,
                                                      temperature, generator, stopwatch)
            with stopwatch.part("observe"):
                drafter.observe(aux_states(hidden_states, layers)[rows], torch.tensor(new, device=target.device))
        result.forwards += 1
        result.accepted.append(len(new) - 1)
        result.tokens += new
    kept = _trim(result.tokens, max_new_tokens, eos_token_id)
    if result.accepted:  # τ counts only kept tokens: the last round's past EOS or the budget are cut
        result.accepted[-1] -= len(result.tokens) - len(kept)
    result.tokens = kept
    result.seconds = time.perf_counter() - began
    return result


@torch.no_grad()
def plain_generate(target, prompt: list[int], max_new_tokens: int, eos_token_id: int | None,
                   temperature: float = 0.0, prompt_lookup: int | None = None, streamer=None) -> Generation:
    """The baseline: the target decoding alone with Hugging Face `generate`; with `prompt_lookup`,
    Hugging Face's prompt-lookup decoding instead (up to that many draft tokens copied from an
    earlier occurrence of the last n-gram; no head needed). `streamer` sees each token as
    `generate` hands it out."""
    forwards = []
    counter = target.register_forward_pre_hook(lambda module, args: forwards.append(1))
    began = time.perf_counter()
    sampling = {"do_sample": True, "temperature": temperature, "top_k": None, "top_p": None} if temperature > 0 \
        else {"do_sample": False}
    lookup = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
    try:
        out = target.generate(torch.tensor([prompt], device=target.device),
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=target.device),
                              max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                              pad_token_id=eos_token_id if eos_token_id is not None else 0, streamer=streamer,
                              **sampling, **lookup)
    finally:
        counter.remove()
    tokens = _trim(out[0, len(prompt):].tolist(), max_new_tokens, eos_token_id)
    return Generation(tokens=tokens, forwards=len(forwards) - 1, seconds=time.perf_counter() - began)


def _finished(tokens: list[int], max_new_tokens: int, eos_token_id: int | None) -> bool:
    return len(tokens) >= max_new_tokens or (eos_token_id is not None and eos_token_id in tokens)


def _trim(tokens: list[int], max_new_tokens: int, eos_token_id: int | None) -> list[int]:
    """Cut at the first EOS (kept) and at the token budget."""
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    return tokens[:max_new_tokens]
