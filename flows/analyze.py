"""The analysis flow: one Dask pass of sufficient statistics → measures → plots.

Statistics already made from the same activations are reused, so re-running with another α or
layer set reads only the small stored statistics.
"""

from __future__ import annotations

from prefect import flow

from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import checked
from tasks.stats.analyze import accumulate_task, analysis_summary, measures_task, plots_task
from tasks.stats.request import AnalyzeRequest


@flow(name="layerwave-analyze")
def analyze(
    model: str = DEFAULT_MODEL,
    store: str = DEFAULT_STORE,
    entropy_threshold: float = 0.0,
    entropy_quantile: float | None = None,
    drop_first_token: bool = False,
    alphas: list[float] | None = None,
    sets: list[list[int]] | None = None,
    memory_gb: float = 4.0,
    partitions: int = 2,
    sketch_dim: int | None = None,
    dask_address: str | None = None,
) -> dict:
    """Entropy and CKA of every layer of `model`'s stored activations, for all and for filtered tokens.
    The parameters are `AnalyzeRequest`'s fields."""
    analysis = checked(AnalyzeRequest(model, store, entropy_threshold, entropy_quantile, drop_first_token, alphas,
                                      sets, memory_gb, partitions, sketch_dim, dask_address))
    key = analysis.model_key
    stats = accumulate_task(analysis)
    filter_keys = [f.key for f in analysis.filters]
    asked = filter_keys[-1]
    computed = measures_task(store, key, filter_keys, alphas or [1.0, 2.0])
    plots = plots_task(store, key, filter_keys, asked)
    return {**analysis_summary(store, key, asked, stats["tokens_kept"], analysis.sets, plots),
            "computed": {"statistics": stats["computed"], "measures": computed}}
