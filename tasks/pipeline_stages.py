"""The pipeline's own decisions, apart from the flows it composes: which corpus a store is
extracted from, whether extraction can be skipped, the order sets are trained in, what a head's
score depends on, and whether a model's run is complete (its request is checked in
tasks/pipeline_request.py).
"""

from __future__ import annotations

from store import paths
from store.access import open_existing
from store.artefacts import read_json
from store.paths import Workspace
from store.read import open_activations
from tasks.heads.request import TrainRequest
from tasks.names import EAGLE3_DEFAULT, FIXED_BASELINES, RANDOM_PREFIX
from tasks.pipeline_presets import PipelinePreset
from tasks.pipeline_request import Run
from tasks.precision import resolve_precision
from tasks.select.selection import Candidate
from tasks.stage_key import stage_key

SOURCE = "sharegpt"  # prompts the target answers (or, without generation, the corpus itself)




def corpus_for(store: str, model_key: str, p: PipelinePreset, corpus: str | None) -> str:
    """The corpus the store is extracted from: `corpus` if given, else the preset's (the target's
    own replies to ShareGPT prompts, or ShareGPT as is)."""
    if corpus is not None:
        return corpus
    return f"regen:{Workspace(store).corpus(model_key, SOURCE)}" if p.generate_tokens else SOURCE


def extraction_current(run: Run, store: str, tokens: int, layers: list[int] | None = None) -> bool:
    """True when `store` holds a complete extraction of the run's model and corpus over `tokens`
    (`layers`: None for all), so the extract stage can be skipped without loading the model or the
    corpus."""
    group = open_existing(store, paths.activations(run.model_key))
    if group is None:
        return False
    attrs = group.attrs
    stored = attrs.get("corpus", {})
    return bool(attrs.get("complete")) and attrs.get("model", {}).get("argument") == run.request.model and (
        stored.get("spec"), stored.get("tokens_requested"), stored.get("max_length"), stored.get("seed"),
        attrs.get("layout", {}).get("layers"), attrs.get("extraction", {}).get("dtype", "auto")) == (
        run.corpus, tokens, run.preset.max_length, 0, layers, run.dtype)


def training_layers(candidates: list[Candidate], p: PipelinePreset) -> list[int]:
    """Every layer the preset's candidate sets read (their union; `--limit` does not change it, so
    a run with another limit reuses the training store)."""
    return sorted({layer for candidate in by_priority(candidates)[: p.candidates] for layer in candidate.layers})


def by_priority(candidates: list[Candidate]) -> list[Candidate]:
    """The EAGLE-3 default first, then every selection method's sets, then fixed baselines, then
    random controls, so a `--limit` keeps the comparison that matters most."""
    def rank(candidate: Candidate) -> int:
        methods = candidate.methods
        if EAGLE3_DEFAULT in methods:
            return 0
        if any(not m.startswith(RANDOM_PREFIX) and m not in FIXED_BASELINES for m in methods):
            return 1
        return 2 if any(m in FIXED_BASELINES for m in methods) else 3
    return sorted(candidates, key=rank)


def is_complete(store: str, model_key: str, preset: str) -> bool:
    path = Workspace(store).completion(model_key, preset)
    return path.is_file() and read_json(path).get("complete") is True


def replayed_replies(run: Run) -> dict[str, str | None]:
    """Per benchmark, the plan hash of the replies its heads are replayed along (None when the
    preset decodes for real): an input of every score, read once per run."""
    p, key = run.preset, run.model_key
    return {bench: open_activations(Workspace(run.store).replay_store(key, bench), key).attrs["plan_hash"]
            if p.replay else None for bench in p.benches}


def evaluation_key(training_key: str, bench: str, p: PipelinePreset, replies: str | None) -> str:
    """The inputs of one head's score on `bench`: the head (by its training key), the benchmark
    settings and the replies replayed along (`replayed_replies`), or for real decoding the
    target's precision on this machine (bfloat16 where native: its speed and ties differ)."""
    from tasks.data.load_model import pick_device

    decoding = [] if replies else [resolve_precision(p.precision, pick_device("auto"))]
    return stage_key(training_key, bench, p.prompts, p.max_new_tokens, p.depth, replies, *decoding)


def head_request(run: Run, layers: list[int], seed: int, out: str, epochs: int | None) -> TrainRequest:
    """What the pipeline asks of one head: the preset's recipe for `epochs`, from the run's training store."""
    p = run.preset
    return TrainRequest(model=run.request.model, store=run.training_store, layers=layers, out=out, preset_name=p.train_preset,
                        seed=seed, epochs=epochs, warm_start=run.warm_start)
