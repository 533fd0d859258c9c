"""Training-time test: unroll the draft head over `steps` and score each step against the target.

Shifts follow SpecForge's EAGLE-3 recipe: at store position t, step 0 combines the target's aux
hidden state at t with the embedding of token t+1 and is taught the target's next-token
distribution at t+1; step i feeds back its own hidden state, reads token t+i+1, is taught the
distribution at t+i+1 and uses rotary positions shifted by i. A step is scored where token t+i is
loss-masked (a reply token); the loss counts those of them whose target argmax is in the draft
vocabulary (with `everywhere`, prompt positions too).

The loss is written as logsumexp(logits) − Σ teacher·logit, the soft cross-entropy without a
log-softmax over the draft vocabulary, and training skips the argmax scoring (`scored=False`): on a
2-core CPU the vocabulary-wide passes were a fifth of a four-step unroll (benchmarks/train.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tasks.heads.draft_head import DraftHead
from tasks.heads.train_data import Batch


@dataclass
class StepResult:
    loss: torch.Tensor  # mean soft cross-entropy over the positions trained on (0 when none)
    correct: int | None = None  # reply positions where the draft argmax is the target's
    covered: int | None = None  # reply positions whose target argmax is in the draft vocabulary
    positions: int | None = None  # reply positions scored (the three are None when not `scored`)


def score(predicted: torch.Tensor, label: torch.Tensor, reply: torch.Tensor) -> tuple[int, int, int]:
    """(correct, covered, positions) over the `reply` positions: `predicted` and `label` are draft
    ids, `label` −1 where the target's argmax is outside the draft vocabulary (a miss)."""
    return (int(((predicted == label) & reply).sum()), int(((label >= 0) & reply).sum()), int(reply.sum()))


def shift_left(x: torch.Tensor, n: int, fill) -> torch.Tensor:
    """x[:, t] ← x[:, t + n], padding the end with `fill` (all fill when n ≥ the width: a batch of
    short windows unrolled further than they reach)."""
    n = min(n, x.shape[1])
    if n == 0:
        return x
    pad = torch.full((x.shape[0], n) + tuple(x.shape[2:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x[:, n:], pad], dim=1)


def unroll(head: DraftHead, batch: Batch, target_to_draft: torch.Tensor, steps: int,
           everywhere: bool = False, scored: bool = True) -> list[StepResult]:
    hidden = head.fuse(batch.aux)
    cache: list = []
    results = []
    for i in range(steps):
        input_ids = shift_left(batch.input_ids, i + 1, 0)
        label_ids = target_to_draft[shift_left(batch.label_ids, i + 1, 0)]  # draft ids, −1 outside
        label_logprobs = shift_left(batch.label_logprobs, i + 1, float("-inf"))
        valid, in_vocab = shift_left(batch.valid, i + 1, False), label_ids >= 0
        reply = valid & shift_left(batch.loss_mask, i, False)
        trained = (valid if everywhere else reply) & in_vocab[..., 0]
        teacher = torch.where(in_vocab, label_logprobs.exp(), label_logprobs.new_zeros(()))
        teacher = teacher / teacher.sum(-1, keepdim=True).clamp(min=1e-12)  # renormalised on the draft vocab

        hidden = head.step(hidden, input_ids, batch.positions + i, cache)
        logits = head.logits(hidden).float()
        picked = logits.gather(-1, label_ids.clamp(min=0))
        per_token = torch.logsumexp(logits, dim=-1) * teacher.sum(-1) - (teacher * picked).sum(-1)
        loss = (per_token * trained).sum() / max(int(trained.sum()), 1)
        counts = score(logits.argmax(-1), label_ids[..., 0], reply) if scored else ()
        results.append(StepResult(loss, *counts))
    return results
