"""The shape of a model's activations group and the template written before any shard.

Like a pangeo-forge/xarray-beam template: every array is created up front with its final shape,
the cheap per-token arrays are filled at once, and the expensive ones are then written shard by
shard (one writer per shard, each write covering whole shards).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from store import schema
from store.dtypes import ZARR_DTYPE, filters

# About 1 MiB chunks and 64-256 MiB shards: small enough to read one layer cheaply, large enough
# that a store of millions of tokens has thousands of files, not millions.
CHUNK_BYTES = 1 << 20
SHARD_BYTES = 128 << 20


@dataclass(frozen=True)
class Layout:
    """Everything that fixes array shapes, chunks and shards."""

    n_layers: int  # N + 1 hidden-state entries
    n_tokens: int
    hidden_size: int
    topk: int
    tokens_per_chunk: int
    chunks_per_shard: int
    storage_dtype: str
    layers: list[int] | None = None  # HF indices of the stored entries (a training store); None: all, 0..N

    @property
    def stored_layers(self) -> list[int]:
        return list(self.layers) if self.layers is not None else list(range(self.n_layers))

    @property
    def shard_tokens(self) -> int:
        return self.tokens_per_chunk * self.chunks_per_shard

    @property
    def n_shards(self) -> int:
        return -(-self.n_tokens // self.shard_tokens)

    def shard_range(self, shard: int) -> tuple[int, int]:
        start = shard * self.shard_tokens
        return start, min(start + self.shard_tokens, self.n_tokens)

    def as_attrs(self) -> dict:
        """An all-layer store's attributes stay as they were before `layers` existed."""
        attrs = asdict(self)
        if self.layers is None:
            del attrs["layers"]
        return attrs


def auto_chunking(n_layers: int, hidden_size: int, itemsize: int = 2, tokens_per_chunk: int | None = None,
                  longest_document: int = 1) -> tuple[int, int]:
    """(tokens_per_chunk, chunks_per_shard) for ~1 MiB chunks (unless given) and ~128 MiB shards,
    powers of two; a shard holds at least `longest_document` tokens, since a document never
    crosses a shard's end (a wide model's 128 MiB would cut every document to a few hundred)."""
    token_bytes = hidden_size * itemsize
    tokens_per_chunk = tokens_per_chunk or _pow2_floor(max(16, CHUNK_BYTES // token_bytes))
    shard_tokens = _pow2_floor(max(tokens_per_chunk, SHARD_BYTES // (token_bytes * n_layers)))
    return tokens_per_chunk, max(1, shard_tokens // tokens_per_chunk, -(-longest_document // tokens_per_chunk))


def _pow2_floor(n: int) -> int:
    return 1 << (int(n).bit_length() - 1)


def checked_codecs() -> list:
    """zstd level 1: the smallest and among the fastest of the codecs measured on SmolLM2 states
    (0.78x of raw vs 0.79-0.92x for blosc variants; see README benchmarks). A crc32c per chunk, in
    every array of the group, lets `layerwave verify` (and every read) catch a flipped byte."""
    return [ZstdCodec(level=1), Crc32cCodec()]


def create_template(group: zarr.Group, layout: Layout, per_token: dict[str, np.ndarray], attrs: dict) -> None:
    """Create every array of the activations group and fill the per-token inputs.

    `attrs` (which carry the plan hash) are written last: a group without them is a template
    that was interrupted and may be rebuilt.
    """
    create_array = functools.partial(group.create_array, compressors=checked_codecs())
    token_chunks = (layout.shard_tokens,)
    create_array(
        schema.HIDDEN_STATES,
        shape=(layout.n_layers, layout.n_tokens, layout.hidden_size),
        chunks=(1, layout.tokens_per_chunk, layout.hidden_size),
        shards=(layout.n_layers, layout.shard_tokens, layout.hidden_size),
        dtype=ZARR_DTYPE[layout.storage_dtype],
        fill_value=0,
        filters=filters(layout.storage_dtype),
        dimension_names=[schema.LAYER, schema.TOKEN, schema.HIDDEN],
        attributes={"storage_dtype": layout.storage_dtype},
    )
    create_array(
        schema.ENTROPY, shape=(layout.n_tokens,), chunks=token_chunks, dtype="float32",
        fill_value=float("nan"), dimension_names=[schema.TOKEN],
        attributes={"units": "nats", "description": schema.LABELS_DOC},
    )
    create_array(
        schema.TOPK_IDS, shape=(layout.n_tokens, layout.topk), chunks=(layout.shard_tokens, layout.topk),
        dtype="int32", fill_value=-1, dimension_names=[schema.TOKEN, schema.TOPK],
    )
    create_array(
        schema.TOPK_LOGPROBS, shape=(layout.n_tokens, layout.topk), chunks=(layout.shard_tokens, layout.topk),
        dtype="float32", fill_value=float("nan"), dimension_names=[schema.TOKEN, schema.TOPK],
    )
    for name, values in per_token.items():
        array = create_array(name, shape=values.shape, chunks=token_chunks, dtype=values.dtype,
                             dimension_names=[schema.TOKEN])
        array[:] = values
    create_array(schema.LAYER, shape=(layout.n_layers,), chunks=(layout.n_layers,), dtype="int32",
                 dimension_names=[schema.LAYER])[:] = np.asarray(layout.stored_layers, dtype=np.int32)
    create_array(schema.TOKEN, shape=(layout.n_tokens,), chunks=token_chunks, dtype="int64",
                 dimension_names=[schema.TOKEN])[:] = np.arange(layout.n_tokens, dtype=np.int64)
    create_array(
        schema.SHARD_COMMITTED, shape=(layout.n_shards,), chunks=(1,), dtype="bool", fill_value=False,
        dimension_names=[schema.SHARD],
        attributes={"description": "True once the shard's hidden states and labels are written; one chunk per shard"},
    )
    group.attrs.update(attrs)
