"""A store in an S3 bucket, end to end: a real S3 endpoint (moto's server on 127.0.0.1), the smoke
pipeline run the way a user runs it (`layerwave run --store s3://…`, one head: every stage still
writes to the bucket), and everything it makes landing in the bucket, not on the worker's disk."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import xarray as xr

from flows.pipeline import pipeline
from tests.conftest import TINY
from tests.processes import cli_argv, free_port, run

BUCKET = "layerwave-test"
STORE = f"s3://{BUCKET}/layerwave.zarr"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """(environment for the CLI, an s3fs client) of an empty bucket on a moto server, stopped by PID."""
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
def finished(bucket, prefect_api, tmp_path_factory):
    env, fs = bucket
    workdir = tmp_path_factory.mktemp("s3-run")
    done = run(cli_argv("run", {"model": TINY, "preset": "smoke", "limit": 1, "store": STORE,
                                "json": workdir / "run.json"}),
               prefect_api, env=env, cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir, json.loads((workdir / "run.json").read_text())


def test_store_heads_evaluations_and_report_land_in_the_bucket(bucket, finished):
    env, fs = bucket
    workdir, summary = finished
    assert sorted(p.name for p in workdir.iterdir()) == ["run.json"]  # nothing written beside the worker
    activations = xr.open_zarr(STORE, group=f"{TINY}/activations", consolidated=False,
                               storage_options={"key": "layerwave", "secret": "layerwave",
                                                "endpoint_url": env["AWS_ENDPOINT_URL"]})
    assert activations.sizes["token"] == 3000 and activations.attrs["complete"]
    assert objects(fs, f"{BUCKET}/layerwave.training.zarr/{TINY}/activations")  # the heads' store, in the bucket too
    heads = objects(fs, f"{BUCKET}/layerwave.heads/{TINY}/smoke")
    assert len([p for p in heads if p.endswith("/model.safetensors")]) == 1  # --limit 1: the EAGLE-3 default's
    assert len([p for p in heads if p.endswith("/evaluation/mt-bench.json")]) == 1
    assert not [p for p in heads if "checkpoint" in p or p.endswith(".tmp")]
    reports = f"{BUCKET}/layerwave.reports/{TINY}"
    assert summary["report"] == f"s3://{reports}/report.md"
    assert "## Speculative decoding per set" in fs.cat(f"{reports}/report.md").decode()
    assert fs.info(f"{reports}/tau_by_set.png")["size"] > 0
    assert json.loads(fs.cat(f"{reports}/pipeline-smoke.json"))["complete"] is True
    manifest = json.loads(fs.cat(f"{BUCKET}/layerwave.corpora/{TINY}-sharegpt/manifest.json"))
    assert manifest["complete"] and manifest["tokens"] >= 1000


def test_a_second_run_skips_every_stage(bucket, finished, monkeypatch):
    """In this process (the first run was the command line's): no object in the bucket is rewritten."""
    env, fs = bucket
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    made = {prefix: objects(fs, f"{BUCKET}/layerwave.{prefix}") for prefix in ("zarr", "training.zarr", "heads",
                                                                               "corpora")}
    again = pipeline(model=TINY, preset="smoke", limit=1, store=STORE)
    assert again.evaluated and all(row.reused for row in again.evaluated)
    assert {prefix: objects(fs, f"{BUCKET}/layerwave.{prefix}") for prefix in made} == made
