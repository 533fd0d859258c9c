"""Faults a real run meets, caused for real in real processes: a SIGKILL during head training, a
second extraction of the same model at once, and a filesystem that refuses writes (a file-size
limit from the kernel, and a read-only store)."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from pathlib import Path

import pytest
import torch

from flows.cli import main
from flows.extract import extract
from store.lock import holder
from store.verify import verify
from tasks.extract.extract import extract_shard, prepare_store
from tasks.extract.request import ExtractRequest
from tests.conftest import LAYERS, TINY, extract_options
from tests.processes import assert_identical_stores, cli_argv, committed, error_line, run, start, wait_until
from tests.test_bad_input import snapshot

GROUP = f"{TINY}/activations"


def test_training_killed_after_a_checkpoint_resumes_to_the_same_head(training_store, tmp_path, prefect_api, caplog):
    """SIGKILL `layerwave train` once its first checkpoint lands; the same command then resumes
    and ends with exactly the weights of the same command run uninterrupted (threads: conftest.py).
    Only the killed run needs a process of its own; the others run in this one."""
    def train_argv(out):
        return cli_argv("train", {"model": TINY, "store": training_store, "layers": ",".join(map(str, LAYERS)),
                                  "preset": "smoke", "epochs": 1, "out": out}) + ["--keep-checkpoint"]  # to compare

    assert main(train_argv(tmp_path / "uninterrupted")[3:]) == 0  # in-process: the same command, minus a startup
    finished = torch.load(tmp_path / "uninterrupted" / "checkpoint.pt", weights_only=False)
    checkpoint = tmp_path / "killed" / "checkpoint.pt"
    process = start(train_argv(tmp_path / "killed"), prefect_api)
    wait_until(checkpoint.exists, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = torch.load(checkpoint, weights_only=False)["step"]
    assert killed_at < finished["step"], "the run finished before it was killed"

    assert main(train_argv(tmp_path / "killed")[3:]) == 0
    assert f"resuming from step {killed_at}/" in caplog.text
    final = torch.load(checkpoint, weights_only=False)["head"]
    assert final.keys() == finished["head"].keys()
    for name in final:
        assert torch.equal(final[name], finished["head"][name]), name


def test_a_second_extraction_is_refused_while_another_process_runs_one(tmp_path, corpus, extracted, prefect_api,
                                                                       capsys):
    """The first process is paused (SIGSTOP) while it holds the lock, so the second (the same
    command, in this process) surely meets it: exit 2, one line naming the lock's holder; the first
    then finishes."""
    store = tmp_path / "s.zarr"
    argv = cli_argv("extract", extract_options(store, corpus, batch_tokens=256))
    log = tmp_path / "first.log"
    with open(log, "w") as handle:
        first = start(argv, prefect_api, stderr=handle)
    wait_until(lambda: holder(str(store), TINY) == str(first.pid), first)  # locked, and its pid written
    os.kill(first.pid, signal.SIGSTOP)
    capsys.readouterr()
    try:
        assert main(argv[3:]) == 2
    finally:
        os.kill(first.pid, signal.SIGCONT)
    err = capsys.readouterr().err
    assert err.strip() == error_line(err), err  # exactly one line
    assert f"another extraction of {TINY} is writing to {store} (pid {first.pid}); wait for it to finish or " \
           "stop it, then re-run (finished shards are kept)" in err
    assert first.wait(timeout=300) == 0, log.read_text()
    assert verify(str(store)) == (True, [f"{TINY}: sound"])
    assert_identical_stores(extracted[0], str(store), GROUP)


def _limit_file_size() -> None:
    """In the child: the kernel refuses to grow any file past 128 KiB (EFBIG), as a full disk
    refuses a write; a hidden-states shard needs more, the template and the lock file less."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (128 << 10, 128 << 10))


_PR_CAPBSET_DROP, _CAP_DAC_OVERRIDE, _CAP_SETPCAP = 24, 1, 8


def _respect_file_modes() -> None:
    """In the child: root writes through any file mode by CAP_DAC_OVERRIDE; dropping it from the
    bounding set makes the exec'd process honour a read-only store like any other user."""
    if os.geteuid() == 0 and ctypes.CDLL(None, use_errno=True).prctl(_PR_CAPBSET_DROP, _CAP_DAC_OVERRIDE, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _can_drop_capabilities() -> bool:
    if os.geteuid() != 0:
        return True  # file modes already bind
    effective = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapEff"))
    return bool(int(effective.split()[1], 16) >> _CAP_SETPCAP & 1)


def _set_writable(path: Path, writable: bool) -> None:
    for item in [path, *path.rglob("*")]:
        mode = item.stat().st_mode
        item.chmod(mode | 0o200 if writable else mode & ~0o222)


def _interrupted_store(store: Path, corpus: str) -> dict:
    """What an interrupted run leaves: the template and shard 0 committed (by the tasks' own code)."""
    options = extract_options(store, corpus, batch_tokens=256)
    prepare_store.fn(ExtractRequest(**options))
    extract_shard.fn(str(store), TINY, 0, "cpu")
    return options


@pytest.mark.parametrize("refusal", ["file size limit", "read-only store"])
def test_a_refused_write_stops_with_one_line_keeps_committed_shards_and_resumes(refusal, tmp_path, corpus, extracted,
                                                                               prefect_api):
    if refusal == "read-only store" and not _can_drop_capabilities():
        pytest.skip("root without CAP_SETPCAP cannot be made to honour file modes")
    store = tmp_path / "s.zarr"
    options = _interrupted_store(store, corpus)
    before = snapshot(store)
    if refusal == "read-only store":
        _set_writable(store, False)
    try:
        result = run(cli_argv("extract", options), prefect_api,
                     preexec_fn=_limit_file_size if refusal == "file size limit" else _respect_file_modes)
    finally:
        _set_writable(store, True)
    assert result.returncode == 2, result.stderr
    reason = "File too large (EFBIG)" if refusal == "file size limit" else "Permission denied (EACCES)"
    assert error_line(result.stderr) == (
        f"layerwave: error: writing to store {store} failed: {reason}; free space on its disk or make it writable, "
        "then re-run the same command to resume (committed shards are kept)")
    assert snapshot(store) == before and committed(str(store), TINY) == 1
    sound, report = verify(str(store))
    assert not sound and report[0] == f"{TINY}: shards [1, 2, 3, 4, 5] are not committed (an extraction was " \
                                      "interrupted)" and report[1].startswith("  layerwave extract ")

    resumed = extract(**options)
    assert resumed["tokens_written"] == 1500 - 256
    assert_identical_stores(extracted[0], str(store), GROUP)
