"""One writer per model: an exclusive flock the kernel releases if the writer dies (even SIGKILL).

The lock file lives in the system temp directory, keyed by the store's real path, so taking it
writes nothing into the store (a refused run leaves the store exactly as it was). It guards
writers on one machine; writers on several machines must split work by model.
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


def lock_path(store: str, model_key: str) -> Path:
    digest = hashlib.sha256(os.path.realpath(store).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "layerwave-locks" / f"{digest}-{model_key}.lock"


def holder(store: str, model_key: str) -> str | None:
    """PID text of a live writer holding the lock, or None when free (does not create anything)."""
    path = lock_path(store, model_key)
    if not is_local(store) or not path.exists():
        return None
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            return handle.read().strip() or "unknown pid"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


@contextmanager
def writer_lock(store: str, model_key: str):
    """Hold the model's write lock for the duration; fail at once if another writer has it."""
    if not is_local(store):  # object stores have no flock; one writer per model is on the user
        yield
        return
    path = lock_path(store, model_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip() or "unknown pid"
            raise LayerwaveError(
                f"another extraction of {model_key} is writing to {store} (pid {pid}); "
                "wait for it to finish or stop it, then re-run (finished shards are kept)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
