"""Run `layerwave` as a real process, the way a user (or a crash) meets it: start it, wait for a
sign of progress in the store or on disk, kill it, or run it to the end and read its stderr.
Shared by the kill, concurrency and filesystem-fault tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import zarr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cli_argv(command: str, options: dict) -> list[str]:
    """`python -m flows.cli <command> --name value ...` for the options of a flow call."""
    argv = [sys.executable, "-m", "flows.cli", command]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def cli_env(prefect_api: str, extra: dict | None = None) -> dict:
    """This test session's environment, pointed at the session's Prefect test server (plus `extra`)."""
    return {**os.environ, "PREFECT_API_URL": prefect_api, **(extra or {})}


def start(argv: list[str], prefect_api: str, **popen) -> subprocess.Popen:
    """Start the command in its own session, so a kill reaches every process it started."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    return subprocess.Popen(argv, env=cli_env(prefect_api), start_new_session=True, **popen)


def run(argv: list[str], prefect_api: str, env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    """Run the command to its end (`env` adds variables); stdout and stderr come back as text."""
    return subprocess.run(argv, env=cli_env(prefect_api, env), capture_output=True, text=True, timeout=600, **popen)


def wait_until(condition, process: subprocess.Popen, timeout: float = 180) -> None:
    """Poll `condition` while the process runs; fail if it ends or stalls first. Between polls it
    sleeps 5 ms, or four times what a poll costs: a costly condition (reading a store) polled
    back to back would take a core from the process it waits for. At most 50 ms: on a busy
    machine a poll can take a few hundred, and four times that let a fast run finish unseen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the process ended before the awaited moment"
        began = time.perf_counter()
        if condition():
            return
        time.sleep(min(0.05, max(0.005, 4 * (time.perf_counter() - began))))
    raise AssertionError("the process made no progress in time")


def committed(store: str, key: str) -> int:
    """Committed shards of `key`'s activations (0 while the template is not there yet)."""
    try:
        return int(zarr.open_group(store, path=f"{key}/activations", mode="r",
                                   use_consolidated=False)["shard_committed"][:].sum())
    except (FileNotFoundError, KeyError, zarr.errors.GroupNotFoundError, ValueError):
        return 0


def error_line(stderr: str) -> str:
    """The one `layerwave: error:` line a refused command ends with, after checking there is no
    traceback (Prefect's own run log lines may come before it)."""
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("layerwave: error: "), stderr
    return last


def _arrays(store: str) -> dict:
    root = zarr.open_group(store, mode="r", use_consolidated=False)
    return {path: (array[...], dict(array.attrs)) for path, array in root.members(max_depth=None)
            if isinstance(array, zarr.Array)}


def _group_attrs(store: str, path: str) -> dict:
    return dict(zarr.open_group(store, path=path, mode="r", use_consolidated=False).attrs)


def assert_identical_stores(a: str, b: str, group: str) -> None:
    """Every array (values and attributes) and the group's attributes are equal."""
    left, right = _arrays(a), _arrays(b)
    assert left.keys() == right.keys()
    for path in left:
        np.testing.assert_array_equal(left[path][0], right[path][0], err_msg=path)
        assert left[path][1] == right[path][1], path
    assert _group_attrs(a, group) == _group_attrs(b, group)
