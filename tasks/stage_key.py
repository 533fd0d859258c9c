"""Deterministic identities of stage inputs: what makes a re-run skip a finished stage.

A stage stores the key of the inputs it was run with beside its output; a re-run with the same
key does no work, a changed input or a deleted output re-runs that stage alone. The key is a
SHA-256 of canonical JSON, never Python's `hash()` (salted per process, so useless across runs).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, is_dataclass


def stage_key(*parts) -> str:
    return hashlib.sha256(json.dumps([_plain(p) for p in parts], sort_keys=True, default=str).encode()).hexdigest()[:32]


def _plain(value):
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
