"""Matrix entropy and CKA from sufficient statistics (formulas in DESIGN.md, "Statistics").

Everything here is plain numpy on small arrays: covariance blocks and per-pair scalars.
"""

from __future__ import annotations

import numpy as np

from tasks.stats.moments import TileMoments


def centered(cross: np.ndarray, sums_left: np.ndarray, sums_right: np.ndarray, n: int) -> np.ndarray:
    """Σ (x_l − μ_l)(x_m − μ_m)ᵀ from raw sums (the shift cancels)."""
    return cross - np.outer(sums_left, sums_right) / n


def tile_pairs(moments: TileMoments, rows: list[int], cols: list[int], d: int):
    """Yield (l, m, centred block C_lm, ‖C_lm‖_F², unbiased HSIC_lm) for every pair of the tile."""
    n = int(moments.count)
    for i, left in enumerate(rows):
        for j, right in enumerate(cols):
            raw = moments.cross[i * d:(i + 1) * d, j * d:(j + 1) * d]
            block = centered(raw, moments.row_sums[i], moments.col_sums[j], n)
            yield left, right, block, float(np.sum(block * block)), unbiased_hsic(
                n=n, raw=raw, sum_left=moments.row_sums[i], sum_right=moments.col_sums[j],
                sq_left=moments.row_sq[i], sq_right=moments.col_sq[j], q_cross=moments.q_cross[i, j],
                r_left_right=moments.r_row_col[i, j], r_right_left=moments.r_col_row[j, i])


def unbiased_hsic(*, n, raw, sum_left, sum_right, sq_left, sq_right, q_cross, r_left_right, r_right_left) -> float:
    """Song et al. (2012) unbiased HSIC of linear kernels K = XXᵀ, L = YYᵀ, from feature-space sums.

    With zero-diagonal Grams K̃, L̃:  tr(K̃L̃) = ‖XᵀY‖² − Σ‖x‖²‖y‖²,  1ᵀK̃1 = ‖Σx‖² − Σ‖x‖²,
    1ᵀK̃L̃1 = (Σx)ᵀXᵀY(Σy) − Σy·Σ‖x‖²y − Σx·Σ‖y‖²x + Σ‖x‖²‖y‖². The estimator is invariant to
    the provisional shift, so shifted sums give the same value.
    """
    if n < 4:
        return float("nan")
    trace_kl = float(np.sum(raw * raw)) - q_cross
    ones_k = float(sum_left @ sum_left) - sq_left
    ones_l = float(sum_right @ sum_right) - sq_right
    ones_kl = float(sum_left @ raw @ sum_right) - float(sum_right @ r_left_right) - float(sum_left @ r_right_left) + q_cross
    return (trace_kl + ones_k * ones_l / ((n - 1) * (n - 2)) - 2 * ones_kl / (n - 2)) / (n * (n - 3))


def spectrum(covariance: np.ndarray, n: int) -> np.ndarray:
    """Eigenvalues of a covariance, dropping those below λ_max·max(n, d)·eps (numerical zeros)."""
    eigenvalues = np.linalg.eigvalsh(covariance)
    cutoff = eigenvalues.max(initial=0.0) * max(n, covariance.shape[0]) * np.finfo(np.float64).eps
    return eigenvalues[eigenvalues > cutoff]


def renyi_entropy(eigenvalues: np.ndarray, alpha: float) -> float:
    """Rényi entropy (nats) of the normalised spectrum; α = 1 is von Neumann/Shannon. NaN for an
    empty spectrum (a layer that does not vary: no distribution to measure)."""
    if not eigenvalues.size:
        return float("nan")
    p = eigenvalues / eigenvalues.sum()
    if alpha == 1:
        return float(-(p * np.log(p)).sum())
    if np.isinf(alpha):
        return float(-np.log(p.max()))
    return float(np.log((p ** alpha).sum()) / (1 - alpha))


def h2_from_frobenius(frobenius2: float, trace: float) -> float:
    """H_2 = −ln(‖C‖_F² / tr(C)²), no eigendecomposition needed; NaN for a layer that does not vary."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(-np.log(frobenius2 / trace**2))


def linear_cka(frobenius2: np.ndarray) -> np.ndarray:
    """CKA_lm = ‖C_lm‖_F² / (‖C_ll‖_F ‖C_mm‖_F) from the matrix of squared Frobenius norms."""
    norms = np.sqrt(np.diag(frobenius2))
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN beside a layer that does not vary
        return frobenius2 / np.outer(norms, norms)


def debiased_cka(hsic: np.ndarray) -> np.ndarray:
    scale = np.sqrt(np.clip(np.diag(hsic), 0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        return hsic / np.outer(scale, scale)


def aggregate_covariance(block, layers: list[int], weights: np.ndarray) -> np.ndarray:
    """The covariance of the concatenation [w_l x_l], l ∈ layers, from a block getter C(l, m)."""
    rows = []
    for i, left in enumerate(layers):
        rows.append([weights[i] * weights[j] * block(left, right) for j, right in enumerate(layers)])
    return np.block(rows)


def h2_closed_form(cka: np.ndarray, h2: np.ndarray, subsets: np.ndarray) -> np.ndarray:
    """H_2 of trace-normalised concatenations, for many equal-size subsets (S, k) at once:
    2 ln k − ln Σ_{l,m∈S} CKA_lm √(π_l π_m), π = e^{−H_2}."""
    root_pi = np.exp(-h2 / 2)
    weighted = cka * np.outer(root_pi, root_pi)
    total = weighted[subsets[:, :, None], subsets[:, None, :]].sum(axis=(1, 2))
    return 2 * np.log(subsets.shape[1]) - np.log(total)


def h2_subset_closed_form(cka: np.ndarray, h2: np.ndarray, layers) -> float:
    return float(h2_closed_form(cka, h2, np.asarray(layers, dtype=np.int64)[None])[0])


def h2_all_subsets(cka: np.ndarray, h2: np.ndarray, layers, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(subsets (S, k), H_2 (S,)) of every k-subset of `layers` via the closed form, vectorised."""
    from itertools import combinations

    subsets = np.array(list(combinations(layers, k)), dtype=np.int64).reshape(-1, k)
    return subsets, h2_closed_form(cka, h2, subsets)
