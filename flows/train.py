"""The training flow: one draft head for one layer set, trained from the store and exported."""

from __future__ import annotations

from prefect import flow, get_run_logger

from tasks.heads.export_head import runtime_warning
from tasks.heads.request import TrainedHead, TrainRequest
from tasks.heads.train import train_task
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import checked


@flow(name="layerwave-train")
def train_head(model: str = DEFAULT_MODEL, store: str = DEFAULT_STORE, layers: list[int] | None = None,
               out: str | None = None, preset_name: str = "quick", seed: int = 0, ttt_steps: int | None = None,
               fmt: str = "vllm", epochs: int | None = None, device: str = "auto",
               warm_start: bool | None = None, freeze_lm_head: bool | None = None,
               lm_head_lr_scale: float | None = None, verifier: str | None = None,
               keep_checkpoint: bool = False, precision: str = "auto", layer_scaling: bool | None = None,
               loss_on_prompt: bool | None = None, ttt_warmup: float | None = None,
               attend_self: float | None = None) -> TrainedHead:
    """Train an EAGLE-3 head reading `layers` (HF indices) from the store on `device` (auto: CUDA
    when present); export it to `out`. The parameters are `TrainRequest`'s fields. The device is not
    part of the stage key: a head trained on either is the same head up to floating-point rounding."""
    training = checked(TrainRequest(model, store, layers, out, preset_name, seed, ttt_steps, fmt, epochs, device,
                                    warm_start, freeze_lm_head, lm_head_lr_scale, verifier, keep_checkpoint,
                                    precision, layer_scaling, loss_on_prompt, ttt_warmup, attend_self))
    warning = runtime_warning(training.layers)
    if warning:
        get_run_logger().warning(warning)
    record = train_task(training)
    return TrainedHead(training.out, **{k: record[k] for k in ("layers", "steps", "trainable_parameters", "untrained",
                                                               "final", "tokens_per_s", "reused")})
