"""Storage dtypes for hidden states.

float16 halves the disk of float32 but overflows past 65504; bfloat16 keeps float32's range and
is stored as its raw uint16 bits because zarr 3.1 on Python 3.11 has no bfloat16 dtype.
"""

from __future__ import annotations

import numpy as np
import torch

from store.errors import LayerwaveError

FLOAT16_MAX = 65504.0
STORAGE_DTYPES = ("float16", "bfloat16", "float32")
# Zarr dtype each storage dtype is written as.
ZARR_DTYPE = {"float16": "float16", "bfloat16": "uint16", "float32": "float32"}


def encode(hidden: torch.Tensor, storage_dtype: str) -> np.ndarray:
    """Convert hidden states (layers, tokens, hidden) to the array written to Zarr, refusing to
    store NaN, inf or a float16 overflow."""
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
    if storage_dtype == "bfloat16":
        return hidden.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return hidden.to(torch.float32).numpy()


def decode(stored: np.ndarray, storage_dtype: str) -> np.ndarray:
    """Stored array back to float32 (bfloat16 bits are shifted into float32's top half)."""
    if storage_dtype == "bfloat16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(np.float32)


def choose_storage_dtype(requested: str, compute_dtype: torch.dtype, probe_peak: float) -> str:
    """Pick the storage dtype: lossless for 16-bit models, float16 when the probe leaves headroom."""
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
