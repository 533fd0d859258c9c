"""The study's two extra rounds inside the pipeline (preset `study`): screening every candidate
at a short budget, and the target's own replies to the benchmarks, replayed for the finals.

    screen: every candidate × seed → train 1 epoch → τ_offline → the finalists (side by side on a
            Dask cluster when the run has one, as the final round)
    prepare_replay: per bench, the target answers the prompts once → extracted into its own store
"""

from __future__ import annotations

from prefect import get_run_logger

from flows.extract import extract
from flows.generate import generate
from flows.rounds import checked_head, each_head
from store import paths
from store.access import open_existing
from store.paths import Workspace
from tasks.decode.replay import whole_corpus, write_prompts
from tasks.heads.fan_out import HeadPool
from tasks.pipeline_request import Run
from tasks.progress import stage_line
from tasks.report.ledger import Ledger
from tasks.report.study import finalists, screening_rows, screening_tau
from tasks.select.selection import Candidate


def prepare_replay(run: Run, bench: str) -> None:
    """The target's greedy replies to at least `prompts` of `bench`'s prompts, extracted into their
    own store once per model (tasks/decode/replay.py)."""
    p = run.preset
    replay_replies(run.request.model, run.store, run.model_key, bench, p.prompts, p.max_new_tokens, p.max_length,
                   p.generate_max_prompt_tokens, log=get_run_logger().info)


def replay_replies(model: str, store: str, model_key: str, bench: str, prompts: int, max_new_tokens: int,
                   max_length: int, max_prompt_tokens: int, dtype: str = "auto", log=print) -> str:
    """The replay store of `bench` beside `store` (built once: the target answers the prompts one at
    a time in `dtype`, then every layer is extracted), for `replay_tau`."""
    workspace = Workspace(store)
    target = workspace.replay_store(model_key, bench)
    done = open_existing(target, paths.activations(model_key))
    if done is not None and done.attrs.get("complete"):
        return target
    log(stage_line("evaluate", f"the target's own greedy replies to {bench} (once per model)"))
    questions = write_prompts(store, model_key, bench, 2 * prompts)  # replies ending early leave room for more
    corpus = workspace.replay_corpus(model_key, bench)
    generate(model=model, source=f"jsonl:{questions}", out=str(corpus), tokens=prompts * max_new_tokens,
             max_new_tokens=max_new_tokens, turns=1, batch_size=1, shard_size=8, max_prompt_tokens=max_prompt_tokens,
             dtype=dtype)
    extract(model=model, corpus=f"regen:{corpus}", max_length=max_length, store=target, dtype=dtype,
            **whole_corpus(corpus))
    return target


def screen(run: Run, candidates: list[Candidate], pool: HeadPool) -> list[Candidate]:
    """Train every candidate × seed at the screening budget (or take its τ_offline from the
    published ledger); the finalists by mean τ_offline."""
    logger, p = get_run_logger(), run.preset
    ledger = Ledger.published(p.publish, run.model_key)
    scores: dict[tuple, dict[int, dict]] = {}
    heads = [(seed, candidate) for seed in p.seeds for candidate in candidates]
    jobs = {}
    for number, (seed, candidate) in enumerate(heads):
        head = Workspace(run.store).screening_head(run.model_key, run.request.preset, candidate.layers, seed)
        which = f"screening head {number + 1}/{len(heads)} {candidate.layers} seed {seed}"
        request, trained_under = checked_head(run, candidate.layers, seed, str(head), p.screen_epochs)
        published = ledger.screening_tau(trained_under)
        if published:
            logger.info(stage_line("train", f"{which}: screened on an earlier machine ({ledger.path})"))
            scores.setdefault(tuple(candidate.layers), {})[seed] = published
        else:
            jobs[number] = {"run": run, "request": request, "which": which, "keys": {}, "trained_under": trained_under}
    for number, done in each_head(pool, jobs, len(heads)):
        seed, candidate = heads[number]
        ledger = ledger.publish_head(jobs[number]["request"].out, "screening", candidate.layers, seed, p.benches)
        scores.setdefault(tuple(candidate.layers), {})[seed] = screening_tau(done["trained"].final)
    ranked = screening_rows(candidates, scores)
    chosen = finalists(candidates, ranked, p.finalists)
    logger.info("screening (%d epoch(s), τ_offline): %s; finalists %s", p.screen_epochs,
                ", ".join(f"{r['layers']} {r['tau_offline_mean']:.3f}" for r in ranked),
                ", ".join(str(c.layers) for c in chosen))
    return chosen
