"""The selection flow: read the analysis, propose candidate layer sets, store them with scores."""

from __future__ import annotations

from prefect import flow, get_run_logger

from store.access import open_dataset
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import checked
from tasks.select.request import SelectRequest
from tasks.select.select import candidates_from, propose_task
from tasks.select.selection import Candidate


@flow(name="layerwave-select")
def select(model: str = DEFAULT_MODEL, store: str = DEFAULT_STORE, k: int = 3, methods: list[str] | None = None,
           low: int = 1, high: int | None = None, min_gap: int = 1, filter_key: str = "all", seed: int = 0,
           n_random: int = 3, analyses: list[str] | None = None) -> list[Candidate]:
    """Candidate layer sets for draft heads, best aggregate entropy first, baselines included. The
    parameters are `SelectRequest`'s fields."""
    selection = checked(SelectRequest(model, store, k, methods, low, high, min_gap, filter_key, seed, n_random,
                                       analyses))
    key = selection.model_key
    path = propose_task(selection)
    ds = open_dataset(store, path).load()
    get_run_logger().info("%d candidate sets for %s stored in %s", ds.sizes["candidate"], key, path)
    return candidates_from(ds)
