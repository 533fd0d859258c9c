"""The training flow: one draft head for one layer set, trained from the store and exported."""

from __future__ import annotations

from prefect import flow, get_run_logger

from store.paths import Workspace
from store.read import open_activations
from tasks.data import load_model
from tasks.data.registry import store_key
from tasks.heads.export_head import runtime_warning
from tasks.heads.train import check_request, train_task
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.select.layer_ids import eagle3_default


@flow(name="layerwave-train")
def train_head(model: str = DEFAULT_MODEL, store: str = DEFAULT_STORE, layers: list[int] | None = None,
               out: str | None = None, preset_name: str = "quick", seed: int = 0, ttt_steps: int | None = None,
               fmt: str = "vllm", epochs: int | None = None, device: str = "auto",
               warm_start: bool | None = None, freeze_lm_head: bool | None = None,
               lm_head_lr_scale: float | None = None, verifier: str | None = None,
               keep_checkpoint: bool = False) -> dict:
    """Train an EAGLE-3 head reading `layers` (HF indices) from the store on `device` (auto: CUDA
    when present); export it to `out`. The device is not part of the stage key: a head trained on
    either is the same head up to floating-point rounding. `warm_start`, `freeze_lm_head` and
    `lm_head_lr_scale` override the preset's recipe (None keeps it). `verifier` names the target
    in the export (default: its Hugging Face id from the registry, else its checkpoint path).
    `keep_checkpoint` keeps the training checkpoint of a finished head (to train it further)."""
    recipe = {"warm_start": warm_start, "freeze_lm_head": freeze_lm_head, "lm_head_lr_scale": lm_head_lr_scale}
    key = store_key(model)
    ds = open_activations(store, key)
    n = ds.sizes["layer"] - 1
    layers = list(layers) if layers is not None else eagle3_default(n) or []
    check_request(ds, store, model, layers, preset_name, fmt, ttt_steps, epochs, device, **recipe)
    out = out or str(Workspace(store).single_head(key, layers))
    target = load_model.verifier(ds.attrs["model"].get("argument", model))
    warning = runtime_warning(layers)
    if warning:
        get_run_logger().warning(warning)
    record = train_task(store, key, layers, out, preset_name, seed, ttt_steps, fmt,
                        {**target, "name_or_path": verifier or target["name_or_path"]}, ds.attrs["plan_hash"], n,
                        epochs, device, recipe, keep_checkpoint)
    return {"out": out, **{k: record[k] for k in ("layers", "steps", "trainable_parameters", "untrained", "final",
                                                   "tokens_per_s", "reused")}}
