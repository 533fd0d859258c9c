"""The whole question for one model as one Prefect flow.

    generate → extract → statistics → selection → [training store] → [screening]
             → for each seed: (for each set: train → score) → report

Heads of a round train one after another, or side by side on a Dask cluster (--workers N, a
local one; --dask-address, the user's); everything else runs in the flow's own process.

The study preset screens every candidate at a short budget first (flows/study.py) and scores its
finalists along replayed target replies (tasks/decode/replay.py). A preset with `training_tokens`
trains heads on a store of only the candidates' layers over that budget. Every stage is idempotent:
extraction by its shard commit markers, the others by the stage key of their inputs stored beside
their outputs (tasks/stage_key.py), so a finished model re-runs with no stage work and a failed or
deleted stage re-runs alone.
"""

from __future__ import annotations

from datetime import datetime, timezone

from prefect import flow, get_run_logger

from flows.analyze import analyze
from flows.extract import extract
from flows.generate import generate
from flows.rounds import final_round
from flows.selection import select
from flows.study import prepare_replay, screen
from store.artefacts import write_json
from store.paths import Workspace
from tasks.heads.fan_out import HeadPool
from tasks.names import DEFAULT_MODEL
from tasks.pipeline_presets import REFERENCE_FILTER
from tasks.pipeline_request import PipelineResult, Run, RunRequest
from tasks.pipeline_stages import SOURCE, by_priority, extraction_current, training_layers
from tasks.progress import stage_line
from tasks.request import checked


@flow(name="layerwave-pipeline")
def pipeline(model: str = DEFAULT_MODEL, preset: str = "quick", store: str | None = None,
             limit: int | None = None, corpus: str | None = None, warm_start: bool | None = None,
             workers: int | None = None, dask_address: str | None = None) -> PipelineResult:
    """Generate the target's own replies, extract, analyse, select, train and score every candidate
    layer set of `model`, then report. `corpus` replaces the generated corpus (e.g. "sharegpt" as
    is) and `warm_start` the preset's head initialisation; `workers` or `dask_address` train each
    round's heads side by side on a Dask cluster. The parameters are `RunRequest`'s fields."""
    logger = get_run_logger()
    run = checked(RunRequest(model, preset, store, limit, corpus, warm_start, workers, dask_address))
    p, store = run.preset, run.store
    extract_once(run)
    logger.info(stage_line("analyze", "entropy and CKA of every layer, out of core"))
    analysed = analyze(model=model, store=store, entropy_quantile=p.entropy_quantile, drop_first_token=True,
                       memory_gb=p.memory_gb)
    logger.info(stage_line("select", "candidate layer sets"))
    own = list(analysed["tokens_kept_per_filter"])  # the pipeline's filters, not those of an analysis run by hand
    candidates = select(model=model, store=store, filter_key=REFERENCE_FILTER.key, n_random=p.n_random, analyses=own)
    chosen = by_priority(candidates)[: limit or p.candidates]
    if p.training_tokens:
        extract_training_store(run, training_layers(candidates, p))
    with HeadPool(workers, dask_address) as pool:
        if p.screen_epochs:
            chosen = screen(run, chosen, pool)
        if p.replay:
            for bench in p.benches:
                prepare_replay(run, bench)
        logger.info("training %d layer sets × %d seeds: %s", len(chosen), len(p.seeds),
                    ", ".join(str(c.layers) for c in chosen))
        scores, report = final_round(run, chosen, pool)
    write_json(Workspace(store).completion(run.model_key, preset), {
        "complete": True, "model": model, "preset": preset, "store": store,
        "finished": datetime.now(timezone.utc).isoformat()})
    return PipelineResult(model, preset, store, report["path"], report["rows"], scores)


def extract_once(run: Run) -> None:
    """The activations, unless the store already holds them from these settings; the target first
    writes its own replies when the pipeline generates its corpus."""
    p, store, key, model = run.preset, run.store, run.model_key, run.request.model
    generated = run.request.corpus is None and p.generate_tokens
    if extraction_current(run, store, p.tokens):
        get_run_logger().info(stage_line("extract", f"{key} in {store} is complete"))
        return
    get_run_logger().info(stage_line("extract", ("the target writes its replies, then " if generated else "")
                                     + f"every layer's states over {p.tokens} tokens into {store}"))
    if generated:
        generate(model=model, source=SOURCE, out=run.corpus.removeprefix("regen:"), tokens=p.generate_tokens,
                 max_new_tokens=p.generate_max_new_tokens, turns=p.generate_turns,
                 max_prompt_tokens=p.generate_max_prompt_tokens, batch_size=p.generate_batch_size,
                 shard_size=p.generate_shard_size, dtype=run.dtype)
    extract(model=model, corpus=run.corpus, tokens=p.tokens, max_length=p.max_length, store=store, dtype=run.dtype)


def extract_training_store(run: Run, layers: list[int]) -> None:
    """The candidates' layers over the preset's training budget of the same corpus, unless the
    training store already holds them; it is remade when the candidates read other layers."""
    p, store = run.preset, run.training_store
    if extraction_current(run, store, p.training_tokens, layers):  # after select: the train stage's first step
        get_run_logger().info(stage_line("train", f"the training store {store} is complete"))
        return
    get_run_logger().info(stage_line("train", f"first the training store: layers {layers} over {p.training_tokens} "
                                              f"tokens into {store}"))
    extract(model=run.request.model, corpus=run.corpus, tokens=p.training_tokens, max_length=p.max_length,
            store=store, layers=layers, overwrite=True, dtype=run.dtype)
