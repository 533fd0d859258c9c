"""Write a complete activations group from arrays you supply: for statistics tests and benchmarks
that need planted structure or shapes no real model here has (e.g. 33 layers × 4096)."""

from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np
import torch

from store import commit, paths, schema
from store.access import consolidate, open_root
from store.dtypes import encode
from store.layout import Layout, create_template


def write_synthetic(store: str, model_key: str, *, n_layers: int, hidden_size: int, n_tokens: int,
                    shard_values: Callable[[int, int], np.ndarray], entropy: np.ndarray | None = None,
                    doc_length: int = 64, tokens_per_chunk: int = 64, chunks_per_shard: int = 4,
                    storage_dtype: str = "float32") -> Layout:
    """`shard_values(start, stop)` returns float32 (n_layers, stop-start, hidden_size) for a token range."""
    layout = Layout(n_layers=n_layers, n_tokens=n_tokens, hidden_size=hidden_size, topk=1,
                    tokens_per_chunk=tokens_per_chunk, chunks_per_shard=chunks_per_shard, storage_dtype=storage_dtype)
    tokens = np.arange(n_tokens)
    entropy = np.linspace(0, 4, n_tokens, dtype=np.float32) if entropy is None else entropy.astype(np.float32)
    root = open_root(store)
    group = root.require_group(model_key).create_group(paths.ACTIVATIONS, overwrite=True)
    per_token = {schema.TOKEN_ID: (tokens % 1000).astype(np.int32), schema.DOC: (tokens // doc_length).astype(np.int32),
                 schema.POSITION: (tokens % doc_length).astype(np.int32),
                 schema.LOSS_MASK: np.ones(n_tokens, dtype=bool)}
    create_template(group, layout, per_token, attrs={
        "schema_version": schema.SCHEMA_VERSION, "layer_convention": schema.LAYER_CONVENTION,
        "model": {"source": "synthetic", "key": model_key}, "layout": layout.as_attrs(),
        "complete": False, "plan_hash": "synthetic-being-written"})
    # The plan hash names the values: a store rewritten in place with others must not keep the old
    # statistics, which are keyed on it.
    digest = hashlib.sha256(entropy.tobytes())
    for shard in range(layout.n_shards):
        start, stop = layout.shard_range(shard)
        values = torch.from_numpy(np.ascontiguousarray(shard_values(start, stop), dtype=np.float32))
        digest.update(values.numpy().tobytes())
        group[schema.HIDDEN_STATES][:, start:stop, :] = encode(values, storage_dtype)
        group[schema.ENTROPY][start:stop] = entropy[start:stop]
        commit.mark_committed(group, shard)
    group.attrs["plan_hash"] = f"synthetic-{digest.hexdigest()[:16]}"
    commit.mark_complete(group)
    consolidate(store)
    return layout
