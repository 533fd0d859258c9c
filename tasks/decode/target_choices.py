"""The target's greedy choices at a round's verified positions, from its final hidden states.

Greedy acceptance needs the target's argmax only where the walk reaches: the first position, and
the next only while drafts are accepted. Whether to compute those rows of the lm_head lazily, one
product each, or all in one product depends on what a row costs. In bfloat16 (or on a GPU) a
product's cost is reading the weights once (SmolLM2's 49k-row lm_head on 2 cores: 1 row 3.6 ms,
5 rows 4.4, 17 rows 6.8), so a walk that reaches two rows already costs more than all of them
together. On a CPU in float32 each row adds its own products (1 row 4.4 ms, 5 rows 10.5, 17 rows
13.5), so the first rows pay lazily; but a walk that goes on, as a long copy accepted whole does,
would pay a full row each: Gemma-3's 262k-row lm_head took 68 ms for 1 row, 200 ms for 5 and
318 ms for 33 in one product on an AVX2-only CPU, and 2 s a round row by row. So in float32 on a
CPU the first `LAZY_ROWS` rows are computed one at a time and, if the walk goes further, the rest
of the round in one product.
"""

from __future__ import annotations

import torch

LAZY_ROWS = 2  # products of one row each before the rest of the round is computed in one


def wide_products_cheap(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a product over many rows costs about what one row does: anywhere but float32 on a
    CPU, where each row adds its own products."""
    return dtype != torch.float32 or device.type != "cpu"


def all_rows_at_once(hidden: torch.Tensor) -> bool:
    """Whether one product over every row of `hidden` costs about what a single row does."""
    return wide_products_cheap(hidden.dtype, hidden.device)


class TargetChoices:
    """The target's argmax at row i of `hidden` (the final hidden states of a verify forward, (T, H)),
    computed on first use: all rows in one product where that costs about one row, else the first
    `LAZY_ROWS` rows reached one by one and then every later row together (a walk only goes
    forward: a chain's rows, or a tree's nodes, each after its parent)."""

    def __init__(self, lm_head, hidden: torch.Tensor):
        self.lm_head, self.hidden, self.lazy = lm_head, hidden, 0
        self.rows: dict[int, int] = {}
        if all_rows_at_once(hidden):
            self.from_row(0)

    def __len__(self) -> int:
        return len(self.hidden)

    def from_row(self, start: int) -> None:
        self.rows.update(enumerate(self.lm_head(self.hidden[start:]).argmax(-1).tolist(), start))

    def __getitem__(self, row: int) -> int:
        if row not in self.rows:
            if self.lazy < LAZY_ROWS:
                self.lazy += 1
                self.rows[row] = int(self.lm_head(self.hidden[row]).argmax())
            else:
                self.from_row(row)
        return self.rows[row]
