"""`layerwave analyze`'s request: its options, declared once, and the check that builds the token
masks once (the statistics pass reuses them).

Kept free of torch and Prefect at import, so building the command line stays fast; the check
imports what it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from store.errors import LayerwaveError
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import option
from tasks.select.layer_ids import parse_layers


@dataclass(frozen=True)
class AnalyzeRequest:
    """Entropy and CKA of every stored layer, for all tokens and for filtered ones (one Dask pass)."""

    model: str = option(DEFAULT_MODEL, "registry id (see `layerwave models`) or hf:PATH")
    store: str = option(DEFAULT_STORE, "Zarr store (directory or fsspec URL)")
    entropy_threshold: float = option(0.0, "keep tokens whose predictive entropy is >= NATS (0 keeps all)")
    entropy_quantile: float | None = option(None, "keep tokens at or above this entropy quantile")
    drop_first_token: bool = option(False, "drop each document's first token")
    alphas: list[float] | None = option(None, "extra Rényi orders (1 and 2 always)", flag="--alpha", type=float,
                                        action="append")
    sets: list[list[int]] | None = option(None, "layer set to score, e.g. 2,15,27 (repeatable)", flag="--set",
                                          type=parse_layers, action="append")
    memory_gb: float = option(4.0, "memory the statistics pass may use")
    partitions: int = option(2, "Dask tasks per layer tile (parallelism)")
    sketch_dim: int | None = option(None, "project each layer to this many features (default: exact unless the "
                                    "covariance blocks would exceed 4 GiB)")
    dask_address: str | None = option(None, "run on an existing Dask cluster, e.g. tcp://127.0.0.1:8786")

    def check(self) -> Analysis:
        """Every mistake, before the statistics pass; resolves the filters and builds their masks."""
        from store.access import check_schema
        from tasks.data.registry import store_key
        from tasks.select.layer_ids import check_layers
        from tasks.stats.analyze import token_masks
        from tasks.stats.stats_pass import PassConfig
        from tasks.stats.token_filter import filters_for

        for name, value in (("--memory-gb", self.memory_gb), ("--partitions", self.partitions),
                            ("--sketch-dim", self.sketch_dim)):
            if value is not None and not value > 0:
                raise LayerwaveError(f"{name} must be above 0 (got {value})")
        for alpha in self.alphas or []:
            if not 0 <= alpha < math.inf:  # NaN fails this too
                raise LayerwaveError(f"--alpha is a Rényi order, a finite number >= 0 (got {alpha})")
        key = store_key(self.model)
        check_schema(self.store)
        filters = filters_for(self.entropy_threshold, self.entropy_quantile, self.drop_first_token)
        masks, source = token_masks(self.store, key, filters)
        sets = [check_layers(s, source["n_layers"]) for s in self.sets or []]
        config = PassConfig(int(self.memory_gb * (1 << 30)), self.partitions, self.sketch_dim, self.dask_address)
        return Analysis(self, key, filters, masks, source, sets, config)


@dataclass(frozen=True)
class Analysis:
    """A checked `AnalyzeRequest`."""

    request: AnalyzeRequest
    model_key: str
    filters: list  # TokenFilter, the asked one last
    masks: dict[str, Any]  # filter key → boolean mask over the stored tokens
    source: dict  # plan_hash, n_layers, d of the activations
    sets: list[list[int]]
    config: Any  # tasks.stats.stats_pass.PassConfig
