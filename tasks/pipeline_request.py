"""`layerwave run`'s request: the whole pipeline for one model, its options declared once, and the
check that resolves the preset, the store and the corpus before any stage runs.

Kept free of torch and Prefect at import, so building the command line stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import LayerwaveError
from tasks.names import DEFAULT_MODEL
from tasks.request import option


@dataclass(frozen=True)
class RunRequest:
    """Extract, analyse, select, train, evaluate and report one model (re-runs skip finished stages)."""

    model: str = option(DEFAULT_MODEL, "registry id (see `layerwave models`) or hf:PATH")
    preset: str = option("quick", "smoke (tiny model, minutes), quick (smollm2-135m on a CPU), study (the "
                         "published comparison, hours), full (GPU)")
    store: str | None = option(None, "Zarr store (default: the preset's, e.g. layerwave.zarr for quick)")
    limit: int | None = option(None, "train and evaluate at most this many candidate sets")
    corpus: str | None = option(None, "extract this corpus instead of the target's own replies to ShareGPT "
                                "prompts (e.g. sharegpt, as the published SmolLM2 study did)")
    warm_start: bool | None = option(None, "heads start from the target's lm_head and final norm (default: the "
                                     "preset's, off)")
    workers: int | None = option(None, "train each round's heads side by side on a local Dask cluster of this "
                                 "many worker processes, the cores shared out among them (default: one after "
                                 "another in this process)")
    dask_address: str | None = option(None, "train each round's heads on an existing Dask cluster, a head per "
                                      "worker at a time, e.g. tcp://scheduler:8786 (the store on storage every "
                                      "worker reads)")

    def check(self) -> Run:
        """A pipeline request's mistakes, before any stage runs; resolves the preset's defaults."""
        from tasks.data.corpus import load_corpus
        from tasks.data.registry import resolve
        from tasks.pipeline_presets import pipeline_preset, preset_store
        from tasks.pipeline_stages import corpus_for

        p = pipeline_preset(self.preset)
        if self.limit is not None and self.limit < 1:
            raise LayerwaveError(f"--limit must be at least 1 (got {self.limit})")
        if self.workers is not None and self.workers < 1:
            raise LayerwaveError(f"--workers must be at least 1 (got {self.workers}); leave it out to train heads "
                                 "one after another")
        if self.workers and self.dask_address:
            raise LayerwaveError("give --workers (a local cluster) or --dask-address (an existing one), not both")
        if self.dask_address:
            from tasks.dask_cluster import reachable

            reachable(self.dask_address, "train heads one after another in this process")
        key = resolve(self.model).key  # an unknown model fails here, with the list of known ones
        if self.corpus is not None:
            load_corpus(self.corpus)
        store = preset_store(self.preset, self.store)
        return Run(self, key, p, store, corpus_for(store, key, p, self.corpus),
                   p.warm_start if self.warm_start is None else self.warm_start)


@dataclass(frozen=True)
class HeadScore:
    """One trained head's τ on one benchmark, as the pipeline's run scored it."""

    layers: list[int]
    seed: int
    bench: str
    tau: float
    speedup: float | None  # None when replayed: the target did not run
    reused: bool  # an earlier run scored it from the same inputs


@dataclass(frozen=True)
class PipelineResult:
    """What `layerwave run` made: the report, its rows, and every head's score."""

    model: str
    preset: str
    store: str
    report: str
    rows: list[dict]  # the report's result rows (results.json)
    evaluated: list[HeadScore]


@dataclass(frozen=True)
class Run:
    """A checked `RunRequest`."""

    request: RunRequest
    model_key: str
    preset: object  # tasks.pipeline_presets.PipelinePreset
    store: str
    corpus: str  # what the store is extracted from (regen:DIR when the pipeline generates it)
    warm_start: bool

    @property
    def training_store(self) -> str:
        """What heads train on: the store itself, or the preset's store of the candidates' layers."""
        return self.preset.training_store(self.store)

    @property
    def dtype(self) -> str:
        """Compute dtype of generation and extraction on this machine (the preset's `data_dtype`)."""
        from tasks.data.load_model import pick_device
        return self.preset.data_dtype(pick_device("auto"))
