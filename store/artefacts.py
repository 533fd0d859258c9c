"""The files beside a store (heads, records, reports, corpora), read and written the same way on a
local disk and in an object store.

Every location is a `UPath`: a local path is still a `pathlib.Path`, `s3://…` an fsspec path, so
no caller branches on where a file lives. A write is whole or absent: on a local disk through a
staging file renamed into place (a kill leaves the old file or none), in an object store through
one PUT, which is atomic by itself.
"""

from __future__ import annotations

import io
import json
import os

from upath import UPath

from store.access import is_local


def location(path) -> UPath:
    """A str, Path or UPath as a UPath (`s3://…` stays remote, anything else is local)."""
    return path if isinstance(path, UPath) else UPath(path)


def write_bytes(path, data: bytes) -> UPath:
    path = location(path)
    if not is_local(str(path)):
        path.write_bytes(data)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    with open(staging, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staging, path)
    return path


def write_text(path, text: str) -> UPath:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path, value) -> UPath:
    return write_text(path, json.dumps(value, indent=2) + "\n")


def read_json(path):
    return json.loads(location(path).read_text(encoding="utf-8"))


def write_figure(figure, path, metadata: dict | None = None) -> UPath:
    """A matplotlib figure as a PNG, with `metadata` as its text fields (savefig cannot write to an
    object store itself)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, metadata=metadata)
    return write_bytes(path, buffer.getvalue())


def copy(source, target) -> UPath:
    return write_bytes(target, location(source).read_bytes())
