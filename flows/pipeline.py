"""The whole question for one model as one Prefect flow, and a sweep over every registered model.

    generate → extract → statistics → selection → [screening] → for each seed: (for each set: train → evaluate) → report

The study preset screens every candidate at a short budget first (tasks/report/study.py) and measures
its finalists' τ along replayed target replies (tasks/decode/replay.py).

Every stage is idempotent: extraction by its shard commit markers, analysis, selection, training
and evaluation by the stage key of their inputs stored beside their outputs (tasks/stage_key.py).
A finished model re-runs with no stage work; a failed or deleted stage re-runs alone.
"""

from __future__ import annotations

from datetime import datetime, timezone

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.analyze import analyze
from flows.evaluate import evaluate
from flows.extract import extract
from flows.generate import generate
from flows.selection import select
from flows.study import prepare_replay, screen
from flows.train import train_head
from store import paths
from store.artefacts import location, read_json, write_json
from store.errors import LayerwaveError
from store.paths import Workspace
from store.read import open_activations
from tasks.data.registry import registry, resolve
from tasks.decode.evaluate import load_pair
from tasks.decode.replay import replay_tau
from tasks.names import DEFAULT_MODEL
from tasks.pipeline_presets import REFERENCE_FILTER, PipelinePreset, preset_store
from tasks.pipeline_request import RunRequest
from tasks.pipeline_stages import SOURCE, by_priority, extraction_current, is_complete
from tasks.progress import Pace, stage_line
from tasks.report.study import finalists
from tasks.report.write_report import report_task
from tasks.request import checked
from tasks.stage_key import current_record, stage_key, write_record


@task(name="evaluate-head", cache_policy=NO_CACHE)
def evaluate_stage(model: str, head: str, bench: str, p: PipelinePreset, store: str) -> dict:
    """Speculative decoding of `bench` with one head (real, or replayed along the target's stored
    replies); the result is kept beside the head under the key of its inputs (the head's own
    training key included), so a re-run reuses it."""
    training = read_json(location(head) / "training.json")
    model_key = resolve(model).key
    replies = (open_activations(Workspace(store).replay_store(model_key, bench), model_key).attrs["plan_hash"]
               if p.replay else None)  # the replayed replies are an input too
    key = stage_key(training["stage_key"], bench, p.prompts, p.max_new_tokens, p.depth, replies)
    path = paths.evaluation(head, bench)
    done = current_record(path, key)
    if done:
        return {**done, "reused": True}
    if p.replay:
        target, drafter = load_pair(model, head, "cpu")
        result = {**replay_tau(drafter, store, model_key, bench, p.depth, target.tokenizer.eos_token_id,
                               p.max_new_tokens), "speedup": None, "lossless": None}
    else:
        result = evaluate(model=model, head=head, bench=bench, limit=p.prompts, max_new_tokens=p.max_new_tokens,
                          depth=p.depth, store=store)
    write_record(path, result, key)
    return {**result, "reused": False}


