"""Whether a greedy output that differs from the target's own is still the target's greedy text.

In float32 speculative decoding reproduces Hugging Face `generate` token for token. In bfloat16 it
cannot: verifying 5 tokens in one forward rounds differently from 5 one-token steps, and where the
target's two best tokens nearly tie, either side may pick either (SmolLM2-135M, 4 MT-Bench
prompts × 128 tokens, lookup drafting: identical in float32; in bfloat16 each diverged once, at
tokens 67–88, where float32 put the two tokens 0.006–0.18 logits apart). HF's own prompt lookup
differs from its plain decoding the same way. So a mismatch counts as lossless only where it
begins at such a tie, measured by the target itself; anything else is a bug.
"""

from __future__ import annotations

import torch

TIE_LOGITS = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.5}  # rounding's reach, per precision


def first_divergence(expected: list[int], got: list[int]) -> int | None:
    """The first index where two outputs differ (a length difference counts), else None."""
    return next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b),
                None if len(expected) == len(got) else min(len(expected), len(got)))


class TieCheck:
    """Whether a decoder's text left the target's own at a tie, for one evaluation's target. The
    target's forwards are kept by context, since the decoders compared on a prompt mostly leave
    the baseline's text at the same tie; owned by the evaluation, so they go when it ends."""

    def __init__(self, target):
        self.target, self.logits = target, {}

    def __call__(self, prompt: list[int], expected: list[int], got: list[int]) -> bool:
        """Whether `got` leaves `expected` at a token the target scores within its precision's
        rounding of `expected`'s (after their common prefix); False where they end apart."""
        at = first_divergence(expected, got)
        if at is None or at >= min(len(expected), len(got)):
            return False
        context = tuple(prompt + expected[:at])
        if context not in self.logits:
            self.logits[context] = next_logits(self.target, context)
        logits = self.logits[context]
        return abs(float(logits[expected[at]] - logits[got[at]])) <= TIE_LOGITS.get(self.target.dtype, 0.0)


@torch.no_grad()
def next_logits(target, context: tuple[int, ...]) -> torch.Tensor:
    """The target's next-token logits after `context`."""
    return target(input_ids=torch.tensor([context], device=target.device), logits_to_keep=1).logits[0, -1].float()
