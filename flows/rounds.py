"""The pipeline's final round: every chosen layer set × seed trained, then scored on each
benchmark, each head published to the study's ledger as it finishes and the report rewritten
after each seed, so a long run can be read as it goes and loses nothing it finished.

    for seed: for set: train_head → score_head per bench → ledger (or the ledger's scores);  report
"""

from __future__ import annotations

from prefect import get_run_logger

from flows.evaluate import evaluate
from flows.train import train_head
from store import paths
from store.paths import Workspace
from tasks.decode.replay import replay_task
from tasks.heads.request import TrainRequest
from tasks.heads.train import training_key
from tasks.pipeline_request import HeadScore, Run
from tasks.pipeline_stages import evaluation_key, head_request, replayed_replies
from tasks.progress import Pace, stage_line
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


def final_round(run: Run, chosen: list[Candidate]) -> tuple[list[HeadScore], dict]:
    """Every head's scores (seed-major, so partial results compare every set) and the last report."""
    logger, p = get_run_logger(), run.preset
    ledger, replies = Ledger.published(p.publish, run.model_key), replayed_replies(run)
    scores, heads = [], [(seed, candidate) for seed in p.seeds for candidate in chosen]
    pace = Pace(len(heads))
    for number, (seed, candidate) in enumerate(heads):
        head = str(Workspace(run.store).head(run.model_key, run.request.preset, candidate.layers, seed))
        which = f"head {number + 1}/{len(heads)} {candidate.layers} seed {seed}"
        request, trained_under = checked_head(run, candidate.layers, seed, head, p.epochs)
        keys = {bench: evaluation_key(trained_under, bench, p, replies[bench]) for bench in p.benches}
        published = ledger.scores(trained_under, keys)
        if published:
            logger.info(stage_line("train", f"{which}: scored on an earlier machine ({ledger.path})"))
            results = {bench: {**score, "reused": True} for bench, score in published.items()}
        else:
            logger.info(stage_line("train", which + pace.eta(number)))
            pace.start()
            trained = train_head(**parameters(request))
            results = {}
            for bench in p.benches:
                logger.info(stage_line("evaluate", f"{which} on {bench}"))
                results[bench] = score_head(run, head, bench, keys[bench])
            pace.finish(worked=not trained.reused or not all(r["reused"] for r in results.values()))
            ledger = ledger.publish_head(head, "final", candidate.layers, seed, p.benches)
        scores += [HeadScore(candidate.layers, seed, bench, r["tau"], r["speedup"], r["reused"])
                   for bench, r in results.items()]
        if candidate is chosen[-1]:
            logger.info(stage_line("report", f"after seed {seed}"))
            written = report_task(run.store, run.model_key, run.request.preset, [c.layers for c in chosen])
    return scores, written
