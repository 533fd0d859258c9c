"""Shard commit markers: a shard counts only once its data is written, and the marker goes last.

Markers live in a bool array with one chunk per shard, so concurrent writers of different shards
never touch the same object.
"""

from __future__ import annotations

import numpy as np
import zarr

from store import schema


def committed(group: zarr.Group) -> np.ndarray:
    return np.asarray(group[schema.SHARD_COMMITTED][:], dtype=bool)


def is_committed(group: zarr.Group, shard: int) -> bool:
    return bool(group[schema.SHARD_COMMITTED][shard])


def mark_committed(group: zarr.Group, shard: int) -> None:
    group[schema.SHARD_COMMITTED][shard] = True


def mark_complete(group: zarr.Group) -> None:
    """Flag the group complete; only called after every shard is committed."""
    if not committed(group).all():
        raise RuntimeError("refusing to mark an activations group complete with uncommitted shards")
    group.attrs["complete"] = True
