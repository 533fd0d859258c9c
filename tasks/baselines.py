"""The layer sets every framework hard-codes, in HF hidden_states indices (DESIGN.md convention)."""

from __future__ import annotations


def eagle3_default(num_hidden_layers: int) -> list[int] | None:
    """[2, N//2, N-3] for a model with N decoder layers; None when those are not 3 distinct layers."""
    n = num_hidden_layers
    layers = [2, n // 2, n - 3]
    return layers if len(set(layers)) == 3 and min(layers) >= 1 else None
