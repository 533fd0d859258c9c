"""Heads side by side on a Dask cluster: a real `dask scheduler` and two `dask worker` processes
started here (stopped by PID), the smoke study's heads trained on them by `layerwave run
--dask-address` while one worker is killed mid-head, and everything the run made equal to a
sequential run's: the heads bit for bit, the ledger and the report's results."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect import task

from flows.pipeline import pipeline
from store.paths import Workspace
from tasks.heads.fan_out import HeadPool
from tasks.pipeline_presets import PIPELINE_PRESETS
from tasks.report.ledger import LEDGER
from tasks.report.write_report import report_task
from tests.conftest import TINY
from tests.processes import cli_argv, cli_env, free_port

STUDY = dict(model=TINY, preset="smoke-study", limit=2)


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """(scheduler address, Client) of a scheduler and two one-thread workers whose BLAS/OpenMP pools
    keep this process's thread count (Dask's nanny would set 1), so heads train as they do here."""
    from distributed import Client

    logs, port = tmp_path_factory.mktemp("dask"), free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, **{f"DASK_DISTRIBUTED__NANNY__ENVIRON__{name}": os.environ[name]
                            for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    dask = str(Path(sys.executable).with_name("dask"))
    commands = [[dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]]
    commands += [[dask, "worker", address, "--nthreads", "1", "--no-dashboard", "--name", f"worker-{i}"] for i in (0, 1)]
    processes = []
    try:
        for number, command in enumerate(commands):
            processes.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=True,
                                              stderr=open(logs / f"{number}.log", "w")))
            if number == 0:
                time.sleep(1)
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
            yield address, client
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=60)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory, prefect_api) -> str:
    store = str(tmp_path_factory.mktemp("sequential") / "study.zarr")
    pipeline(store=store, **STUDY)
    return store


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
    """(ledger records without their keys, report rows) of the run in `store`, as its report
    publishes them."""
    monkeypatch.setitem(PIPELINE_PRESETS, "smoke-study",
                        dataclasses.replace(PIPELINE_PRESETS["smoke-study"], publish=str(folder)))
    report_task(store, TINY, "smoke-study")
    ledger = json.loads((folder / TINY / LEDGER).read_text())["heads"]
    rows = json.loads((folder / TINY / "results.json").read_text())["rows"]
    for record in ledger:  # keys hash the inputs, the corpus's location beside the store among them
        del record["training_key"], record["data_plan_hash"]
        for score in record["scores"].values():
            del score["key"]
    return ledger, rows


def test_a_worker_killed_mid_head_and_the_run_still_equals_a_sequential_one(dask_cluster, sequential, prefect_api,
                                                                            tmp_path, monkeypatch):
    address, client = dask_cluster
    store, log = str(tmp_path / "study.zarr"), tmp_path / "run.log"
    with open(log, "w") as stderr:
        run = subprocess.Popen(cli_argv("run", {**STUDY, "store": store, "dask_address": address}),
                               env=cli_env(prefect_api), stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            kill_a_worker_mid_head(client, run)
            assert run.wait(timeout=600) == 0, log.read_text()[-3000:]
        finally:
            run.kill()
    text = log.read_text()
    assert f"heads on the Dask cluster at {address}" in text and "done (2/2)" in text
    heads = {path.relative_to(Workspace(sequential).beside("heads")): path.read_bytes()
             for path in Workspace(sequential).beside("heads").rglob("model.safetensors")}
    assert len(heads) >= 4  # two screened, at least two finalists
    assert {path.relative_to(Workspace(store).beside("heads")): path.read_bytes()
            for path in Workspace(store).beside("heads").rglob("model.safetensors")} == heads
    clustered, alone = published(store, tmp_path / "clustered", monkeypatch), published(sequential, tmp_path / "alone",
                                                                                        monkeypatch)
    assert clustered == alone


def test_a_local_cluster_runs_heads_in_its_own_processes_with_a_share_of_the_cores():
    with HeadPool(workers=2) as pool:
        assert pool.where() == "on 2 local Dask workers" and pool.threads == max(1, (os.cpu_count() or 1) // 2)
        processes = dict(pool.finished(_process, {n: {} for n in range(3)}))
    assert sorted(processes) == [0, 1, 2] and os.getpid() not in processes.values()


@task
def _process() -> int:
    return os.getpid()
