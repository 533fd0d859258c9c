"""Drafts copied from the context: the continuation of the longest earlier match of its suffix.

Small models' greedy text repeats itself (54% of SmolLM2's reply tokens close a 4-gram seen
earlier in the conversation), so the tokens that followed the last time the context ended this
way are a free draft. Prompt-lookup decoding (Saxena 2023, Hugging Face's
`prompt_lookup_num_tokens`) matches a fixed 2-gram at its earliest occurrence; here the longest
suffix up to `max_ngram` tokens is matched at its most recent occurrence (the better predictor of
what comes next), through an index kept up to date as tokens are committed, so a round costs a
few dictionary lookups however long the context.

A copy's length follows how much of the last one was accepted: twice the accepted stretch (with
the target's own next token), from 4 up to 32 tokens. Long copies where the text loops, short
ones where a wrong copy would widen the verify forward for nothing. Replayed along SmolLM2's
greedy replies to 80 MT-Bench and 80 ShareGPT prompts and priced by the measured verify forward,
this beat fixed copies of 8 or 32 tokens; on Gemma-3's looping replies a fixed 32 is better
still, which `auto` measures (benchmarks/README.md, lookup_rules.py).
"""

from __future__ import annotations

FIRST_COPY_TOKENS = 4  # a copy's length at first, and at least
LOOKUP_TOKENS = 32  # a copy's length at most


class ContextLookup:
    """An index from every n-gram of the context (`min_ngram` ≤ n ≤ `max_ngram`) to the position
    just after its most recent occurrence that has a continuation."""

    def __init__(self, context: list[int], min_ngram: int = 2, max_ngram: int = 4,
                 max_tokens: int = LOOKUP_TOKENS, first_tokens: int = FIRST_COPY_TOKENS):
        """`first_tokens` = `max_tokens`: copies of a fixed length."""
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram})")
        self.min_ngram, self.max_ngram, self.max_tokens = min_ngram, max_ngram, max_tokens
        self.first_tokens = self.length = min(first_tokens, max_tokens)  # the next copy's length
        self.proposed: list[int] = []  # the last copy, until the tokens committed after it show its fate
        self.tokens: list[int] = []
        self.follows: dict[tuple[int, ...], int] = {}  # n-gram → index of the token that followed it
        self.extend(context)

    def extend(self, tokens: list[int]) -> None:
        """Commit `tokens`; each one is the continuation of the n-grams that end just before it. After a
        copy, they tell how much of it was accepted, and so the next copy's length."""
        if self.proposed:
            accepted = common_prefix(self.proposed, tokens)
            self.length = min(max(2 * (accepted + 1), self.first_tokens), self.max_tokens)
            self.proposed = []
        for token in tokens:
            end = len(self.tokens)
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self.follows[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def propose(self) -> list[int]:
        """The copy's length of tokens that followed the longest matching suffix last time; none
        when even the shortest suffix never occurred before. A match close behind the end is a
        loop, and the copy runs on into its own drafts (period = the distance behind)."""
        for n in range(min(self.max_ngram, len(self.tokens)), self.min_ngram - 1, -1):
            start = self.follows.get(tuple(self.tokens[-n:]))
            if start is not None:
                period = len(self.tokens) - start
                self.proposed = [self.tokens[start + i % period] for i in range(self.length)]
                return self.proposed
        return []


def common_prefix(drafts, following) -> int:
    """How many of `drafts` equal the tokens `following` them, before the first miss."""
    accepted = 0
    while accepted < min(len(drafts), len(following)) and drafts[accepted] == following[accepted]:
        accepted += 1
    return accepted
