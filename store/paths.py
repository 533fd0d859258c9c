"""Where everything lives: every group inside a store and every artefact beside it, in one place.

Inside the store, one group per model: `<model>/activations`, `<model>/stats/<filter>`,
`<model>/analysis/<filter>`, `<model>/selection/<filter>`. Beside it, folders that share the
store's name (`layerwave.zarr` → `layerwave.heads/`, `.reports/`, `.corpora/`, `.replay/`):

    <name>.heads/<model>/<preset>/<layers>/seed-N/           a pipeline's head (export, training.json)
    <name>.heads/<model>/<preset>/screen/<layers>/seed-N/    a study's screening head
    <name>.heads/<model>/<layers>/                           `layerwave train` without --out
    …/seed-N/evaluation/<bench>.json                         one evaluation of a head
    <name>.reports/<model>/report.md, pipeline-<preset>.json a model's report, a pipeline's completion marker
    <name>.corpora/<model>-<source>/                         the target's own replies (`layerwave generate`)
    <name>.replay/<model>/<bench>.zarr                       its greedy replies to a benchmark (the study)

Every location is a `UPath` (store/artefacts.py): for a store given as an fsspec URL
(`s3://bucket/layerwave.zarr`) the folders beside it are prefixes in the same bucket
(`s3://bucket/layerwave.heads/…`), so every worker of a deployment sees the same heads and reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from upath import UPath

from store.artefacts import location
from store.errors import LayerwaveError

ACTIVATIONS, STATS, ANALYSIS, SELECTION = "activations", "stats", "analysis", "selection"


def activations(model_key: str) -> str:
    return f"{model_key}/{ACTIVATIONS}"


def stats(model_key: str, filter_key: str) -> str:
    return f"{model_key}/{STATS}/{filter_key}"


def analysis(model_key: str, filter_key: str | None = None) -> str:
    """The analysis of one token filter, or (no filter) the group holding them all."""
    return f"{model_key}/{ANALYSIS}" + (f"/{filter_key}" if filter_key else "")


def selection(model_key: str, filter_key: str) -> str:
    return f"{model_key}/{SELECTION}/{filter_key}"


def layer_set(layers: list[int]) -> str:
    """[2, 15, 27] → "2-15-27", the folder name of a head."""
    return "-".join(map(str, layers))


def evaluation(head, bench: str) -> UPath:
    """One benchmark's result beside a head (a jsonl:PATH bench becomes a safe file name)."""
    return location(head) / "evaluation" / f"{bench.replace('/', '_').replace(':', '_')}.json"


@dataclass(frozen=True)
class Workspace:
    """A store and the folders beside it."""

    store: str

    def beside(self, kind: str) -> UPath:
        path = location(self.store)
        if not path.name:
            raise LayerwaveError(f"store {self.store} is a bucket's root, so nothing can sit beside it; give the "
                                 "store a name inside it, e.g. s3://bucket/layerwave.zarr")
        return path.with_name(path.name.removesuffix(".zarr") + f".{kind}")  # runs/2024.06.01: a name, not a suffix

    def heads(self, model_key: str, preset: str) -> UPath:
        return self.beside("heads") / model_key / preset

    def head(self, model_key: str, preset: str, layers: list[int], seed: int) -> UPath:
        return self.heads(model_key, preset) / layer_set(layers) / f"seed-{seed}"

    def screening_head(self, model_key: str, preset: str, layers: list[int], seed: int) -> UPath:
        """Same set and seed as a final head, a shorter budget: kept apart."""
        return self.heads(model_key, preset) / "screen" / layer_set(layers) / f"seed-{seed}"

    def single_head(self, model_key: str, layers: list[int]) -> UPath:
        """Where `layerwave train` puts a head when no --out is given."""
        return self.beside("heads") / model_key / layer_set(layers)

    def training_store(self) -> str:
        """The pipeline's training store: the candidates' layers only, beside the all-layer store."""
        return str(self.beside("training.zarr"))

    def reports(self, model_key: str) -> UPath:
        return self.beside("reports") / model_key

    def completion(self, model_key: str, preset: str) -> UPath:
        return self.reports(model_key) / f"pipeline-{preset}.json"

    def corpus(self, model_key: str, source: str) -> UPath:
        """The target's own replies to `source` (its file stem for a jsonl:PATH)."""
        name = Path(source.split(":", 1)[-1]).stem if ":" in source else source
        return self.beside("corpora") / f"{model_key}-{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}"

    def replay(self, model_key: str) -> UPath:
        return self.beside("replay") / model_key

    def replay_store(self, model_key: str, bench: str) -> str:
        return str(self.replay(model_key) / f"{bench}.zarr")

    def replay_corpus(self, model_key: str, bench: str) -> UPath:
        return self.replay(model_key) / f"{bench}-replies"

    def replay_prompts(self, model_key: str, bench: str) -> UPath:
        return self.replay(model_key) / f"{bench}-prompts.jsonl"
