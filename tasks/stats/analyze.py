"""The analysis stage's work, as the Prefect tasks flows/analyze.py calls in order: token masks,
the out-of-core Dask statistics pass, the measures, the plots, and the summary it returns.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from store import paths
from store.access import consolidate, is_local, open_dataset
from store.errors import LayerwaveError
from store.paths import Workspace
from store.read import open_activations
from store.stats_store import open_stats
from tasks.dask_cluster import connect
from tasks.progress import rate_eta
from tasks.report.plots import plot_cka, plot_entropy_vs_depth
from tasks.select.layer_ids import eagle3_default
from tasks.stats.analysis import measures_current, SetEntropy, set_h2_closed_form, write_measures
from tasks.stats.request import Analysis
from tasks.stats.stats_pass import accumulate_statistics, is_current
from tasks.stats.token_filter import TokenFilter, check_enough


def token_masks(store: str, model_key: str, filters: list[TokenFilter]) -> tuple[dict[str, np.ndarray], dict]:
    """Each filter's mask over the stored tokens, refusing filters that keep too few."""
    ds = open_activations(store, model_key)
    if ds.attrs["layout"].get("layers") is not None:
        raise LayerwaveError(f"store {store} holds only layers {ds.layer.values.tolist()} of {model_key} (a training "
                             "store); analysis needs every layer: extract into another --store with --layers all")
    entropy, position, doc = ds.entropy.values, ds.position.values, ds.doc.values
    masks = {f.key: f.mask(entropy, position, doc) for f in filters}
    check_enough(masks, len(entropy))
    layout = ds.attrs["layout"]
    return masks, {"plan_hash": ds.attrs["plan_hash"], "n_layers": layout["n_layers"], "d": layout["hidden_size"]}


@task(name="accumulate-statistics", cache_policy=NO_CACHE)
def accumulate_task(analysis: Analysis) -> dict:
    """The statistics of every filter whose stored ones are missing or stale, in one pass."""
    logger = get_run_logger()
    model_key, masks, source, config = analysis.model_key, analysis.masks, analysis.source, analysis.config
    store = analysis.request.store
    if config.dask_address and is_local(store):  # a cluster's workers start in their own folder
        store = os.path.abspath(store)
    shape = (source["n_layers"], source["d"])
    stale = {key: mask for key, mask in masks.items()
             if not is_current(open_stats(store, model_key, key), {"plan_hash": source["plan_hash"]}, *shape, config)}
    if not stale:
        logger.info("statistics for %s are current; no pass over activations needed", ", ".join(masks))
        return {"computed": [], "tokens_kept": {k: int(m.sum()) for k, m in masks.items()}}
    client = _dask_client(config.dask_address)
    scheduler = {} if client else {"scheduler": "threads", "num_workers": config.partitions}
    started = time.perf_counter()
    logger.info("statistics of %s over %s: one pass over the activations, tile by tile", model_key, ", ".join(stale))
    with client or contextlib.nullcontext():
        summary = accumulate_statistics(
            store, model_key, stale, config, {"plan_hash": source["plan_hash"]}, scheduler,
            progress=lambda done, total: logger.info("statistics tile %d/%d done%s", done, total,
                                                     rate_eta(done, total, time.perf_counter() - started)))
    consolidate(store)
    logger.info("statistics of %s: %s tiles over %d layer groups, %d features per layer%s", model_key,
                summary["tiles"], summary["layer_groups"], summary["features"], " (sketched)" * summary["sketched"])
    return {"computed": list(stale), "tokens_kept": {k: int(m.sum()) for k, m in masks.items()}, **summary}


def _dask_client(address: str | None):
    return connect(address, "compute locally") if address else None


@task(name="compute-measures", cache_policy=NO_CACHE)
def measures_task(store: str, model_key: str, filter_keys: list[str], alphas: list[float]) -> list[str]:
    """Write the `<model>/analysis/<filter>` Datasets that are missing or stale; returns the
    filters computed (none when every analysis is current)."""
    stale = [key for key in filter_keys if not measures_current(store, model_key, key, alphas)]
    for key in stale:
        write_measures(store, model_key, key, alphas)
    if stale:
        consolidate(store)
    else:
        get_run_logger().info("analyses %s are current", ", ".join(filter_keys))
    return stale


@task(name="plot-analysis", cache_policy=NO_CACHE)
def plots_task(store: str, model_key: str, filter_keys: list[str], asked: str) -> list[str]:
    """The PNGs beside the store (each drawn only if what it shows changed)."""
    folder = Workspace(store).reports(model_key)
    measures = {key: open_dataset(store, paths.analysis(model_key, key)).load() for key in filter_keys}
    files = [plot_entropy_vs_depth(measures, f"{model_key}: entropy vs depth", path=folder / "entropy_vs_depth.png"),
             plot_cka(measures[asked], f"{model_key}: layer similarity", path=folder / f"cka_{asked}.png")]
    return [str(path) for path in files]


def analysis_summary(store: str, model_key: str, asked: str, tokens_kept: dict, sets, plots: list[str]) -> dict:
    """The JSON-ready summary for the filter asked: per-layer entropies, CKA, and layer-set scores."""
    ds = open_dataset(store, paths.analysis(model_key, asked)).load()
    default = eagle3_default(ds.sizes["layer"] - 1)
    candidate_sets = ([default] if default else []) + [list(s) for s in (sets or []) if list(s) != default]
    entropy = SetEntropy(store, model_key, asked)
    scored = [{"layers": s, "h1": entropy(s),
               "h2_closed_form": set_h2_closed_form(ds, s)} for s in candidate_sets]
    return {
        "model": model_key, "filter": asked, "layers": ds.layer.values.tolist(), "tokens_kept": int(ds.attrs["tokens_kept"]),
        "tokens_kept_per_filter": tokens_kept, "entropy_h1": ds.entropy_h1.values.tolist(),
        "entropy_h2": ds.entropy_h2.values.tolist(), "normalized_entropy": ds.normalized_entropy.values.tolist(),
        "effective_rank": ds.effective_rank.values.tolist(), "cka": ds.cka.values.tolist(),
        "cka_debiased": ds.cka_debiased.values.tolist(), "sets": scored, "plots": plots,
        "statistics_group": paths.stats(model_key, asked),
    }
