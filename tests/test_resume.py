"""Re-runs skip committed shards; a SIGKILLed run resumes to a store identical to a clean run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import zarr

from flows.extract import extract
from tests.conftest import extract_options


def _arrays(store: str) -> dict:
    root = zarr.open_group(store, mode="r", use_consolidated=False)
    return {path: (array[...], dict(array.attrs)) for path, array in root.members(max_depth=None)
            if isinstance(array, zarr.Array)}


def _group_attrs(store: str, path: str) -> dict:
    return dict(zarr.open_group(store, path=path, mode="r", use_consolidated=False).attrs)


def assert_identical_stores(a: str, b: str, group: str) -> None:
    left, right = _arrays(a), _arrays(b)
    assert left.keys() == right.keys()
    for path in left:
        np.testing.assert_array_equal(left[path][0], right[path][0], err_msg=path)
        assert left[path][1] == right[path][1], path
    assert _group_attrs(a, group) == _group_attrs(b, group)


def test_rerun_of_a_finished_extraction_writes_nothing(tmp_path, corpus):
    options = extract_options(tmp_path / "s.zarr", corpus, tokens=600)
    first = extract(**options)
    second = extract(**options)
    assert first["tokens_written"] == 600 and second["tokens_written"] == 0
    assert second["committed"] == second["n_shards"]


def test_extraction_killed_at_five_points_resumes_to_an_identical_store(tmp_path, corpus, prefect_api):
    """SIGKILL mid-template, then four times at seeded random moments after a run's first new
    commit (often mid-write of the next shard); each re-run resumes; the end equals a clean run."""
    options = dict(tokens=6000, batch_tokens=256)
    extract(**extract_options(tmp_path / "clean.zarr", corpus, **options))

    killed = str(tmp_path / "killed.zarr")
    argv = [sys.executable, "-m", "flows.cli", "extract"]
    for name, value in extract_options(killed, corpus, **options).items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    delays = np.random.default_rng(20261129).uniform(0.0, 0.4, size=4)
    landed = []
    for point in range(5):
        before = _committed(killed)
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        if point == 0:
            _wait_until(lambda: os.path.exists(os.path.join(killed, "tiny-random-llama", "activations")), process)
        else:
            _wait_until(lambda: _committed(killed) > before, process)
            time.sleep(delays[point - 1])
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        landed.append(_committed(killed))
    total = zarr.open_group(killed, path="tiny-random-llama/activations", mode="r")["shard_committed"].shape[0]
    assert landed[-1] < total, f"the runs finished before the last kill ({landed})"
    assert landed == sorted(landed), landed  # no committed shard is ever lost

    resumed = extract(**extract_options(killed, corpus, **options))
    assert 0 < resumed["tokens_written"] < 6000
    assert_identical_stores(str(tmp_path / "clean.zarr"), killed, "tiny-random-llama/activations")


def _committed(store: str) -> int:
    try:
        return int(zarr.open_group(store, path="tiny-random-llama/activations", mode="r",
                                   use_consolidated=False)["shard_committed"][:].sum())
    except (FileNotFoundError, KeyError, zarr.errors.GroupNotFoundError, ValueError):
        return 0


def _wait_until(condition, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the extraction ended before it could be killed"
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError("the extraction made no progress in time")
