"""Warm start: the draft's output side begins as the target's own.

The draft head's last hidden state goes through `norm` and `lm_head`, as the target's does. Started
from the target's final norm and from the target's lm_head rows of the draft vocabulary (through
d2t), the head only has to learn where the target's next hidden state goes, instead of also
learning a vocabulary projection from scratch. Works for tied and untied lm_heads (the output
embeddings either way) and for norms that scale by `weight` (Llama) or `1 + weight` (Gemma): the
target norm's effective scale is read off by applying it to a vector of ones.
"""

from __future__ import annotations

import torch

from tasks.heads.draft_head import DraftHead


def final_norm(target) -> torch.nn.Module | None:
    """The norm a Hugging Face causal LM applies before its lm_head (None when it has none)."""
    decoder = target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", None)
    return getattr(decoder, "norm", None)


@torch.no_grad()
def warm_start(head: DraftHead, target) -> list[str]:
    """Copy what fits; returns the names copied, so a caller can say what was warm-started."""
    copied = []
    rows = torch.arange(head.config.draft_vocab_size, device=head.d2t.device) + head.d2t  # draft → target id
    output = target.get_output_embeddings().weight
    if output.shape[1] == head.lm_head.weight.shape[1]:
        head.lm_head.weight.copy_(output[rows.to(output.device)].float())
        copied.append("lm_head")
    norm = final_norm(target)
    weight = next(norm.parameters(), None) if norm is not None else None
    if weight is not None and weight.shape == head.norm.weight.shape:
        ones = torch.ones(1, head.config.hidden_size)
        scale = norm(ones.to(weight)).float().cpu()
        head.norm.weight.fill_(1.0)
        head.norm.weight.copy_((scale / head.norm(ones))[0])
        copied.append("norm")
    return copied
