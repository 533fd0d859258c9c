"""The study's rounds on the tiny model: every candidate screened, the finalists chosen from the
screening, their τ replayed along the target's own stored replies and equal to real decoding's,
a report with the screening, its rank correlation and how the target's replies ended, a second
run that does no work, a run without the heads that resumes from the published ledger, and the
final round's heads trained again side by side on a Dask cluster (a real scheduler and two workers
started here, stopped by PID), one worker killed mid-head."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from prefect import task

import flows.rounds
from flows.evaluate import evaluate
from flows.pipeline import pipeline
from store import paths
from store.access import open_existing
from store.paths import Workspace
from store.read import open_activations
from tasks.data.regen_corpus import read_generated
from tasks.heads.fan_out import HeadPool
from tasks.pipeline_presets import PIPELINE_PRESETS
from tasks.report.ledger import LEDGER
from tasks.report.study import finalists, screening_rows
from tasks.report.write_report import report_task
from tasks.select.selection import Candidate
from tests.conftest import TINY
from tests.processes import cli_argv, cli_env, free_port
from tests.test_pipeline import modification_times, pipeline_run


@pytest.fixture(scope="module")
def studied(tmp_path_factory, prefect_api):
    return pipeline_run(tmp_path_factory, "study.zarr", "smoke-study")


def test_every_candidate_is_screened_and_the_finalists_come_from_the_screening(studied):
    store, summary = studied
    screen = Workspace(store).heads(TINY, "smoke-study") / "screen"
    screened = sorted(path.parent.name for path in screen.glob("*/seed-0/training.json"))
    assert len(screened) == 3
    results = json.loads((Path(summary.report).parent / "results.json").read_text())
    ranked = results["screening"]
    assert [r["tau_offline_mean"] for r in ranked] == sorted((r["tau_offline_mean"] for r in ranked), reverse=True)
    assert all(r["rounds"] > 0 and r["tau_offline_mean"] >= 1.0 for r in ranked)
    finals = {tuple(row.layers) for row in summary.evaluated}
    assert tuple(ranked[0]["layers"]) in finals and (2, 4, 5) in finals  # the best screened, and the default
    assert finals <= {tuple(r["layers"]) for r in ranked}


def test_replayed_tau_equals_real_decoding_on_the_same_prompts(studied):
    store, summary = studied
    workspace = Workspace(store)
    for bench in ("mt-bench", "sharegpt"):
        replies = open_existing(workspace.replay_store(TINY, bench), paths.activations(TINY))
        assert replies.attrs["complete"] and replies.attrs["corpus"]["spec"].startswith("regen:")
        # stored whole, in one shard, with no padding
        conversations = read_generated(workspace.replay_corpus(TINY, bench))[0]
        assert replies["hidden_states"].shards[1] >= replies["token_id"].shape[0]
        assert np.bincount(replies["doc"][:]).tolist() == [len(conversations[record].token_ids)
                                                          for record in replies["source_record"][:]]
    head = workspace.head(TINY, "smoke-study", [2, 4, 5], 0)
    replayed = json.loads((head / "evaluation" / "mt-bench.json").read_text())
    assert replayed["method"] == "replay" and replayed["speedup"] is None and replayed["replies"] == 4
    prompts = workspace.replay_prompts(TINY, "mt-bench")  # its 4 prompts: one shard answered them all
    real = evaluate(model=TINY, head=str(head), bench=f"jsonl:{prompts}", limit=None, max_new_tokens=12, depth=3)
    assert real["lossless"] and real["tau"] == pytest.approx(replayed["tau"], abs=1e-9)


def test_the_report_shows_the_screening_and_how_well_it_predicts(studied):
    store, summary = studied
    report = Path(summary.report).read_text()
    assert "## Screening" in report and "screening_tau_offline" in report
    assert "![screening](screening.png)" in report and (Path(summary.report).parent / "screening.png").stat().st_size
    corpus = Path(open_activations(store, TINY).attrs["corpus"]["spec"].removeprefix("regen:"))
    generated = json.loads((corpus / "manifest.json").read_text())
    assert (f"- target replies: {generated['replies']}, {generated['finished_replies']} ended on the target's end "
            f"of turn, the rest at 24 new tokens; ") in report and "% of their tokens repeat a 4-gram" in report
    rows = json.loads((Path(summary.report).parent / "results.json").read_text())["rows"]
    assert {row["bench"] for row in rows} == {"mt-bench", "sharegpt"}
    assert all(row["speedup_mean"] is None and row["screening_tau_offline"] >= 1.0 for row in rows)


def test_a_second_study_run_does_no_work(studied):
    store, _ = studied
    folders = [Path(store), Workspace(store).beside("heads"), Workspace(store).beside("replay")]
    before = modification_times(*folders)
    again = pipeline(model=TINY, preset="smoke-study", store=store)
    assert modification_times(*folders) == before and all(row.reused for row in again.evaluated)


def test_finalists_are_the_best_screened_plus_the_default_and_the_best_random_set():
    candidates = [Candidate([i, i + 1, i + 2], [m]) for i, m in
                  enumerate(["cka-mrmr", "eagle3-default", "random-0", "even", "random-1"])]
    scores = {(0, 1, 2): {0: {"tau": 1.3, "rounds": 10}}, (1, 2, 3): {0: {"tau": 1.1, "rounds": 10}},
              (2, 3, 4): {0: {"tau": 1.15, "rounds": 10}}, (3, 4, 5): {0: {"tau": 1.25, "rounds": 10}},
              (4, 5, 6): {0: {"tau": 1.2, "rounds": 10}}}
    ranked = screening_rows(candidates, scores)
    assert [r["layers"] for r in ranked][:2] == [[0, 1, 2], [3, 4, 5]]
    chosen = [c.layers for c in finalists(candidates, ranked, 2)]
    assert chosen == [[0, 1, 2], [3, 4, 5], [1, 2, 3], [4, 5, 6]]  # random-1 screened better than random-0


def test_a_run_that_lost_its_heads_resumes_from_the_published_ledger(studied, tmp_path, monkeypatch):
    """As on a fresh machine where only the committed results survive: no head is trained again."""
    store, summary = studied
    published = tmp_path / "results"
    monkeypatch.setitem(PIPELINE_PRESETS, "smoke-study",
                        dataclasses.replace(PIPELINE_PRESETS["smoke-study"], publish=str(published)))
    report_task(store, TINY, "smoke-study")  # publishes the report and the ledger of the heads on disk
    ledger = json.loads((published / TINY / LEDGER).read_text())["heads"]
    assert {r["round"] for r in ledger} == {"screening", "final"} and len(ledger) == 3 + len(summary.evaluated) // 2
    before = json.loads((published / TINY / "results.json").read_text())
    heads = Workspace(store).beside("heads")
    away = heads.rename(heads.with_name("study.heads-away"))
    try:
        again = pipeline(model=TINY, preset="smoke-study", store=store)
        assert not heads.exists() or not list(heads.rglob("model.safetensors"))  # nothing trained
        assert all(row.reused for row in again.evaluated) and len(again.evaluated) == len(summary.evaluated)
        after = json.loads((published / TINY / "results.json").read_text())
        assert after["rows"] == before["rows"] and after["screening"] == before["screening"]
    finally:
        shutil.rmtree(heads, ignore_errors=True)
        away.rename(heads)


def test_every_head_is_published_to_the_ledger_as_soon_as_it_is_scored(studied, tmp_path, monkeypatch):
    """A run lost before its report (here the report fails) has published every head it finished."""
    store, summary = studied
    published = tmp_path / "results"
    monkeypatch.setitem(PIPELINE_PRESETS, "smoke-study",
                        dataclasses.replace(PIPELINE_PRESETS["smoke-study"], publish=str(published)))

    def machine_lost(*args, **kwargs):
        raise RuntimeError("machine lost before the report")

    monkeypatch.setattr(flows.rounds, "report_task", machine_lost)
    with pytest.raises(RuntimeError, match="machine lost"):
        pipeline(model=TINY, preset="smoke-study", store=store)
    ledger = json.loads((published / TINY / LEDGER).read_text())["heads"]
    assert [r["round"] for r in ledger] == ["screening"] * 3 + ["final"] * (len(summary.evaluated) // 2)
    scored = {(tuple(row.layers), row.bench): row.tau for row in summary.evaluated}
    assert {(tuple(r["layers"]), bench): score["tau"] for r in ledger if r["round"] == "final"
            for bench, score in r["scores"].items()} == scored


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """(scheduler address, Client) of a scheduler and two workers running a head at a time; the
    Client waits for them, whichever starts first."""
    from distributed import Client

    logs, port = tmp_path_factory.mktemp("dask"), free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = str(Path(sys.executable).with_name("dask"))
    commands = {"scheduler": [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]}
    # No nanny: a killed worker stays lost, as a lost machine would, instead of a new one starting beside the run.
    commands |= {f"worker-{i}": [dask, "worker", address, "--nthreads", "1", "--no-dashboard", "--no-nanny",
                                 "--name", f"worker-{i}"] for i in (0, 1)}
    processes = []
    try:
        for name, command in commands.items():
            with open(logs / f"{name}.log", "w") as log:
                processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log,
                                                  start_new_session=True))
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
            yield address, client
    finally:
        for process in reversed(processes):  # workers first: one whose scheduler is gone waits for it
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)


def kill_a_worker_mid_head(client, run: subprocess.Popen) -> None:
    """SIGKILL the process of the first worker seen training a head, a second into it."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert run.poll() is None, "the run ended before any head reached a worker"
        busy = [worker for worker, keys in client.processing().items() if any("head_job" in k for k in keys)]
        if busy:
            time.sleep(1)
            os.kill(client.run(os.getpid)[busy[0]], signal.SIGKILL)
            return
        time.sleep(0.05)
    raise AssertionError("no head reached a worker in time")