@flow(name="layerwave-pipeline")
def pipeline(model: str = DEFAULT_MODEL, preset: str = "quick", store: str | None = None,
             limit: int | None = None, corpus: str | None = None, warm_start: bool | None = None) -> dict:
    """Generate the target's own replies, extract, analyse, select, train and evaluate every
    candidate layer set of `model`, then report. `corpus` replaces the generated corpus (e.g.
    "sharegpt" as is) and `warm_start` the preset's head initialisation. The parameters are
    `RunRequest`'s fields."""
    logger = get_run_logger()
    run = checked(RunRequest(model, preset, store, limit, corpus, warm_start))
    generated = corpus is None and run.preset.generate_tokens  # the target's own replies, written by this pipeline
    key, p, store, corpus, warm_start = run.model_key, run.preset, run.store, run.corpus, run.warm_start
    if extraction_current(store, key, model, p, corpus):
        logger.info(stage_line("extract", f"{key} in {store} is complete"))
    else:
        logger.info(stage_line("extract", ("the target writes its replies, then " if generated else "")
                               + f"every layer's states over {p.tokens} tokens into {store}"))
        if generated:
            generate(model=model, source=SOURCE, out=corpus.removeprefix("regen:"), tokens=p.generate_tokens,
                     max_new_tokens=p.generate_max_new_tokens, turns=p.generate_turns,
                     max_prompt_tokens=p.generate_max_prompt_tokens)
        extract(model=model, corpus=corpus, tokens=p.tokens, max_length=p.max_length, store=store)
    logger.info(stage_line("analyze", "entropy and CKA of every layer, out of core"))
    analyze(model=model, store=store, entropy_quantile=p.entropy_quantile, drop_first_token=True,
            memory_gb=p.memory_gb)
    logger.info(stage_line("select", "candidate layer sets"))
    candidates = select(model=model, store=store, filter_key=REFERENCE_FILTER.key, n_random=p.n_random)
    chosen = by_priority(candidates)[: limit or p.candidates]
    if p.screen_epochs:
        ranked = screen(model, store, key, preset, p, chosen, warm_start)
        chosen = finalists(chosen, ranked, p.finalists)
        logger.info("screening (%d epoch(s), τ_offline): %s; finalists %s", p.screen_epochs,
                    ", ".join(f"{r['layers']} {r['tau_offline_mean']:.3f}" for r in ranked),
                    ", ".join(str(c["layers"]) for c in chosen))
    if p.replay:
        for bench in p.benches:
            logger.info(stage_line("evaluate", f"the target's own greedy replies to {bench} (once per model)"))
            prepare_replay(model, store, key, bench, p)
    logger.info("training %d layer sets × %d seeds: %s", len(chosen), len(p.seeds),
                ", ".join(str(c["layers"]) for c in chosen))
    evaluated, sets = [], [c["layers"] for c in chosen]
    runs = [(seed, candidate) for seed in p.seeds for candidate in chosen]  # seed-major: partial results compare every set
    pace = Pace(len(runs))
    for number, (seed, candidate) in enumerate(runs):
        head = str(Workspace(store).head(key, preset, candidate["layers"], seed))
        which = f"head {number + 1}/{len(runs)} {candidate['layers']} seed {seed}"
        logger.info(stage_line("train", which + pace.eta(number)))
        pace.start()
        trained = train_head(model=model, store=store, layers=candidate["layers"], out=head,
                             preset_name=p.train_preset, seed=seed, epochs=p.epochs, warm_start=warm_start)
        for bench in p.benches:
            logger.info(stage_line("evaluate", f"{which} on {bench}"))
            result = evaluate_stage(model, head, bench, p, store)
            evaluated.append({"layers": candidate["layers"], "seed": seed, "bench": bench, "tau": result["tau"],
                              "speedup": result["speedup"], "reused": result["reused"]})
        pace.finish(worked=not trained["reused"] or not all(row["reused"] for row in evaluated[-len(p.benches):]))
        if candidate is chosen[-1]:  # after every seed, so a long run shows its progress
            logger.info(stage_line("report", f"after seed {seed}"))
            written = report_task(store, key, preset, sets)
    write_json(Workspace(store).completion(key, preset), {"complete": True, "model": model, "preset": preset,
                                                          "store": store,
                                                          "finished": datetime.now(timezone.utc).isoformat()})
    return {"model": model, "preset": preset, "store": store, "report": written["path"], "rows": written["rows"],
            "evaluated": evaluated}


@flow(name="layerwave-sweep")
def sweep(preset: str = "quick", store: str | None = None, models: list[str] | None = None) -> dict:
    """Run the pipeline for every registered model (or those named) without a complete result."""
    logger = get_run_logger()
    store = preset_store(preset, store)
    names = list(models) if models else sorted(registry())
    keys = {name: resolve(name).key for name in names}  # an unknown name fails before any run
    missing = [name for name in names if not is_complete(store, keys[name], preset)]
    if not missing:
        logger.info("nothing to do: every model (%s) has a complete %s result", ", ".join(names), preset)
    failed = []
    for name in missing:  # one model's failure does not stop the others
        logger.info("running the %s pipeline for %s", preset, name)
        if pipeline(model=name, preset=preset, store=store, return_state=True).is_failed():
            failed.append(name)
    if failed:
        raise LayerwaveError(f"the {preset} pipeline failed for {', '.join(failed)} (see their flow runs)")
    return {"ran": missing, "complete": [n for n in names if n not in missing]}
