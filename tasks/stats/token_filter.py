"""Token filters: which tokens the statistics use (the same mask for every layer)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from store.errors import LayerwaveError

MIN_TOKENS = 4  # unbiased HSIC divides by n(n-3)


@dataclass(frozen=True)
class TokenFilter:
    """Keep tokens whose predictive entropy is ≥ `threshold` nats, or in the top (1 − quantile)."""

    threshold: float = 0.0
    quantile: float | None = None
    drop_first_token: bool = False

    @property
    def key(self) -> str:
        """Path-safe name of the filter, used as the group name of its statistics."""
        if self.quantile is not None:
            name = f"quantile-ge-{_exact(self.quantile)}"
        elif self.threshold > 0:
            name = f"entropy-ge-{_exact(self.threshold)}"
        else:
            name = "all"
        return name + ("-drop-first" if self.drop_first_token else "")

    def mask(self, entropy: np.ndarray, position: np.ndarray, doc: np.ndarray) -> np.ndarray:
        keep = doc >= 0  # padding at a shard's end is no token of any document
        if self.drop_first_token:
            keep &= position != 0
        threshold = self.threshold
        if self.quantile is not None:
            if not 0 <= self.quantile < 1:
                raise LayerwaveError(f"--entropy-quantile must be in [0, 1) (got {self.quantile})")
            threshold = float(np.quantile(entropy[keep], self.quantile)) if keep.any() else np.inf
        if threshold > 0:
            keep &= entropy >= threshold
        return keep


def _exact(value: float) -> str:
    """Short (2, 0.5) where that reads back as the same number, else every digit needed: two
    filters never share a name, and so never each other's statistics (2.5 and 2.5000004)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def filters_for(threshold: float, quantile: float | None, drop_first_token: bool) -> list[TokenFilter]:
    """`all` always (the reference), plus the filter asked for when it is not `all`."""
    if threshold < 0:
        raise LayerwaveError(f"--entropy-threshold must be ≥ 0 nats (got {threshold})")
    if threshold > 0 and quantile is not None:
        raise LayerwaveError("give --entropy-threshold or --entropy-quantile, not both (a token filter keeps tokens "
                             "by one of them)")
    asked = TokenFilter(threshold, quantile, drop_first_token)
    reference = TokenFilter(drop_first_token=drop_first_token)
    return [reference] if asked == reference else [reference, asked]


def check_enough(masks: dict[str, np.ndarray], total: int) -> None:
    for key, mask in masks.items():
        kept = int(mask.sum())
        if kept < MIN_TOKENS:
            raise LayerwaveError(
                f"token filter {key} keeps {kept} of {total} tokens; at least {MIN_TOKENS} are needed "
                "(lower --entropy-threshold/--entropy-quantile or extract more --tokens)"
            )
