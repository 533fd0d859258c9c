"""Shared fixtures: an isolated Prefect (test harness), the tiny random model, a small corpus, and
one finished extraction that several tests read."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from filelock import FileLock

# Isolate Prefect and the model cache before prefect is imported anywhere.
_SESSION_DIR = tempfile.mkdtemp(prefix="layerwave-tests-")
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)
os.environ["PREFECT_HOME"] = os.path.join(_SESSION_DIR, "prefect")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
# No test reads a run's logs back from the API: neither this process nor any it starts ships them.
os.environ["PREFECT_LOGGING_TO_API_ENABLED"] = "false"
os.environ.setdefault("LAYERWAVE_CACHE", os.path.join(_SESSION_DIR, "cache"))

TINY = "tiny-random-llama"
LAYERS = [2, 4, 5]  # the EAGLE-3 default for the tiny model's 8 layers
# Small chunks and shards so a few thousand tokens make several shards.
SMALL_LAYOUT = {"tokens_per_chunk": 64, "chunks_per_shard": 4}


# The test server's background services (scheduling, late runs, triggers, event and task-run
# recording) serve no test here; with them and log shipping (above) off, the server's CPU over
# test_tree_decode.py and test_draft_head.py fell from 22 s to 13 s. The deployment tests start a
# real server of their own, with every service (tests/test_deployments.py).
IDLE_SERVICES = ["SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "REPOSSESSOR", "CANCELLATION_CLEANUP",
                 "CLEANUP_RECONCILER", "TRIGGERS", "EVENT_PERSISTER", "TASK_RUN_RECORDER"]


def run_folder(tmp_path_factory) -> Path:
    """This test run's folder, shared by its pytest-xdist workers."""
    folder = tmp_path_factory.getbasetemp()
    return folder.parent if "PYTEST_XDIST_WORKER" in os.environ else folder


IDLE_ENV = {f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in IDLE_SERVICES}
SERVER_FOLDER = pytest.StashKey[Path]()  # where the run's server keeps its state, in the starting process


def parallel_test_processes() -> int:
    """How many processes run tests side by side: the pytest-xdist workers (set in each of them), else one."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def share_the_cores(config) -> None:
    """CPU float sums depend on how many threads split them: one fixed count for each process that
    runs tests and every subprocess it starts (they inherit it), so trained weights compare bit for
    bit across them. Under pytest-xdist each worker takes its share of the cores; the process that
    starts the workers sets nothing, or its count would pass to them (two workers of two threads
    on two cores: twice the CPU time for the same work)."""
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        return
    threads = str(max(1, min(2, (os.cpu_count() or 1) // parallel_test_processes())))
    for variable, value in {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "MKL_DYNAMIC": "FALSE"}.items():
        os.environ.setdefault(variable, value)


@pytest.hookimpl(trylast=True)  # after pytest's own configure, which makes the run's temporary folder
def pytest_configure(config):
    """Each test process takes its share of the cores (before any test module imports torch). The
    process that starts the pytest-xdist workers (or runs the tests itself) launches the test server
    now, so its start overlaps the workers' imports and collection (about 20 s) instead of following
    them; it holds the server until the run ends."""
    from tests.prefect_server import reserve

    share_the_cores(config)
    if not hasattr(config, "workerinput") and not (config.option.collectonly or config.option.help):
        config.stash[SERVER_FOLDER] = run_folder(config._tmp_path_factory)
        reserve(config.stash[SERVER_FOLDER], IDLE_ENV)


def pytest_unconfigure(config):
    from tests.prefect_server import release

    if SERVER_FOLDER in config.stash:
        release(config.stash[SERVER_FOLDER])


@pytest.fixture(scope="session", autouse=True)
def prefect_api(tmp_path_factory):
    """One Prefect test server for the whole test run, shared by its pytest-xdist workers; yields
    its API URL for subprocesses."""
    import prefect.settings
    from prefect.events.worker import EventsWorker

    from tests.prefect_server import shared_server

    with shared_server(run_folder(tmp_path_factory), IDLE_ENV) as url:
        # No flow-run heartbeats in this process: a flow run's end waits for its heartbeat thread's
        # one-second sleep, about half a second per run, and the tests start hundreds of runs.
        with prefect.settings.temporary_settings(updates={prefect.settings.PREFECT_API_URL: url,
                                                          prefect.settings.PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield url
            EventsWorker.drain_all()  # this process's events reach the server before it may stop


@pytest.fixture(scope="session")
def tiny():
    from tasks.data.load_model import load

    return load(TINY, "cpu", "auto")


def write_corpus(path, n: int = 40) -> str:
    """A deterministic JSONL corpus of multi-turn conversations of varied length."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    with open(path, "w") as handle:
        for i in range(n):
            user = " ".join(words[(i + j) % len(words)] for j in range(5 + i % 7))
            reply = " ".join(words[(i * 3 + j) % len(words)] for j in range(10 + (i * 5) % 40))
            messages = [{"role": "user", "content": f"Question {i}: {user}?"},
                        {"role": "assistant", "content": reply}]
            if i % 3 == 0:
                messages += [{"role": "user", "content": "And then?"}, {"role": "assistant", "content": reply[::-1]}]
            handle.write(json.dumps({"messages": messages}) + "\n")
    return f"jsonl:{path}"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "chats.jsonl")


