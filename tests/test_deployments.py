"""Deployments on a real Prefect server on 127.0.0.1 (deploy/server-up.sh): `prefect deployment
run` of the pipeline to Completed, a failing run for an unknown model, and the model-added event
turned into a pipeline run by the deployment trigger. Everything started is stopped by PID."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import xarray as xr

from tests.conftest import TINY, saved_checkpoint
from tests.processes import free_port

REPO = Path(__file__).resolve().parents[1]
PIPELINE = "layerwave-pipeline/layerwave-pipeline"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {**os.environ, "LAYERWAVE_RUN_DIR": str(run_dir), "LAYERWAVE_PREFECT_PORT": str(port),
           "PREFECT_HOME": str(run_dir / "home"), "LAYERWAVE_REGISTRY": str(run_dir / "models.toml"),
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
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


def test_deployment_run_completes_and_its_store_opens(server, tmp_path):
    env, _ = server
    store = tmp_path / "deployed.zarr"
    done = prefect(env, "deployment", "run", PIPELINE, "--param", f"model={TINY}", "--param", "preset=smoke",
                   "--param", "limit=1", "--param", f"store={store}", "--watch", "--watch-timeout", "900")
    assert done.returncode == 0 and "Completed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert xr.open_zarr(store, group=f"{TINY}/activations").sizes["layer"] == 9
    assert "layerwave report" in (tmp_path / "deployed.reports" / TINY / "report.md").read_text()


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
