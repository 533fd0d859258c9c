"""Sufficient statistics of layer activations for one tile of layer pairs, chunk by chunk.

A tile pairs a group of row layers with a group of column layers. Over the kept tokens of each
chunk, with every layer shifted by a provisional mean (its first shard's mean, so float64 sums
stay accurate), it accumulates:
  n, s_l = Σ x_l, G_lm = Σ x_l x_mᵀ, t_l = Σ ‖x_l‖²,
  and for debiased CKA  Q_lm = Σ ‖x_l‖²‖x_m‖²,  R_lm = Σ ‖x_l‖² x_m,  R'_ml = Σ ‖x_m‖² x_l.
Chunk products run in float32 (BLAS speed) and are added into float64 accumulators. Partial
moments of disjoint token ranges simply add, so Dask can reduce them in any order.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass
class TileMoments:
    count: np.ndarray  # () int64
    row_sums: np.ndarray  # (Lr, d)
    col_sums: np.ndarray  # (Lc, d)
    row_sq: np.ndarray  # (Lr,)
    col_sq: np.ndarray  # (Lc,)
    cross: np.ndarray  # (Lr*d, Lc*d)
    q_cross: np.ndarray  # (Lr, Lc)
    r_row_col: np.ndarray  # (Lr, Lc, d): Σ ‖x_l‖² x_m
    r_col_row: np.ndarray  # (Lc, Lr, d): Σ ‖x_m‖² x_l

    @classmethod
    def zeros(cls, n_rows: int, n_cols: int, d: int) -> "TileMoments":
        return cls(np.zeros((), np.int64), np.zeros((n_rows, d)), np.zeros((n_cols, d)), np.zeros(n_rows),
                   np.zeros(n_cols), np.zeros((n_rows * d, n_cols * d)), np.zeros((n_rows, n_cols)),
                   np.zeros((n_rows, n_cols, d)), np.zeros((n_cols, n_rows, d)))

    def __add__(self, other: "TileMoments") -> "TileMoments":
        return TileMoments(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def accumulate(moments: TileMoments, rows: np.ndarray, cols: np.ndarray | None) -> None:
    """Add one chunk: `rows` (Lr, T, d) and `cols` (Lc, T, d) shifted float32 activations of the
    kept tokens; `cols=None` for a diagonal tile (rows paired with themselves)."""
    tokens = rows.shape[1]
    if tokens == 0:
        return
    diagonal = cols is None
    cols = rows if diagonal else cols
    moments.count += tokens
    moments.row_sums += rows.sum(axis=1, dtype=np.float64)
    moments.col_sums += cols.sum(axis=1, dtype=np.float64)
    left = _concat_features(rows)
    right = left if diagonal else _concat_features(cols)
    moments.cross += left.T @ right  # for A.T @ A numpy runs a symmetric rank-k update
    q_rows = np.einsum("ltd,ltd->lt", rows, rows)
    q_cols = q_rows if diagonal else np.einsum("ltd,ltd->lt", cols, cols)
    moments.row_sq += q_rows.sum(axis=1, dtype=np.float64)
    moments.col_sq += q_cols.sum(axis=1, dtype=np.float64)
    moments.q_cross += q_rows.astype(np.float64) @ q_cols.T.astype(np.float64)
    moments.r_row_col += np.einsum("lt,mtd->lmd", q_rows, cols)
    moments.r_col_row += np.einsum("mt,ltd->mld", q_cols, rows)


def _concat_features(block: np.ndarray) -> np.ndarray:
    """(L, T, d) → (T, L·d): the concatenation [x_1 … x_L] per token."""
    layers, tokens, d = block.shape
    return np.ascontiguousarray(block.transpose(1, 0, 2)).reshape(tokens, layers * d)