def extract_options(store, corpus, **overrides) -> dict:
    options = dict(model=TINY, corpus=corpus, tokens=1500, store=str(store), device="cpu", **SMALL_LAYOUT)
    options.update(overrides)
    return options


@pytest.fixture(scope="session")
def extracted(tmp_path_factory, corpus, prefect_api):
    """A finished tiny extraction with multi-document, padded batches (batch_tokens=256)."""
    from flows.extract import extract

    store = tmp_path_factory.mktemp("extracted") / "store.zarr"
    summary = extract(**extract_options(store, corpus, batch_tokens=256))
    return str(store), summary


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)` once per test run: under pytest-xdist the first worker to ask builds it (a
    file lock keeps the others waiting) and every worker reads the same folder, which tests only
    read. Without xdist, the lock is uncontended."""
    folder = run_folder(tmp_path_factory) / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def training_store(tmp_path_factory, prefect_api) -> str:
    """A tiny-model store of 12,000 ShareGPT tokens: enough documents for draft training."""
    from flows.extract import extract

    def build(folder):
        extract(**extract_options(folder / "store.zarr", "sharegpt", tokens=12000, tokens_per_chunk=256,
                                  chunks_per_shard=4))
    return str(built_once(tmp_path_factory, "train", build) / "store.zarr")


@pytest.fixture(scope="session")
def trained(training_store, tmp_path_factory):
    """A smoke-trained head on LAYERS: (head, training record, checkpoint dir)."""
    import torch

    from tasks.heads.train_head import preset, train

    def build(folder):
        (folder / "head").mkdir()
        torch.save(train(training_store, TINY, LAYERS, folder / "head", preset("smoke")), folder / "trained.pt")
    folder = built_once(tmp_path_factory, "head", build)
    head, record = torch.load(folder / "trained.pt", weights_only=False)
    return head, record, folder / "head"


GENERATION = dict(model=TINY, source="sharegpt", tokens=1200, max_new_tokens=24, batch_size=16, shard_size=16,
                  device="cpu")


@pytest.fixture(scope="session")
def regen(tmp_path_factory, prefect_api):
    """The tiny model's own greedy replies to ShareGPT prompts, extracted (float32, so the store
    holds exactly what decoding computes) and a warm-started head trained on them:
    (store, corpus spec, head directory)."""
    from flows.extract import extract
    from flows.generate import generate
    from flows.train import train_head

    def build(folder):
        corpus = generate(out=str(folder / "corpus"), **GENERATION)["corpus"]
        extract(**extract_options(folder / "store.zarr", corpus, tokens=100_000, storage_dtype="float32",
                                  tokens_per_chunk=256, chunks_per_shard=8))
        train_head(model=TINY, store=str(folder / "store.zarr"), layers=LAYERS, out=str(folder / "head"),
                   preset_name="smoke", epochs=2, warm_start=True)
    folder = built_once(tmp_path_factory, "regen", build)
    return str(folder / "store.zarr"), f"regen:{folder / 'corpus'}", str(folder / "head")


def saved_checkpoint(tiny, folder) -> str:
    """The tiny model saved as a plain Hugging Face checkpoint, as a user would register one."""
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return str(folder)


# The longest modules first: with `--dist loadfile --no-loadscope-reorder` (.ci/run) pytest-xdist
# hands whole modules to the workers in collection order, so a long module collected last would run
# alone at the end while the other core idles. (Without the flag xdist orders modules by their number
# of tests, which puts the few-test, long end-to-end modules last.) Ordered by seconds measured on a
# 2-core machine; modules not listed follow in their own order.
# test_generate.py comes two modules before test_tree_decode.py: both read the `regen` fixture, and
# the second to start would otherwise wait, its core idle, while the first builds it.
LONGEST_FIRST = ["test_deployments.py", "test_study.py", "test_faults.py", "test_pipeline.py", "test_busy_machine.py",
                 "test_bad_input.py", "test_generate.py", "test_resume.py", "test_scale_out.py", "test_tree_decode.py",
                 "test_draft_head.py", "test_stats_wide.py", "test_stats.py", "test_training_stores.py",
                 "test_precision.py", "test_user_mistakes.py", "test_hybrid_draft.py", "test_requests.py",
                 "test_readme.py", "test_spec_decode.py", "test_compare.py", "test_head_inputs.py", "test_selection.py",
                 "test_offline_tau.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
