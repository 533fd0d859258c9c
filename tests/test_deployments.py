"""Deployments on a real Prefect server on 127.0.0.1 (deploy/server-up.sh), as a team runs them
with a shared object store: `prefect deployment run` of the smoke pipeline to Completed with its
store in an S3 bucket (a real S3 endpoint: moto's server on 127.0.0.1), every stage writing there
and nothing beside the worker; a second run that rewrites no object; a failing run for an unknown
model; and the model-added event turned into a pipeline run by the deployment trigger. Everything
started is stopped by PID."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr

from flows.pipeline import pipeline
from tests.conftest import TINY, run_folder, saved_checkpoint
from tests.prefect_server import copy_database
from tests.processes import free_port

REPO = Path(__file__).resolve().parents[1]
PIPELINE = "layerwave-pipeline/layerwave-pipeline"
BUCKET = "layerwave-test"
STORE = f"s3://{BUCKET}/layerwave.zarr"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """(environment for the worker, an s3fs client) of an empty bucket on a moto server, stopped by PID."""
    import s3fs

    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "layerwave",
           "AWS_SECRET_ACCESS_KEY": "layerwave", "AWS_DEFAULT_REGION": "us-east-1"}
    fs = s3fs.S3FileSystem(key="layerwave", secret="layerwave", endpoint_url=env["AWS_ENDPOINT_URL"],
                           skip_instance_cache=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                fs.mkdir(BUCKET)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "moto's S3 server did not start"
                time.sleep(0.2)
        yield env, fs
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def objects(fs, prefix: str) -> dict[str, str]:
    """Every object under `prefix` with its ETag and modification time (a rewrite changes them)."""
    fs.invalidate_cache()
    return {path: f"{info['ETag']} {info['LastModified']}" for path, info in fs.find(prefix, detail=True).items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory, bucket, prefect_api):
    run_dir = tmp_path_factory.mktemp("prefect-server")
    copy_database(run_folder(tmp_path_factory), run_dir / "home" / "prefect.db")
    port = free_port()
    env = {**os.environ, **bucket[0], "LAYERWAVE_RUN_DIR": str(run_dir), "LAYERWAVE_PREFECT_PORT": str(port),
           "PREFECT_HOME": str(run_dir / "home"), "LAYERWAVE_REGISTRY": str(run_dir / "models.toml"),
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           # No scheduler: a suite running across 03:00 UTC would get the sweep's daily run, a quick
           # pipeline of the default model writing layerwave.* folders into the checkout.
           "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false"}
    try:
        subprocess.run(["bash", "deploy/server-up.sh"], cwd=REPO, env=env, check=True, timeout=300)
        yield env, run_dir
    finally:
        subprocess.run(["bash", "deploy/server-down.sh"], cwd=REPO, env=env, timeout=120)
        for name in ("server", "worker"):
            assert not (run_dir / f"{name}.pid").exists()


def prefect(env, *args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / ".venv/bin/prefect"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def pipeline_runs(env) -> list:
    """The pipeline deployment's flow runs, read from the server."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name(PIPELINE)
            return [run for run in client.read_flow_runs() if run.deployment_id == deployment.id]


def outputs_beside(folder: Path) -> set[str]:
    """What a run could leave in its working folder: stores, corpora, heads, reports."""
    return {path.name for path in folder.iterdir() if "layerwave" in path.name or path.suffix == ".zarr"}


def test_deployment_run_completes_and_everything_lands_in_the_bucket(server, bucket):
    env, _ = server
    _, fs = bucket
    beside = outputs_beside(REPO)  # the worker's working folder (deploy/prefect.yaml's pull step)
    done = prefect(env, "deployment", "run", PIPELINE, "--param", f"model={TINY}", "--param", "preset=smoke",
                   "--param", "limit=1", "--param", f"store={STORE}", "--watch", "--watch-timeout", "900")
    assert done.returncode == 0 and "Completed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert outputs_beside(REPO) == beside
    activations = xr.open_zarr(STORE, group=f"{TINY}/activations", consolidated=False,
                               storage_options={"key": "layerwave", "secret": "layerwave",
                                                "endpoint_url": env["AWS_ENDPOINT_URL"]})
    assert (activations.sizes["token"], activations.sizes["layer"]) == (2000, 9) and activations.attrs["complete"]
    assert objects(fs, f"{BUCKET}/layerwave.training.zarr/{TINY}/activations")  # the heads' store, in the bucket too
    heads = objects(fs, f"{BUCKET}/layerwave.heads/{TINY}/smoke")
    assert len([p for p in heads if p.endswith("/model.safetensors")]) == 1  # limit 1: the EAGLE-3 default's
    assert len([p for p in heads if p.endswith("/evaluation/mt-bench.json")]) == 1
    assert not [p for p in heads if "checkpoint" in p or p.endswith(".tmp")]
    reports = f"{BUCKET}/layerwave.reports/{TINY}"
    report = fs.cat(f"{reports}/report.md").decode()
    assert "layerwave report" in report and "## Speculative decoding per set" in report
    assert fs.info(f"{reports}/tau_by_set.png")["size"] > 0
    assert json.loads(fs.cat(f"{reports}/pipeline-smoke.json"))["complete"] is True
    manifest = json.loads(fs.cat(f"{BUCKET}/layerwave.corpora/{TINY}-sharegpt/manifest.json"))
    assert manifest["complete"] and manifest["tokens"] >= 600


def test_a_second_run_rewrites_no_object(server, bucket, monkeypatch):
    """In this process, after the deployment's run: every stage is current, no object is rewritten."""
    env, fs = bucket
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    made = {prefix: objects(fs, f"{BUCKET}/layerwave.{prefix}") for prefix in ("zarr", "training.zarr", "heads",
                                                                               "corpora")}
    assert all(made.values()), "the deployment's run wrote nothing"
    again = pipeline(model=TINY, preset="smoke", limit=1, store=STORE)
    assert again.evaluated and all(row.reused for row in again.evaluated)
    assert {prefix: objects(fs, f"{BUCKET}/layerwave.{prefix}") for prefix in made} == made


def test_unknown_model_fails_the_flow_run_with_a_clear_message(server):
    env, _ = server
    failed = prefect(env, "deployment", "run", PIPELINE, "--param", "model=no-such-model", "--watch",
                     "--watch-timeout", "300")
    assert failed.returncode != 0
    run = next(r for r in pipeline_runs(env) if r.parameters.get("model") == "no-such-model")
    assert run.state.is_failed() and "unknown model 'no-such-model'" in run.state.message


def test_adding_a_model_triggers_its_pipeline_run(server, tiny, tmp_path):
    env, _ = server
    # Stop the worker first: the triggered run only has to be created here, not executed.
    subprocess.run(["bash", "deploy/server-down.sh", "worker"], cwd=REPO, env=env, check=True, timeout=120)
    added = subprocess.run([str(REPO / ".venv/bin/layerwave"), "models", "add", "tiny-copy", "--source",
                            f"hf:{saved_checkpoint(tiny, tmp_path / 'checkpoint')}"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert added.returncode == 0 and "announced to Prefect" in added.stdout, added.stderr
    deadline = time.time() + 90
    while not any(r.parameters.get("model") == "tiny-copy" for r in pipeline_runs(env)):
        assert time.time() < deadline, "no pipeline run was triggered by the model-added event"
        time.sleep(2)
