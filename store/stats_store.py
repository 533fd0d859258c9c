"""Sufficient statistics in the store: `<model>/stats/<filter>`, written once, read by every query.

Covariance blocks C_lm (centred, float64) are kept for l ≤ m only (C_ml = C_lmᵀ); the per-pair
scalars every measure needs are small arrays beside them. `complete` is written last.
"""

from __future__ import annotations

import numpy as np
import zarr

from store import paths
from store.access import open_existing, open_group
from store.errors import LayerwaveError


def create_stats_group(store: str, model_key: str, filter_key: str, n_layers: int, d: int) -> zarr.Group:
    """A fresh, empty statistics group (replacing any earlier one for this filter)."""
    root = open_group(store, mode="a")
    path = paths.stats(model_key, filter_key)
    if path in root:
        del root[path]
    group = root.require_group(path)
    group.create_array("covariance", shape=(n_layers, n_layers, d, d), chunks=(1, 1, d, d), dtype="float64",
                       fill_value=float("nan"), dimension_names=["layer", "layer2", "feature", "feature2"],
                       attributes={"description": "centred Σ(x_l−μ_l)(x_m−μ_m)ᵀ over kept tokens; only l ≤ m written"})
    for name, dims in (("frobenius2", ["layer", "layer2"]), ("hsic", ["layer", "layer2"]), ("trace", ["layer"]),
                       ("mean", ["layer", "feature"])):
        shape = tuple(n_layers if dim.startswith("layer") else d for dim in dims)
        group.create_array(name, shape=shape, dtype="float64", fill_value=float("nan"), dimension_names=dims)
    return group


def open_stats(store: str, model_key: str, filter_key: str) -> zarr.Group | None:
    """The complete statistics group, or None when missing or interrupted."""
    group = open_existing(store, paths.stats(model_key, filter_key))
    return group if group is not None and group.attrs.get("complete") else None


def require_stats(store: str, model_key: str, filter_key: str) -> zarr.Group:
    group = open_stats(store, model_key, filter_key)
    if group is None:
        raise LayerwaveError(f"no statistics for {model_key} with token filter {filter_key} in {store}; "
                             f"run `layerwave analyze --model {model_key} --store {store}` with that filter")
    return group


class BlockReader:
    """C_lm for any pair, read from the upper triangle and cached (subset queries reuse blocks)."""

    def __init__(self, group: zarr.Group):
        self._array = group["covariance"]
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, left: int, right: int) -> np.ndarray:
        low, high = min(left, right), max(left, right)
        if (low, high) not in self._cache:
            self._cache[(low, high)] = self._array[low, high]
        block = self._cache[(low, high)]
        return block if left <= right else block.T
