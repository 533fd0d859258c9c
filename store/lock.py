"""Writers of one model's activations: flocks the kernel releases if a writer dies (even SIGKILL).

A whole-store extraction holds the model's lock exclusively. Extraction part i of n (`--part`)
holds it shared, so the n parts run together but never beside a whole run, plus part i's own
lock exclusively, so the same part never runs twice. Parts take the short, blocking setup lock
around creating the template and finalizing, the only writes they share.

Lock files live in the system temp directory, keyed by the store's real path, so taking one
writes nothing into the store (a refused run leaves the store exactly as it was). They guard
writers on one machine; writers on several machines split the shards with `--part`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from store.access import is_local
from store.errors import LayerwaveError

WHOLE = (0, 1)  # (part index, part count) of an extraction that writes every shard
PARTS = "parts"  # what the model's lock file says while --part runs hold it shared


def lock_path(store: str, name: str) -> Path:
    digest = hashlib.sha256(os.path.realpath(store).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "layerwave-locks" / f"{digest}-{name}.lock"


def holder(store: str, model_key: str, part: tuple[int, int] = WHOLE) -> str | None:
    """PID text of a live writer that would refuse this one, or None when free (creates nothing)."""
    if not is_local(store):
        return None
    for path, mode in _locks(store, model_key, part):
        if path.exists():
            with open(path, "a+") as handle:
                try:
                    fcntl.flock(handle, mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.seek(0)
                    return handle.read().strip() or "unknown pid"
                fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def refuse_if_busy(store: str, model_key: str, part: tuple[int, int] = WHOLE) -> None:
    """Fail now, before any work, when another writer would refuse this one later."""
    pid = holder(store, model_key, part)
    if pid:
        raise _busy(store, model_key, pid)


def _busy(store: str, model_key: str, pid: str, activity: str = "extraction") -> LayerwaveError:
    who = "its --part runs" if pid == PARTS else f"pid {pid}"
    return LayerwaveError(f"another {activity} of {model_key} is writing to {store} ({who}); "
                          "wait for it to finish or stop it, then re-run (finished shards are kept)")


@contextmanager
def writer_lock(store: str, model_key: str, part: tuple[int, int] = WHOLE, activity: str = "extraction"):
    """Hold this writer's locks for the duration; fail at once if another writer conflicts."""
    if not is_local(store):  # object stores have no flock: split writers with --part
        yield
        return
    handles = []
    try:
        for path, mode in _locks(store, model_key, part):
            handles.append(_take(path, mode, store, model_key, activity))
        yield
    finally:
        for handle in handles:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


@contextmanager
def setup_lock(store: str, model_key: str):
    """Serialise template creation and finalization among the parts of one extraction."""
    if not is_local(store):
        yield
        return
    path = lock_path(store, f"{model_key}.setup")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocking: another part holds it for seconds at most
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _locks(store: str, model_key: str, part: tuple[int, int]) -> list[tuple[Path, int]]:
    index, count = part
    if count == 1:
        return [(lock_path(store, model_key), fcntl.LOCK_EX)]
    return [(lock_path(store, model_key), fcntl.LOCK_SH),
            (lock_path(store, f"{model_key}.part-{index + 1}-of-{count}"), fcntl.LOCK_EX)]


def _take(path: Path, mode: int, store: str, model_key: str, activity: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        pid = handle.read().strip() or "unknown pid"
        handle.close()
        raise _busy(store, model_key, pid, activity) from None
    handle.seek(0)  # the holder, for a refused writer's message; not a pid a writer before left behind
    handle.truncate()
    handle.write(str(os.getpid()) if mode == fcntl.LOCK_EX else PARTS)  # shared: several holders, no one pid
    handle.flush()
    return handle
