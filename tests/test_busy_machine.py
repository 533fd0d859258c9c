"""A busy machine is not an error. A new user has no Prefect server: the first command starts
Prefect's embedded one, which must come up while other jobs hold every core; when it cannot, the
command says so in one line, with the fix, and changes nothing. The command here analyses a small
synthetic store: any flow starts the server the same way, and this one loads no model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from flows import EPHEMERAL_STARTUP_TIMEOUT
from tests.conftest import parallel_test_processes
from tests.processes import cli_argv, error_line, wait_until
from tests.test_bad_input import snapshot
from tests.test_stats import synthetic_store

REPO = Path(__file__).parents[1]
MODEL = "synthetic"


def new_users_env(prefect_home: Path, **extra: str) -> dict:
    """No server to talk to and an empty PREFECT_HOME: the embedded server starts from scratch."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", EPHEMERAL_STARTUP_TIMEOUT)}
    return {**env, "PREFECT_HOME": str(prefect_home), **extra}


@pytest.fixture
def cpu_hogs():
    """Busy loops that, with the other tests running beside this one, keep every core taken; the
    fixture yields the function that stops them (by PID), called again whatever the test does."""
    count = max(1, (os.cpu_count() or 2) - parallel_test_processes() + 1)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]

    def stop():
        for hog in hogs:
            hog.kill()
            hog.wait()
    yield stop
    stop()


@pytest.fixture
def store(tmp_path) -> Path:
    return Path(synthetic_store(tmp_path, np.random.default_rng(0).standard_normal((4, 512, 16)).astype(np.float32),
                                MODEL))


def analysis(store: Path) -> list[str]:
    return cli_argv("analyze", {"model": MODEL, "store": store})


def test_a_command_on_the_embedded_server_succeeds_while_every_core_is_busy(tmp_path, store, cpu_hogs):
    """The hogs run until the analysis flow has begun (its statistics appear; they are only
    written from inside the flow, on the server): the server came up under them."""
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr:
        command = subprocess.Popen(analysis(store), env=new_users_env(tmp_path / "prefect"), cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_until((store / MODEL / "stats").exists, command, timeout=300)
            cpu_hogs()
            assert command.wait(timeout=600) == 0, log.read_text()[-3000:]
        finally:
            command.kill()
    assert zarr.open_group(store, path=f"{MODEL}/stats/all", mode="r").attrs["complete"] is True


def test_a_server_that_does_not_start_in_time_is_one_line_and_changes_nothing(tmp_path, store):
    before = snapshot(store)
    env = new_users_env(tmp_path / "prefect", **{EPHEMERAL_STARTUP_TIMEOUT: "0"})
    done = subprocess.run(analysis(store), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    line = error_line(done.stderr)
    assert "did not start within 0 s" in line and EPHEMERAL_STARTUP_TIMEOUT in line and "PREFECT_API_URL" in line
    assert snapshot(store) == before
