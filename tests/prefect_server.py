"""One Prefect test server for every pytest-xdist worker of a test run: the first worker to ask
starts it, the last one to finish stops it by PID. A server on a fresh database spends about 20 s
of CPU on its start (mostly migrations), and each one running adds its own load to the cores the
tests share."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path

import httpx
from filelock import FileLock

from tests.processes import free_port


@contextmanager
def shared_server(folder: Path, env: dict[str, str], timeout: float = 180):
    """The API URL of the test run's server in `folder` (started with `env` added to this
    process's environment), held until the context ends."""
    state_file = folder / "prefect-server.json"
    with FileLock(f"{state_file}.lock"):
        state = json.loads(state_file.read_text()) if state_file.exists() else _start(folder, env, timeout)
        state["users"] += 1
        state_file.write_text(json.dumps(state))
    try:
        yield state["url"]
    finally:
        with FileLock(f"{state_file}.lock"):
            state = json.loads(state_file.read_text())
            state["users"] -= 1
            if state["users"]:
                state_file.write_text(json.dumps(state))
            else:
                _stop(state["pid"])
                state_file.unlink()


def copy_database(folder: Path, target: Path) -> None:
    """The test server's database, already migrated, copied (consistently, while it serves) to
    `target`: a second server started on the copy skips the ~12 s of CPU its migrations take."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(_database(folder))) as source, closing(sqlite3.connect(target)) as copy:
        source.backup(copy)


def _database(folder: Path) -> Path:
    return folder / "prefect-server.db"


def _start(folder: Path, env: dict[str, str], timeout: float) -> dict:
    """Prefect's own test server (uvicorn on its app factory, no UI), in a session of its own so it
    outlives the worker that started it."""
    port = free_port()
    database = f"sqlite+aiosqlite:///{_database(folder)}"
    with open(folder / "prefect-server.log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--host",
             "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"],
            env={**os.environ, **env, "PREFECT_UI_ENABLED": "0", "PREFECT_SERVER_DATABASE_CONNECTION_URL": database},
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + timeout
    # One client for every poll: each new httpx client loads the CA bundle (~50 ms of CPU), which
    # would take a third of a core from the starting server.
    with httpx.Client() as client:
        while True:
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return {"url": url, "pid": server.pid, "users": 0}
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                _stop(server.pid)
                raise RuntimeError(f"the Prefect test server did not start; see {folder / 'prefect-server.log'}")
            time.sleep(0.1)


def _stop(pid: int) -> None:
    """TERM, then KILL after 10 s; the server is no child of a later worker, so poll until it is gone."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                if _reaped(pid):
                    return
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _reaped(pid: int) -> bool:
    """Reap the server if this process started it (else it stays a zombie that os.kill still finds)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False
