"""Storage dtypes for hidden states.

float16 halves the disk of float32 but overflows past 65504; bfloat16 keeps float32's range. zarr
3.1 has no bfloat16 dtype, so a bfloat16 array is declared float32 and kept as bfloat16 on disk by
a codec (store/bfloat16_codec.py): every reader gets float32 back. Stores written before that
codec hold the raw bits as uint16; `decode` still reads them.

Reading needs numpy alone: torch (3.5 s of import) is imported by the writers' functions only, so
analysis, selection, reports and `verify` start without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from store.bfloat16_codec import BFloat16Codec, from_bfloat16_bits
from store.errors import LayerwaveError

if TYPE_CHECKING:
    import torch

FLOAT16_MAX = 65504.0
STORAGE_DTYPES = ("float16", "bfloat16", "float32")
# Zarr dtype each storage dtype is declared as (bfloat16: float32 through the codec).
ZARR_DTYPE = {"float16": "float16", "bfloat16": "float32", "float32": "float32"}


def filters(storage_dtype: str) -> list:
    """The array-to-array codecs of a hidden-states array of `storage_dtype`."""
    return [BFloat16Codec()] if storage_dtype == "bfloat16" else []


def encode(hidden: torch.Tensor, storage_dtype: str) -> np.ndarray:
    """Convert hidden states (layers, tokens, hidden) to the array written to Zarr, refusing to
    store NaN, inf or a float16 overflow."""
    import torch

    finite = torch.isfinite(hidden)
    if not finite.all():
        where = f" (first at layer {int(torch.nonzero(~finite)[0, 0])})" if hidden.dim() == 3 else ""
        raise LayerwaveError(f"the model produced NaN/inf hidden states{where}; try --dtype float32, "
                             "and check the checkpoint")
    if storage_dtype == "float16":
        peak = float(hidden.abs().max()) if hidden.numel() else 0.0
        if peak > FLOAT16_MAX:
            raise LayerwaveError(
                f"hidden states reach |h|={peak:.4g}, beyond float16's range {FLOAT16_MAX:g}; "
                "re-run into a new --store with --storage-dtype bfloat16 or float32"
            )
        return hidden.to(torch.float16).numpy()
    return hidden.to(torch.float32).numpy()  # bfloat16: the codec rounds as torch does


def decode(stored: np.ndarray) -> np.ndarray:
    """A read block as float32: it already is, but for the raw bfloat16 bits (uint16) of a store
    written before the codec, which are shifted into float32's top half."""
    if stored.dtype == np.uint16:
        return from_bfloat16_bits(stored)
    return stored.astype(np.float32, copy=False)


def choose_storage_dtype(requested: str, compute_dtype: torch.dtype, probe_peak: float) -> str:
    """Pick the storage dtype: lossless for 16-bit models, float16 when the probe leaves headroom."""
    import torch

    if requested != "auto":
        if requested not in STORAGE_DTYPES:
            raise LayerwaveError(f"unknown --storage-dtype {requested!r}; use auto, {', '.join(STORAGE_DTYPES)}")
        return requested
    if compute_dtype == torch.bfloat16:
        return "bfloat16"
    if compute_dtype == torch.float16:
        return "float16"
    # Leave 4x headroom: the probe sees only the first documents.
    return "float16" if probe_peak * 4 <= FLOAT16_MAX else "bfloat16"
