"""The training stage's work: the request checked against the activations the caller opened, and
the task that trains, exports, records and tidies one head.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from store.artefacts import location
from store.errors import LayerwaveError
from tasks.data import load_model
from tasks.data.registry import check_group_model, store_key
from tasks.heads.export_head import export, to_runtime_ids
from tasks.heads.train_head import preset, train
from tasks.select.layer_ids import check_layers
from tasks.stage_key import current_record, stage_key, write_record


def check_request(ds, store: str, model: str, layers: list[int], preset_name: str, fmt: str,
                  ttt_steps: int | None = None, epochs: int | None = None, device: str = "auto",
                  **recipe) -> None:
    """Bad input fails here, before a flow or any training starts; `ds` is the model's activations
    in `store`, opened once by the caller."""
    model_key = store_key(model)
    check_group_model(ds.attrs.get("model", {}), model, store)
    for name in ("target_topk_ids", "target_topk_logprobs", "loss_mask"):
        if name not in ds:
            raise LayerwaveError(f"store {store} has no {name} for {model_key} (labels draft training needs); "
                                 "re-extract with this layerwave")
    check_layers(layers, ds.sizes["layer"])
    preset(preset_name, ttt_steps=ttt_steps, epochs=epochs, **recipe)
    load_model.pick_device(device)
    to_runtime_ids(layers, fmt, ds.sizes["layer"] - 1)  # a format the runtime can capture these layers for


@task(name="train-draft-head", cache_policy=NO_CACHE)
def train_task(store: str, model_key: str, layers: list[int], out: str, preset_name: str, seed: int,
               ttt_steps: int | None, fmt: str, verifier: dict, plan_hash: str, num_layers: int,
               epochs: int | None = None, device: str = "auto", recipe: dict | None = None,
               keep_checkpoint: bool = False) -> dict:
    """Train, export, then record; the resume checkpoint (optimizer state included, larger than the
    export) is removed once the record is written, unless `keep_checkpoint`. `plan_hash` and
    `num_layers` come from the activations the flow opened."""
    logger = get_run_logger()
    config = preset(preset_name, seed=seed, ttt_steps=ttt_steps, epochs=epochs, **(recipe or {}))
    key = stage_key(plan_hash, layers, config, fmt, verifier)
    finished = current_record(location(out) / "training.json", key)
    if finished and (location(out) / "config.json").is_file():  # the record is written after the export
        logger.info("head %s is already trained from these inputs", out)
        return {**finished, "reused": True}
    head, record = train(store, model_key, layers, location(out), config, log=logger.info,
                         device=load_model.pick_device(device))
    logger.info("trainable parameters: %d", record["trainable_parameters"])
    export(head, location(out), fmt, verifier["name_or_path"], speculative_tokens=config.ttt_steps,
           architectures=verifier["architectures"], num_layers=num_layers)
    write_record(location(out) / "training.json", record, key)
    if not keep_checkpoint:
        (location(out) / "checkpoint.pt").unlink(missing_ok=True)  # only a finished head loses it: resume is kept
    final = record["final"]
    create_table_artifact(
        key="draft-head-accuracy",
        table=[{"ttt_step": i, "held_out_accuracy": round(a, 4), "held_out_loss": round(l, 4),
                "untrained_accuracy": round(u, 4)}
               for i, (a, l, u) in enumerate(zip(final["accuracy"], final["loss"], record["untrained"]["accuracy"]))],
        description=f"EAGLE-3 head for {model_key} layers {layers} (HF indices)")
    return {**record, "reused": False}
