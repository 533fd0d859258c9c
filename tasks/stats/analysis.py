"""Measures from stored statistics, as xarray Datasets: per-layer entropy, CKA, set entropy.

No pass over activations happens here: everything reads `<model>/stats/<filter>`.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
import zarr

from store import paths
from store.errors import LayerwaveError
from store.stats_store import BlockReader, open_stats, require_stats
from tasks.select.layer_ids import check_layers
from tasks.stage_key import group_is_current, mark_group_current, stage_key
from tasks.stats.measures import (aggregate_covariance, debiased_cka, h2_from_frobenius, h2_subset_closed_form,
                                  linear_cka, renyi_entropy, spectrum)


def layer_measures(store: str, model_key: str, filter_key: str, alphas=(1.0, 2.0)) -> xr.Dataset:
    """Per-layer Rényi entropies, normalised entropy, effective rank, and both CKA matrices."""
    group = require_stats(store, model_key, filter_key)
    n, features = int(group.attrs["tokens_kept"]), int(group.attrs["features"])
    trace, frobenius2 = group["trace"][:], group["frobenius2"][:]
    blocks = BlockReader(group)
    n_layers = len(trace)
    alphas = orders(alphas)
    renyi = np.empty((n_layers, len(alphas)))
    for layer in range(n_layers):
        eigenvalues = spectrum(blocks(layer, layer), n)
        renyi[layer] = [renyi_entropy(eigenvalues, alpha) for alpha in alphas]
    h1 = renyi[:, alphas.index(1.0)]
    h2_exact = np.array([h2_from_frobenius(frobenius2[l, l], trace[l]) for l in range(n_layers)])
    layers = np.arange(n_layers)
    return xr.Dataset(
        {
            "entropy": (("layer", "alpha"), renyi, {"units": "nats", "description": "Rényi matrix entropy H_α"}),
            "entropy_h1": ("layer", h1, {"units": "nats"}),
            "entropy_h2": ("layer", h2_exact, {"units": "nats", "description": "−ln(‖C‖_F²/tr(C)²)"}),
            "normalized_entropy": ("layer", h1 / np.log(min(n, features)), {"description": "H_1 / ln min(N, d)"}),
            "effective_rank": ("layer", np.exp(h1), {"description": "exp(H_1)"}),
            "cka": (("layer", "layer2"), linear_cka(frobenius2)),
            "cka_debiased": (("layer", "layer2"), debiased_cka(group["hsic"][:])),
        },
        coords={"layer": layers, "layer2": layers, "alpha": alphas},
        attrs={"tokens_kept": n, "tokens_total": int(group.attrs["tokens_total"]), "filter": filter_key,
               "features": features, "sketch_dim": group.attrs.get("sketch_dim")},
    )


def orders(alphas) -> list[float]:
    """The Rényi orders computed: those asked for, plus 1 and 2 always."""
    return sorted(set(float(a) for a in alphas) | {1.0, 2.0})


def analysis_key(stats: zarr.Group, alphas) -> str:
    """What an analysis is made from: its statistics (activations, filter, features) and orders."""
    return stage_key({k: stats.attrs.get(k) for k in ("source", "filter", "tokens_kept", "features", "sketch_dim")},
                     orders(alphas))


def write_measures(store: str, model_key: str, filter_key: str, alphas) -> None:
    """`<model>/analysis/<filter>`, with its stage key written last so a killed write never looks current."""
    path = paths.analysis(model_key, filter_key)
    layer_measures(store, model_key, filter_key, alphas).to_zarr(store, group=path, mode="w", consolidated=False)
    mark_group_current(store, path, analysis_key(require_stats(store, model_key, filter_key), alphas))


def measures_current(store: str, model_key: str, filter_key: str, alphas) -> bool:
    """True when `<model>/analysis/<filter>` was computed from the current statistics with these orders."""
    stats = open_stats(store, model_key, filter_key)
    return stats is not None and group_is_current(store, paths.analysis(model_key, filter_key),
                                                  analysis_key(stats, alphas))


class SetEntropy:
    """Entropy of concatenated layer sets of one statistics group, opened once: a selection scores
    many sets, and on an object store every group open and block read is a request."""

    def __init__(self, store: str, model_key: str, filter_key: str):
        group = require_stats(store, model_key, filter_key)
        self._trace, self._tokens = group["trace"][:], int(group.attrs["tokens_kept"])
        self._blocks = BlockReader(group)

    def __call__(self, layers, alpha: float = 1.0, normalization: str = "trace") -> float:
        """Each layer scaled to unit trace by default, as a learned fc layer can rescale them;
        `normalization="raw"` keeps their own scale."""
        layers = check_layers(layers, len(self._trace))
        constant = [layer for layer in layers if not self._trace[layer] > 0]
        if constant:
            raise LayerwaveError(f"layers {constant} do not vary over the kept tokens (zero variance): a set holding "
                                 "them has no entropy; leave them out")
        if normalization == "trace":
            weights = 1 / np.sqrt(self._trace[layers])
        elif normalization == "raw":
            weights = np.ones(len(layers))
        else:
            raise LayerwaveError(f"unknown normalization {normalization!r}; use trace or raw")
        covariance = aggregate_covariance(self._blocks, layers, weights)
        return renyi_entropy(spectrum(covariance, self._tokens), alpha)


def set_entropy(store: str, model_key: str, filter_key: str, layers, alpha: float = 1.0,
                normalization: str = "trace") -> float:
    """Entropy of the concatenation of `layers` (see SetEntropy)."""
    return SetEntropy(store, model_key, filter_key)(layers, alpha, normalization)


def set_h2_closed_form(measures: xr.Dataset, layers) -> float:
    layers = check_layers(layers, measures.sizes["layer"])
    return h2_subset_closed_form(measures.cka.values, measures.entropy_h2.values, layers)
