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


def test_killed_extraction_resumes_to_an_identical_store(tmp_path, corpus, prefect_api):
    options = extract_options(tmp_path / "clean.zarr", corpus, tokens=3000, batch_tokens=256)
    extract(**options)

    killed = str(tmp_path / "killed.zarr")
    argv = [sys.executable, "-m", "flows.cli", "extract"]
    for name, value in extract_options(killed, corpus, tokens=3000, batch_tokens=256).items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    committed = _wait_for_some_shards(killed, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    marks = zarr.open_group(killed, path="tiny-random-llama/activations", mode="r")["shard_committed"][:]
    assert 0 < marks.sum() < len(marks), f"kill landed outside the run ({committed} shards committed)"

    resumed = extract(**extract_options(killed, corpus, tokens=3000, batch_tokens=256))
    assert 0 < resumed["tokens_written"] < 3000
    assert_identical_stores(str(tmp_path / "clean.zarr"), killed, "tiny-random-llama/activations")


def _wait_for_some_shards(store: str, process: subprocess.Popen, timeout: float = 180) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the extraction ended before it could be killed"
        try:
            marks = zarr.open_group(store, path="tiny-random-llama/activations", mode="r",
                                    use_consolidated=False)["shard_committed"][:]
        except (FileNotFoundError, KeyError, zarr.errors.GroupNotFoundError, ValueError):
            marks = np.zeros(1, dtype=bool)
        if marks.any():
            return int(marks.sum())
        time.sleep(0.01)
    raise AssertionError("no shard was committed in time")
