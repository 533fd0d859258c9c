"""A zarr v3 codec that keeps a float32 array as bfloat16 on disk.

zarr 3.1 has no bfloat16 data type (numpy has none). Declaring the array float32 and putting this
codec first in its chain stores 2 bytes per value (the top half of each float32, rounded to
nearest even) while every reader gets float32 values back: zarr, xarray's plain `open_zarr` and
Dask alike, lazily, with no decoding step of their own. Readers find the codec through the
`zarr.codecs` entry point that installing layerwave registers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from zarr.abc.codec import ArrayArrayCodec
from zarr.core.dtype import parse_dtype
from zarr.registry import register_codec

NAME = "layerwave.bfloat16"


def to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 → the uint16 bits of the nearest bfloat16 (ties to even), as torch rounds."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    """The uint16 bits of bfloat16 values → float32 (exact: bfloat16 is float32's top half)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class BFloat16Codec(ArrayArrayCodec):
    is_fixed_size = True

    @classmethod
    def from_dict(cls, data: dict) -> "BFloat16Codec":
        return cls()

    def to_dict(self) -> dict:
        return {"name": NAME}

    def validate(self, *, shape, dtype, chunk_grid) -> None:
        if dtype.to_native_dtype() != np.dtype("float32"):
            raise ValueError(f"{NAME} encodes float32 arrays, not {dtype.to_native_dtype()}")

    def resolve_metadata(self, chunk_spec):
        fill = from_bfloat16_bits(to_bfloat16_bits(np.float32(chunk_spec.fill_value)))  # round-trips exactly
        return replace(chunk_spec, dtype=parse_dtype(np.dtype("uint16"), zarr_format=3),
                       fill_value=np.uint16(to_bfloat16_bits(fill)[()]))

    async def _decode_single(self, chunk_array, chunk_spec):
        values = from_bfloat16_bits(chunk_array.as_ndarray_like())
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(values)

    async def _encode_single(self, chunk_array, chunk_spec):
        bits = to_bfloat16_bits(chunk_array.as_ndarray_like())
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(bits)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec) -> int:
        return input_byte_length // 2


register_codec(NAME, BFloat16Codec)  # in-process, before the entry point is ever looked up
