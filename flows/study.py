"""The study's two extra rounds inside the pipeline (preset `study`): screening every candidate
at a short budget, and the target's own replies to the benchmarks, replayed for the finals.

    screen: every candidate × seed → train 1 epoch → τ_offline → the finalists
    prepare_replay: per bench, the target answers the prompts once → extracted into its own store
"""

from __future__ import annotations

from prefect import get_run_logger

from flows.extract import extract
from flows.generate import generate
from flows.train import train_head
from store import paths
from store.access import open_existing
from store.paths import Workspace
from tasks.decode.replay import corpus_tokens, write_prompts
from tasks.pipeline_presets import PipelinePreset
from tasks.progress import Pace, stage_line
from tasks.report.study import screening_rows, screening_tau


def prepare_replay(model: str, store: str, model_key: str, bench: str, p: PipelinePreset) -> None:
    """The target's greedy replies to at least `p.prompts` of `bench`'s prompts, extracted into
    their own store once per model (tasks/decode/replay.py)."""
    target = Workspace(store).replay_store(model_key, bench)
    done = open_existing(target, paths.activations(model_key))
    if done is not None and done.attrs.get("complete"):
        return
    prompts = write_prompts(store, model_key, bench, 2 * p.prompts)  # replies ending early leave room for more
    corpus = Workspace(store).replay_corpus(model_key, bench)
    generate(model=model, source=f"jsonl:{prompts}", out=str(corpus), tokens=p.prompts * p.max_new_tokens,
             max_new_tokens=p.max_new_tokens, turns=1, batch_size=1, shard_size=8,
             max_prompt_tokens=p.generate_max_prompt_tokens)
    extract(model=model, corpus=f"regen:{corpus}", tokens=corpus_tokens(corpus), max_length=p.max_length,
            store=target)


def screen(model: str, store: str, model_key: str, preset: str, p: PipelinePreset, candidates: list[dict],
           warm_start: bool) -> list[dict]:
    """Train every candidate × seed at the screening budget; their rows, best τ_offline first."""
    logger = get_run_logger()
    scores: dict[tuple, dict[int, dict]] = {}
    runs = [(seed, candidate) for seed in p.seeds for candidate in candidates]
    pace = Pace(len(runs))
    for number, (seed, candidate) in enumerate(runs):
        head = Workspace(store).screening_head(model_key, preset, candidate["layers"], seed)
        logger.info(stage_line("train", f"screening head {number + 1}/{len(runs)} {candidate['layers']} seed {seed}"
                                        f"{pace.eta(number)}"))
        pace.start()
        trained = train_head(model=model, store=store, layers=candidate["layers"], out=str(head),
                             preset_name=p.train_preset, seed=seed, epochs=p.screen_epochs, warm_start=warm_start)
        pace.finish(worked=not trained["reused"])
        scores.setdefault(tuple(candidate["layers"]), {})[seed] = screening_tau(trained["final"])
    return screening_rows(candidates, scores)
