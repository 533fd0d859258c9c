"""Reaching a user's Dask cluster (`--dask-address`), shared by the analysis pass and the heads'
fan-out: one clear line when nothing answers, at once rather than after Dask's retries."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from store.errors import LayerwaveError


def reachable(address: str, instead: str) -> None:
    """Raise one line where no scheduler listens at `address`, saying that leaving --dask-address
    out will `instead` (e.g. "compute locally")."""
    try:
        _connect_once(address)
    except (OSError, TimeoutError) as err:
        raise _unreachable(address, err, instead) from None


def connect(address: str, instead: str):
    """A distributed Client of the scheduler at `address` (see `reachable`)."""
    from distributed import Client

    reachable(address, instead)
    try:
        return Client(address, timeout="10s")
    except (OSError, TimeoutError) as err:
        raise _unreachable(address, err, instead) from None


def _unreachable(address: str, err: Exception, instead: str) -> LayerwaveError:
    return LayerwaveError(f"cannot reach a Dask scheduler at --dask-address {address} ({err}); start one "
                          f"(`dask scheduler`, then `dask worker ADDRESS`) or leave --dask-address out to {instead}")


def _connect_once(address: str) -> None:
    """A refused TCP address fails in milliseconds, where Dask's Client would keep retrying until
    its timeout."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme == "tcp" and parts.hostname and parts.port:
        socket.create_connection((parts.hostname, parts.port), timeout=10).close()
