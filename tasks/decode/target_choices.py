"""The target's greedy choices at a round's verified positions, from its final hidden states.

Greedy acceptance needs the target's argmax only where the walk reaches: the first position, and
the next only while drafts are accepted. Whether to compute those rows of the lm_head lazily, one
product each, or all in one product depends on what a row costs. On a CPU in float32 each row adds
its own products (SmolLM2's 49k-row lm_head on 2 cores: 1 row 4.4 ms, 5 rows 10.5, 17 rows 13.5),
so lazy rows pay. In bfloat16 (or on a GPU) a product's cost is reading the weights once (1 row
3.6 ms, 5 rows 4.4, 17 rows 6.8), so a walk that reaches two rows already costs more than all of
them together.
"""

from __future__ import annotations

import torch


def all_rows_at_once(hidden: torch.Tensor) -> bool:
    """Whether one product over every row costs about what a single row does, for states `hidden`."""
    return hidden.dtype != torch.float32 or hidden.device.type != "cpu"


class TargetChoices:
    """The target's argmax at row i of `hidden` (the final hidden states of a verify forward, (T, H)),
    computed on first use: all rows in one product where that costs about one row, else row by row."""

    def __init__(self, lm_head, hidden: torch.Tensor):
        self.lm_head, self.hidden = lm_head, hidden
        self.all = lm_head(hidden).argmax(-1).tolist() if all_rows_at_once(hidden) else None

    def __getitem__(self, row: int) -> int:
        return self.all[row] if self.all is not None else int(self.lm_head(self.hidden[row]).argmax())
