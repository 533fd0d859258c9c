"""The pipeline's final round: every chosen layer set × seed trained, then scored on each
benchmark, each head published to the study's ledger as it finishes and the report rewritten
after each seed, so a long run can be read as it goes and loses nothing it finished.

    for seed: for set: train_head → score_head per bench → ledger (or the ledger's scores);  report

Heads train one after another in process, or side by side on a Dask cluster (tasks/heads/fan_out.py);
either way each is published as it finishes and each seed's report follows its last head.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.evaluate import evaluate
from flows.train import train_head
from store import paths
from store.paths import Workspace
from tasks.decode.replay import replay_task
from tasks.heads.fan_out import HeadPool
from tasks.heads.request import TrainRequest
from tasks.heads.train import trained_record, training_key
from tasks.pipeline_request import HeadScore, Run
from tasks.pipeline_stages import evaluation_key, head_request, replayed_replies
from tasks.progress import rate_eta, stage_line
from tasks.report.ledger import Ledger
from tasks.report.write_report import report_task
from tasks.request import check_ahead, parameters
from tasks.select.selection import Candidate
from tasks.stage_key import current_record, write_record


def checked_head(run: Run, layers: list[int], seed: int, out: str, epochs: int | None) -> tuple[TrainRequest, str]:
    """One head's request, checked now (the flow that trains it takes this check over), and the
    key it trains under: what the published ledger is looked up by."""
    request = head_request(run, layers, seed, out, epochs)
    return request, training_key(check_ahead(request))


def score_head(run: Run, head: str, bench: str, key: str) -> dict:
    """One head's τ on `bench` (real decoding, or replayed along the target's stored replies), kept
    beside the head under `key`, the key of its inputs, so a re-run reuses it."""
    p, model = run.preset, run.request.model
    path = paths.evaluation(head, bench)
    done = current_record(path, key)
    if done:
        return {**done, "reused": True}
    if p.replay:
        result = replay_task(model, head, run.store, run.model_key, bench, p.depth, p.max_new_tokens)
    else:
        result = evaluate(model=model, head=head, bench=bench, limit=p.prompts, max_new_tokens=p.max_new_tokens,
                          depth=p.depth, store=run.store, precision=p.precision)
    write_record(path, result, key)
    return {**result, "reused": False}


@task(name="train-and-score-head", cache_policy=NO_CACHE)
def head_job(run: Run, request: TrainRequest, which: str, keys: dict[str, str], threads: int | None = None) -> dict:
    """One head trained, then scored on each benchmark of `keys` (none when screening), in `threads`
    torch threads if given: the unit a round hands to its HeadPool, in process or on a Dask worker."""
    if threads:
        torch.set_num_threads(threads)
    trained = train_head(**parameters(request))
    results = {}
    for bench, key in keys.items():
        get_run_logger().info(stage_line("evaluate", f"{which} on {bench}"))
        results[bench] = score_head(run, request.out, bench, key)
    return {"trained": trained, "results": results}


def finished(job: dict, trained_under: str) -> bool:
    """Trained under `trained_under` and scored on each of the job's benchmarks: nothing a worker
    could add, so a round on a cluster reads it back in process instead of starting a worker's imports."""
    out = job["request"].out
    return (trained_record(out, trained_under) is not None
            and all(current_record(paths.evaluation(out, bench), key) for bench, key in job["keys"].items()))


def each_head(pool: HeadPool, jobs: dict[int, dict], total: int) -> Iterator[tuple[int, dict]]:
    """(number, head_job's result) of every job as it finishes, with a `[stage 4/6] train` line
    before each head in process, or after each one on a cluster, counting heads done anywhere.
    A job is head_job's arguments plus `trained_under`, the key its head trains under."""
    logger, started = get_run_logger(), time.perf_counter()
    jobs = {number: {**job, "threads": pool.threads} for number, job in jobs.items()}
    trained_under = {number: job.pop("trained_under") for number, job in jobs.items()}
    if not pool.parallel:
        for done, (number, job) in enumerate(jobs.items()):
            logger.info(stage_line("train", job["which"] + rate_eta(done, len(jobs), time.perf_counter() - started)))
            yield number, head_job(**job)
        return
    for number in [number for number, job in jobs.items() if finished(job, trained_under[number])]:
        yield number, head_job(**jobs.pop(number))
    if not jobs:
        return
    logger.info(stage_line("train", f"{len(jobs)} of {total} heads {pool.where()}"))
    for done, (number, result) in enumerate(pool.finished(head_job, jobs), start=1):
        logger.info(stage_line("train", f"{jobs[number]['which']} done ({done}/{len(jobs)})"
                               + rate_eta(done, len(jobs), time.perf_counter() - started)))
        yield number, result


def final_round(run: Run, chosen: list[Candidate], pool: HeadPool) -> tuple[list[HeadScore], dict]:
    """Every head's scores (seed-major, so partial results compare every set) and the last report,
    rewritten once every head of a seed is in."""
    logger, p = get_run_logger(), run.preset
    ledger, replies = Ledger.published(p.publish, run.model_key), replayed_replies(run)
    heads = [(seed, candidate) for seed in p.seeds for candidate in chosen]
    results, jobs = {}, {}
    for number, (seed, candidate) in enumerate(heads):
        head = str(Workspace(run.store).head(run.model_key, run.request.preset, candidate.layers, seed))
        which = f"head {number + 1}/{len(heads)} {candidate.layers} seed {seed}"
        request, trained_under = checked_head(run, candidate.layers, seed, head, p.epochs)
        keys = {bench: evaluation_key(trained_under, bench, p, replies[bench]) for bench in p.benches}
        published = ledger.scores(trained_under, keys)
        if published:
            logger.info(stage_line("train", f"{which}: scored on an earlier machine ({ledger.path})"))
            results[number] = {bench: {**score, "reused": True} for bench, score in published.items()}
        else:
            jobs[number] = {"run": run, "request": request, "which": which, "keys": keys,
                            "trained_under": trained_under}
    reports = SeedReports(run, chosen)
    reports.write_ready(results)
    for number, done in each_head(pool, jobs, len(heads)):
        seed, candidate = heads[number]
        ledger = ledger.publish_head(jobs[number]["request"].out, "final", candidate.layers, seed, p.benches)
        results[number] = done["results"]
        reports.write_ready(results)
    scores = [HeadScore(candidate.layers, seed, bench, r["tau"], r["speedup"], r["reused"])
              for number, (seed, candidate) in enumerate(heads) for bench, r in results[number].items()]
    return scores, reports.written


class SeedReports:
    """The report rewritten after each seed, in seed order, once all of that seed's heads are in."""

    def __init__(self, run: Run, chosen: list[Candidate]):
        self.run, self.chosen, self.written, self.reported = run, chosen, None, 0  # seeds reported so far

    def write_ready(self, results: dict[int, dict]) -> None:
        """`results` by head number, seed-major as final_round numbers them."""
        run, seeds, per_seed = self.run, self.run.preset.seeds, len(self.chosen)
        while self.reported < len(seeds):
            first = self.reported * per_seed
            if not all(number in results for number in range(first, first + per_seed)):
                return
            get_run_logger().info(stage_line("report", f"after seed {seeds[self.reported]}"))
            self.written = report_task(run.store, run.model_key, run.request.preset, [c.layers for c in self.chosen])
            self.reported += 1
