"""The shape of an EAGLE-2 draft tree, apart from the decoding (no torch), so that requests can
name its defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeShape:
    """How wide a tree is: `topk` children expanded per node and frontier, `tokens` kept in all.
    Its depth is the evaluation's --depth, so topk = 1 and tokens = depth is the chain.

    The defaults suit a memory-bound CPU, where verifying 33 tokens costs about 2.5 single-token
    steps: 4x16 beat 8x32 and 2x6 in benchmarks/out/evaluate-trees.json. A GPU verifies 60 tokens
    for about the price of one, and wider trees (EAGLE-2 uses 10x60) pay off there."""

    topk: int = 4
    tokens: int = 16
