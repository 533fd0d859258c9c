"""The selection stage's work: which analyses exist, the request checked, candidate layer sets
proposed and written to the store as an xarray Dataset, and read back.
"""

from __future__ import annotations

import functools

import numpy as np
import xarray as xr
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from store import paths
from store.access import check_schema, consolidate, open_dataset, open_existing
from store.errors import LayerwaveError
from tasks.select.request import Selection
from tasks.select.selection import Candidate, Constraints, LayerScores, propose
from tasks.stage_key import group_is_current, mark_group_current, stage_key
from tasks.stats.analysis import SetEntropy


def analysis_filters(store: str, model_key: str) -> list[str]:
    """Filters with a finished analysis, `all`-like references first; says which command to run if none."""
    check_schema(store)
    group = open_existing(store, paths.analysis(model_key))
    keys = sorted(name for name, _ in group.groups()) if group is not None else []
    if not keys:
        raise LayerwaveError(f"no analysis for {model_key} in {store}; run "
                             f"`layerwave analyze --model {model_key} --store {store}` first")
    return sorted(keys, key=lambda key: (not key.startswith("all"), key))


def load_scores(store: str, model_key: str, keys: list[str]) -> dict[str, LayerScores]:
    return {key: LayerScores.from_dataset(open_dataset(store, paths.analysis(model_key, key))) for key in keys}


def selection_key(store: str, model_key: str, filters: list[str], constraints: Constraints, methods: list[str],
                  seed: int, n_random: int) -> str:
    """The selection's inputs: every analysis it reads (by their own keys) and the request."""
    analyses = {key: open_existing(store, paths.analysis(model_key, key)).attrs.get("stage_key") for key in filters}
    return stage_key(analyses, constraints, sorted(methods), seed, n_random)


@task(name="propose-layer-sets", cache_policy=NO_CACHE)
def propose_task(selection: Selection) -> str:
    """Write `<model>/selection/<reference>` unless it is current; returns its group path."""
    r = selection.request
    store, model_key, reference, seed, n_random = r.store, selection.model_key, r.filter_key, r.seed, r.n_random
    filters, constraints, methods = selection.filters, selection.constraints, selection.methods
    path = paths.selection(model_key, reference)
    key = selection_key(store, model_key, filters, constraints, methods, seed, n_random)
    if group_is_current(store, path, key):
        get_run_logger().info("selection %s is current", path)
        return path
    entropies = functools.cache(lambda key: SetEntropy(store, model_key, key))  # each group opened once
    candidates = propose(load_scores(store, model_key, filters), reference, constraints, methods,
                         lambda key, layers: entropies(key)(layers), seed, n_random)
    score_names = list(candidates[0].scores)
    ds = xr.Dataset(
        {"layers": (("candidate", "slot"), np.array([c.layers for c in candidates], dtype=np.int32)),
         "methods": ("candidate", np.array([",".join(c.methods) for c in candidates], dtype=object)),
         **{name: ("candidate", np.array([c.scores[name] for c in candidates])) for name in score_names}},
        coords={"candidate": np.arange(len(candidates))},
        attrs={"k": constraints.k, "low": constraints.low, "high": constraints.high if constraints.high is not None
               else -1, "min_gap": constraints.min_gap, "scored_on_filter": reference, "seed": seed,
               "layer_convention": "HF hidden_states index (see activations attrs)"},
    )
    ds.to_zarr(store, group=path, mode="w", consolidated=False)
    mark_group_current(store, path, key)
    consolidate(store)
    return path


def candidates_from(ds: xr.Dataset) -> list[Candidate]:
    """The stored selection back as the candidates `propose` made."""
    scores = [name for name in ds.data_vars if name not in ("layers", "methods")]
    return [Candidate(ds.layers.values[i].tolist(), str(ds.methods.values[i]).split(","),
                      {name: float(ds[name].values[i]) for name in scores}) for i in range(ds.sizes["candidate"])]
