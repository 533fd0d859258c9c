"""Deterministic identities of stage inputs: what makes a re-run skip a finished stage.

A stage stores the key of the inputs it was run with beside its output, written last; a re-run
with the same key does no work, a changed input or a deleted output re-runs that stage alone, and
a killed write never looks done. The key is a SHA-256 of canonical JSON, never Python's `hash()`
(salted per process, so useless across runs). Outputs are either a Zarr group (the key is an
attribute) or a JSON record (the key is a field).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, is_dataclass
from pathlib import Path


from store.access import open_existing, open_group
from store.artefacts import read_json, write_json


def without_later_defaults(record: dict, later: dict) -> dict:
    """`record` without the fields added after its kind of key was first published, where they hold
    the value everything had implicitly before: older stores, corpora and heads keep their keys."""
    return {name: value for name, value in record.items() if name not in later or value != later[name]}


def stage_key(*parts) -> str:
    return hashlib.sha256(json.dumps([_plain(p) for p in parts], sort_keys=True, default=str).encode()).hexdigest()[:32]


def _plain(value):
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


def group_is_current(store: str, path: str, key: str) -> bool:
    group = open_existing(store, path)
    return group is not None and group.attrs.get("stage_key") == key


def mark_group_current(store: str, path: str, key: str) -> None:
    """Call after the group's data is written."""
    open_group(store, path, "r+").attrs["stage_key"] = key


def current_record(path: Path, key: str, field: str = "stage_key") -> dict | None:
    """The JSON record at `path` when it was made from inputs with this key (in `field`), else None."""
    try:
        record = read_json(path)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return record if record.get(field) == key else None


def write_record(path: Path, record: dict, key: str) -> None:
    """Write the record with its key, whole or not at all (store/artefacts.py)."""
    write_json(path, {**record, "stage_key": key})
