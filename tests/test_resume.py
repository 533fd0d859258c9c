"""Re-runs skip committed shards; a SIGKILLed run resumes to a store identical to a clean run."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import zarr

from flows.extract import extract
from store.read import open_activations
from tests.conftest import TINY, extract_options
from tests.processes import assert_identical_stores, cli_argv, committed, start, wait_until


def test_rerun_of_a_finished_extraction_writes_nothing(tmp_path, corpus):
    options = extract_options(tmp_path / "s.zarr", corpus, tokens=600)
    first = extract(**options)
    second = extract(**options)
    assert first["tokens_written"] == 600 and second["tokens_written"] == 0
    assert second["committed"] == second["n_shards"]


def test_the_same_corpus_spelled_relative_or_absolute_is_the_same_extraction(tmp_path, corpus, monkeypatch):
    """`layerwave run --store x.zarr` names its corpus folder as the store is spelled; the same run
    from another folder, or with an absolute --store, must find its store, not refuse it. The store
    keeps the spelling it was made with (a relative one keeps a study's keys the same on another
    machine)."""
    absolute = corpus.removeprefix("jsonl:")
    relative = f"jsonl:{os.path.basename(absolute)}"
    monkeypatch.chdir(os.path.dirname(absolute))
    store = str(tmp_path / "s.zarr")
    first = extract(**extract_options(store, relative, tokens=600))
    monkeypatch.chdir(tmp_path)
    again = extract(**extract_options(store, corpus, tokens=600))
    assert first["tokens_written"] == 600 and again["tokens_written"] == 0 and again["complete"]
    assert open_activations(store, TINY).attrs["corpus"]["spec"] == relative


def test_extraction_killed_at_three_points_resumes_to_an_identical_store(tmp_path, corpus, prefect_api):
    """SIGKILL mid-template, then twice at seeded random moments after a run's first new commit
    (often mid-write of the next shard); each re-run resumes; the end equals a clean run."""
    options = dict(tokens=3000, batch_tokens=256)
    extract(**extract_options(tmp_path / "clean.zarr", corpus, **options))

    killed = str(tmp_path / "killed.zarr")
    argv = cli_argv("extract", extract_options(killed, corpus, **options))
    delays = np.random.default_rng(20261129).uniform(0.0, 0.2, size=2)
    landed = []
    for point in range(3):
        before = committed(killed, TINY)
        process = start(argv, prefect_api)
        if point == 0:
            wait_until(lambda: os.path.exists(os.path.join(killed, TINY, "activations")), process)
        else:
            wait_until(lambda: committed(killed, TINY) > before, process)
            time.sleep(delays[point - 1])
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        landed.append(committed(killed, TINY))
    total = zarr.open_group(killed, path="tiny-random-llama/activations", mode="r")["shard_committed"].shape[0]
    assert landed[-1] < total, f"the runs finished before the last kill ({landed})"
    assert landed == sorted(landed), landed  # no committed shard is ever lost

    resumed = extract(**extract_options(killed, corpus, **options))
    assert 0 < resumed["tokens_written"] < 3000
    assert_identical_stores(str(tmp_path / "clean.zarr"), killed, "tiny-random-llama/activations")
