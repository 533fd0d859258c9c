"""The pipeline's own decisions, apart from the flows it composes: which corpus a store is
extracted from, whether extraction can be skipped, the order sets are trained in, and whether a
model's run is complete (its request is checked in tasks/pipeline_request.py).
"""

from __future__ import annotations

from store import paths
from store.access import open_existing
from store.artefacts import read_json
from store.paths import Workspace
from tasks.names import EAGLE3_DEFAULT, FIXED_BASELINES, RANDOM_PREFIX
from tasks.pipeline_presets import PipelinePreset

SOURCE = "sharegpt"  # prompts the target answers (or, without generation, the corpus itself)




def corpus_for(store: str, model_key: str, p: PipelinePreset, corpus: str | None) -> str:
    """The corpus the store is extracted from: `corpus` if given, else the preset's (the target's
    own replies to ShareGPT prompts, or ShareGPT as is)."""
    if corpus is not None:
        return corpus
    return f"regen:{Workspace(store).corpus(model_key, SOURCE)}" if p.generate_tokens else SOURCE


def extraction_current(store: str, model_key: str, model: str, p: PipelinePreset, corpus: str) -> bool:
    """True when the store holds a complete extraction made with this pipeline's settings, so the
    extract stage can be skipped without loading the model or the corpus."""
    group = open_existing(store, paths.activations(model_key))
    if group is None:
        return False
    attrs = group.attrs
    stored = attrs.get("corpus", {})
    return bool(attrs.get("complete")) and attrs.get("model", {}).get("argument") == model and (
        stored.get("spec"), stored.get("tokens_requested"), stored.get("max_length"), stored.get("seed")) == (
        corpus, p.tokens, p.max_length, 0)


def by_priority(candidates: list[dict]) -> list[dict]:
    """The EAGLE-3 default first, then every selection method's sets, then fixed baselines, then
    random controls, so a `--limit` keeps the comparison that matters most."""
    def rank(candidate: dict) -> int:
        methods = candidate["methods"]
        if EAGLE3_DEFAULT in methods:
            return 0
        if any(not m.startswith(RANDOM_PREFIX) and m not in FIXED_BASELINES for m in methods):
            return 1
        return 2 if any(m in FIXED_BASELINES for m in methods) else 3
    return sorted(candidates, key=rank)


def is_complete(store: str, model_key: str, preset: str) -> bool:
    path = Workspace(store).completion(model_key, preset)
    return path.is_file() and read_json(path).get("complete") is True
