"""One Prefect test server for every pytest-xdist worker of a test run: the process that starts
the workers launches it before they collect (conftest.py), and the last holder stops it by PID. A
server on a fresh database spends about 20 s of CPU on its start (mostly migrations), and each one
running adds its own load to the cores the tests share."""

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
    state = reserve(folder, env)
    try:
        _wait_until_up(folder, state, timeout)
        yield state["url"]
    finally:
        release(folder)


def reserve(folder: Path, env: dict[str, str]) -> dict:
    """Hold the run's server, launching it if no one has: it may still be starting on return."""
    state_file = _state_file(folder)
    with FileLock(f"{state_file}.lock"):
        state = json.loads(state_file.read_text()) if state_file.exists() else _launch(folder, env)
        state["users"] += 1
        state_file.write_text(json.dumps(state))
    return state


def release(folder: Path) -> None:
    """Let go of the run's server; the last holder stops it."""
    state_file = _state_file(folder)
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


def _state_file(folder: Path) -> Path:
    """The server's URL, PID and holder count, read and written under its file lock."""
    return folder / "prefect-server.json"


def _launch(folder: Path, env: dict[str, str]) -> dict:
    """Prefect's own test server (uvicorn on its app factory, no UI), in a session of its own so it
    outlives the process that started it."""
    port = free_port()
    database = f"sqlite+aiosqlite:///{_database(folder)}"
    with open(folder / "prefect-server.log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--host",
             "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"],
            env={**os.environ, **env, "PREFECT_UI_ENABLED": "0", "PREFECT_SERVER_DATABASE_CONNECTION_URL": database},
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    return {"url": f"http://127.0.0.1:{port}/api", "pid": server.pid, "users": 0}


def _wait_until_up(folder: Path, state: dict, timeout: float) -> None:
    """Poll the server's health until it answers; fail if it exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    # One client for every poll: each new httpx client loads the CA bundle (~50 ms of CPU), which
    # would take a third of a core from the starting server.
    with httpx.Client() as client:
        while True:
            try:
                if client.get(f"{state['url']}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if not _alive(state["pid"]) or time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect test server did not start; see {folder / 'prefect-server.log'}")
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Whether the server still runs (reaping it first where this process started it)."""
    if _reaped(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(pid: int) -> None:
    """TERM, then KILL after 10 s; the server is no child of a later worker, so poll until it is gone."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)


def _reaped(pid: int) -> bool:
    """Reap the server if this process started it (else it stays a zombie that os.kill still finds)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False
