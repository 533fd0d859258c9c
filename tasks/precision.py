"""bfloat16 where the device computes it natively: CUDA, or a CPU with bfloat16 instructions
(avx512_bf16, AMX), whose matrix products run about twice as fast as float32's. Elsewhere
bfloat16 is emulated and far slower than float32 (matrix products about 100x on an AVX2-only CPU),
so `auto` keeps float32 there and an explicit ask is refused rather than quietly made slow. Data
stages are the exception: their `--dtype` decides the values a corpus or store holds, so an
explicit bfloat16 runs anyway, with a warning."""

from __future__ import annotations

import torch

from store.errors import LayerwaveError

PRECISIONS = ("auto", "float32", "bfloat16")


def bf16_native(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` → bfloat16 where native, else float32; a precision the device lacks is refused."""
    if precision not in PRECISIONS:
        raise LayerwaveError(f"unknown --precision {precision!r}; use {', '.join(PRECISIONS)}")
    native = bf16_native(device)
    if precision == "bfloat16" and not native:
        raise LayerwaveError(f"--precision bfloat16: this {device.type} has no native bfloat16 (CUDA, or a CPU "
                             "with avx512_bf16 or AMX), so it would run slower than float32; use --precision auto "
                             "or float32")
    if precision == "auto":
        return "bfloat16" if native else "float32"
    return precision


def emulated_bfloat16_warning(dtype: str, device: torch.device) -> str | None:
    """One line for `generate`/`extract --dtype bfloat16` on a device that only emulates it."""
    if dtype != "bfloat16" or bf16_native(device):
        return None
    return (f"--dtype bfloat16: this {device.type} has no native bfloat16 (CUDA, or a CPU with avx512_bf16 or "
            "AMX), so it runs many times slower than float32; use --dtype auto unless the data must be bfloat16's")
