"""The one pass over activations: Dask reduces per-shard moments into statistics for every filter.

Work is tiled by layer groups so that memory is bounded by `memory_bytes` whatever the number of
tokens or the width; each Dask task reads whole store shards of its tile's layers, accumulates
moments for every token filter, and partial moments are summed in a tree. Widths whose blocks
would not fit on disk are sketched: every layer is projected to `sketch_dim` features by one
seeded Gaussian matrix (Johnson-Lindenstrauss; Gram matrices, hence CKA and the Gram spectrum,
are preserved approximately; the error is measured in tests/test_stats_wide.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dask
import numpy as np
import zarr

from store import paths, schema
from store.access import open_group
from store.dtypes import decode
from store.layout import Layout
from store.stats_store import create_stats_group
from tasks.stats.measures import tile_pairs
from tasks.stats.moments import TileMoments, accumulate

MAX_STATS_BYTES = 4 << 30  # disk for one filter's covariance blocks before sketching kicks in
SKETCH_SEED = 20261129


@dataclass(frozen=True)
class PassConfig:
    memory_bytes: int = 4 << 30
    partitions: int = 2
    sketch_dim: int | None = None  # None: exact unless the blocks exceed MAX_STATS_BYTES
    dask_address: str | None = None


def effective_dim(n_layers: int, d: int, sketch_dim: int | None) -> int:
    """Features per layer the statistics keep: d, or a sketch when exact blocks are too big."""
    if sketch_dim is not None:
        return min(sketch_dim, d)
    pairs = n_layers * (n_layers + 1) // 2
    if pairs * d * d * 8 <= MAX_STATS_BYTES:
        return d
    return 1 << int(math.log2(math.sqrt(MAX_STATS_BYTES / (pairs * 8))))


def layer_groups(n_layers: int, d: int, n_filters: int, config: PassConfig) -> list[list[int]]:
    """Split layers into groups so every task's accumulators and products fit the memory budget."""
    per_feature_pair = (config.partitions + 2) * (8 * n_filters + 4)
    width = max(d, int(math.sqrt(config.memory_bytes / per_feature_pair)))
    size = max(1, min(n_layers, width // d))
    return [list(range(start, min(start + size, n_layers))) for start in range(0, n_layers, size)]


def projection(d: int, k: int) -> np.ndarray | None:
    if k >= d:
        return None
    return (np.random.default_rng(SKETCH_SEED).standard_normal((d, k)) / math.sqrt(k)).astype(np.float32)


def read_layers(array: zarr.Array, layers: list[int], start: int, stop: int) -> np.ndarray:
    """float32 (layers, tokens, d) for one token range.

    Reads each run of consecutive layers with a plain slice: zarr 3.1's orthogonal (index-array)
    selection peaked at ~40x the bytes it returned on a 33-layer shard.
    """
    runs, first = [], 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or layers[i] != layers[i - 1] + 1:
            runs.append(array[layers[first]: layers[i - 1] + 1, start:stop, :])
            first = i
    return decode(np.concatenate(runs) if len(runs) > 1 else runs[0])


def partial_moments(store: str, group_path: str, ranges: list[tuple[int, int]], rows: list[int], cols: list[int],
                    masks: dict[str, np.ndarray], shift: np.ndarray, proj: np.ndarray | None) -> dict[str, TileMoments]:
    """Moments of one tile over some whole shards (`masks` cover exactly those tokens, in order)."""
    array = open_group(store, group_path)[schema.HIDDEN_STATES]
    diagonal = rows == cols
    layers = sorted(set(rows) | set(cols))
    where = {layer: i for i, layer in enumerate(layers)}
    d = shift.shape[1] if proj is None else proj.shape[1]
    result = {key: TileMoments.zeros(len(rows), len(cols), d) for key in masks}
    offset = 0
    for start, stop in ranges:
        block = read_layers(array, layers, start, stop) - shift[layers][:, None, :]
        if proj is not None:
            block = block @ proj
        for key, mask in masks.items():
            kept = block[:, mask[offset: offset + stop - start]]
            row_block = kept[[where[layer] for layer in rows]]
            accumulate(result[key], row_block, None if diagonal else kept[[where[layer] for layer in cols]])
        offset += stop - start
    return result


def _sum(parts: list[dict[str, TileMoments]]) -> dict[str, TileMoments]:
    total = parts[0]
    for part in parts[1:]:
        total = {key: total[key] + part[key] for key in total}
    return total


def _tree_sum(parts):
    """Pairwise delayed sums, so no task holds more than two partials."""
    while len(parts) > 1:
        parts = [dask.delayed(_sum)(parts[i:i + 2]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def compute_tile(store: str, group_path: str, layout: Layout, rows, cols, masks, shift, proj,
                 config: PassConfig, scheduler) -> dict[str, TileMoments]:
    shards = [layout.shard_range(s) for s in range(layout.n_shards)]
    per_part = math.ceil(len(shards) / max(1, config.partitions))
    parts = []
    for first in range(0, len(shards), per_part):
        ranges = shards[first: first + per_part]
        lo, hi = ranges[0][0], ranges[-1][1]
        part_masks = {key: mask[lo:hi] for key, mask in masks.items()}
        parts.append(dask.delayed(partial_moments)(store, group_path, ranges, rows, cols, part_masks, shift, proj))
    (total,) = dask.compute(_tree_sum(parts), **scheduler)
    return total


def provisional_shift(store: str, group_path: str, layout: Layout, masks: dict[str, np.ndarray]) -> np.ndarray:
    """Per-layer mean of the first shard's tokens that some filter keeps: subtracting it keeps the
    sums of squares accurate. Over every token instead, a first token's massive activation (or
    padding) would shift the kept ones far from 0, and their float32 products would lose what
    debiased CKA measures."""
    array = open_group(store, group_path)[schema.HIDDEN_STATES]
    start, stop = layout.shard_range(0)
    kept = np.logical_or.reduce([mask[start:stop] for mask in masks.values()])
    block = read_layers(array, list(range(layout.n_layers)), start, stop)
    return block[:, kept if kept.any() else slice(None)].mean(axis=1, dtype=np.float64).astype(np.float32)


def accumulate_statistics(store: str, model_key: str, masks: dict[str, np.ndarray], config: PassConfig,
                          source: dict, scheduler: dict, progress=None) -> dict:
    """Run the pass and write `<model>/stats/<filter>` for every mask; returns small metadata."""
    group_path = paths.activations(model_key)
    layout = Layout(**open_group(store, group_path).attrs["layout"])
    d = effective_dim(layout.n_layers, layout.hidden_size, config.sketch_dim)
    proj = projection(layout.hidden_size, d)
    shift = provisional_shift(store, group_path, layout, masks)
    groups = layer_groups(layout.n_layers, d, len(masks), config)
    tiles = [(a, b) for a in range(len(groups)) for b in range(a, len(groups))]
    outputs = {key: create_stats_group(store, model_key, key, layout.n_layers, d) for key in masks}
    # Each array opened once: on an object store every `group[name]` is two requests, and the
    # covariance is written block by block.
    arrays = {key: {name: group[name] for name in ("covariance", "trace", "mean")} for key, group in outputs.items()}
    frobenius2 = {key: np.full((layout.n_layers,) * 2, np.nan) for key in masks}
    hsic = {key: np.full((layout.n_layers,) * 2, np.nan) for key in masks}
    for done, (a, b) in enumerate(tiles, 1):
        rows, cols = groups[a], groups[b]
        total = compute_tile(store, group_path, layout, rows, cols, masks, shift, proj, config, scheduler)
        for key, moments in total.items():
            out, n = arrays[key], int(moments.count)
            for left, right, block, frob, h in tile_pairs(moments, rows, cols, d):
                if left <= right:
                    out["covariance"][left, right] = block
                frobenius2[key][left, right] = frobenius2[key][right, left] = frob
                hsic[key][left, right] = hsic[key][right, left] = h
            if a == b:
                out["trace"][rows] = moments.row_sq - np.einsum("ld,ld->l", moments.row_sums, moments.row_sums) / n
                shift_part = shift[rows].astype(np.float64) if proj is None else shift[rows].astype(np.float64) @ proj
                out["mean"][rows] = moments.row_sums / n + shift_part
        if progress:
            progress(done, len(tiles))
    for key, out in outputs.items():
        out["frobenius2"][:] = frobenius2[key]
        out["hsic"][:] = hsic[key]
        out.attrs.update({"tokens_kept": int(masks[key].sum()), "tokens_total": layout.n_tokens, "filter": key,
                          "features": d, "sketch_dim": d if proj is not None else None,
                          "sketch_seed": SKETCH_SEED if proj is not None else None,
                          "layer_groups": len(groups), "source": source, "complete": True})
    return {"filters": list(masks), "features": d, "sketched": proj is not None, "tiles": len(tiles),
            "layer_groups": len(groups)}


def is_current(group: zarr.Group | None, source: dict, n_layers: int, d: int, config: PassConfig) -> bool:
    """Whether stored statistics were made from these activations with this sketch setting."""
    return (group is not None and group.attrs.get("source") == source
            and group.attrs.get("features") == effective_dim(n_layers, d, config.sketch_dim))