def published(store: str, folder: Path, monkeypatch) -> tuple[list, list]:
    """(ledger records, report rows) of the heads beside `store`, as its report publishes them."""
    monkeypatch.setitem(PIPELINE_PRESETS, "smoke-study",
                        dataclasses.replace(PIPELINE_PRESETS["smoke-study"], publish=str(folder)))
    report_task(store, TINY, "smoke-study")
    return (json.loads((folder / TINY / LEDGER).read_text())["heads"],
            json.loads((folder / TINY / "results.json").read_text())["rows"])


def model_files(heads: Path) -> dict:
    return {path.relative_to(heads): path.read_bytes() for path in heads.rglob("model.safetensors")}


def test_a_worker_killed_mid_head_and_the_run_still_equals_a_sequential_one(dask_cluster, studied, prefect_api,
                                                                            tmp_path, monkeypatch):
    """The study's final round again, side by side on a real scheduler and two workers (`layerwave
    run --dask-address`; the screening and every other stage current), one worker killed mid-head:
    the run finishes, and its heads (bit for bit), ledger and report results equal the in-process
    run's. (The screening round goes through the same pool: flows/rounds.py; its heads are current
    here, so they stay in process.)"""
    address, client = dask_cluster
    store, log = studied[0], tmp_path / "run.log"
    heads, alone = Workspace(store).heads(TINY, "smoke-study"), tmp_path / "in-process"
    shutil.copytree(heads, alone)
    finals = [path for path in heads.iterdir() if path.name != "screen"]
    for path in finals:
        shutil.rmtree(path)
    try:
        with open(log, "w") as stderr:
            run = subprocess.Popen(cli_argv("run", {"model": TINY, "preset": "smoke-study", "store": store,
                                                    "dask_address": address}),
                                   env=cli_env(prefect_api), stdout=subprocess.DEVNULL, stderr=stderr)
            try:
                kill_a_worker_mid_head(client, run)
                assert run.wait(timeout=600) == 0, log.read_text()[-3000:]
            finally:
                run.kill()
        # only the finals went to the cluster: the current screening heads were read back in process
        assert log.read_text().count(f"heads on the Dask cluster at {address}") == 1
        assert f"done ({len(finals)}/{len(finals)})" in log.read_text()
        assert len(finals) >= 2 and model_files(heads) == model_files(alone)  # the default and the best screened
        clustered = published(store, tmp_path / "clustered", monkeypatch)
    finally:
        shutil.rmtree(heads, ignore_errors=True)
        shutil.copytree(alone, heads)
    assert clustered == published(store, tmp_path / "in-process-results", monkeypatch)


def test_a_local_cluster_runs_heads_in_its_own_processes_with_a_share_of_the_cores():
    with HeadPool(workers=2) as pool:
        assert pool.where() == "on 2 local Dask workers" and pool.threads == max(1, (os.cpu_count() or 1) // 2)
        processes = dict(pool.finished(_process, {n: {} for n in range(3)}))
    assert sorted(processes) == [0, 1, 2] and os.getpid() not in processes.values()


@task
def _process() -> int:
    return os.getpid()
