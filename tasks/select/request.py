"""`layerwave select`'s request: its options, declared once, and the check that finds the
analyses it reads.

Kept free of torch and Prefect at import, so building the command line stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import LayerwaveError
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import option
from tasks.select.selection import METHODS, Constraints


def comma_list(text: str) -> list[str]:
    return [method.strip() for method in text.split(",")]


def layer_range(text: str) -> tuple[int, int]:
    """"1:29" → (1, 29)."""
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise LayerwaveError(f"--layers {text!r} should be LOW:HIGH, e.g. 1:29") from None
    return low, high


@dataclass(frozen=True)
class SelectRequest:
    """Candidate layer sets for draft heads, from the stored analyses, baselines included."""

    model: str = option(DEFAULT_MODEL, "registry id (see `layerwave models`) or hf:PATH")
    store: str = option(DEFAULT_STORE, "Zarr store (directory or fsspec URL)")
    k: int = option(3, "layers per set")
    methods: list[str] | None = option(None, f"comma-separated subset of {','.join(METHODS)} (default: all)",
                                       type=comma_list)
    low: int = option(1, cli=False)  # the command line gives low and high together: --layers LOW:HIGH
    high: int | None = option(None, cli=False)
    min_gap: int = option(1, "smallest distance between two layers of a set")
    filter_key: str = option("all", "token filter whose analysis scores the sets", flag="--filter")
    seed: int = option(0, "seed of the random control sets")
    n_random: int = option(3, "number of random control sets", flag="--random")
    analyses: list[str] | None = option(None, "token filters whose analyses propose sets, comma-separated (default: "
                                              "every analysis in the store)", type=comma_list)

    def check(self) -> Selection:
        """Every mistake, before any flow starts; finds the filters with an analysis."""
        from store import paths
        from store.access import open_dataset
        from tasks.data.registry import store_key
        from tasks.select.select import analysis_filters
        from tasks.select.selection import check_methods

        key = store_key(self.model)
        filters = analysis_filters(self.store, key)
        if self.analyses is not None:
            missing = [name for name in self.analyses if name not in filters]
            if missing:
                raise LayerwaveError(f"no analysis with token filter {', '.join(missing)} for {key}; it has "
                                     f"{', '.join(filters)}: run `layerwave analyze` with that filter first")
            filters = [name for name in filters if name in self.analyses]
        if self.filter_key not in filters:
            raise LayerwaveError(f"no analysis with token filter {self.filter_key} for {key}; it has "
                                 f"{', '.join(filters)}: pass --filter with one of them")
        methods = list(self.methods or METHODS)
        check_methods(methods)
        constraints = Constraints(self.k, self.low, self.high, self.min_gap)
        constraints.allowed(open_dataset(self.store, paths.analysis(key, self.filter_key)).sizes["layer"])
        return Selection(self, key, filters, constraints, methods)


@dataclass(frozen=True)
class Selection:
    """A checked `SelectRequest`."""

    request: SelectRequest
    model_key: str
    filters: list[str]  # every token filter with an analysis (all are read)
    constraints: Constraints
    methods: list[str]
