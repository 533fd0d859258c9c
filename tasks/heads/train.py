"""The training stage's work: the task that trains, exports, records and tidies one head, from a
checked request (tasks/heads/request.py).
"""

from __future__ import annotations

from dataclasses import asdict

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from store.artefacts import location
from tasks.data import load_model
from tasks.heads.export_head import export
from tasks.heads.request import Training
from tasks.heads.train_head import recipe_identity, train
from tasks.stage_key import current_record, stage_key, write_record


def training_key(training: Training) -> str:
    """A head's inputs: the activations (by their plan hash), its layers, its recipe and its export."""
    return stage_key(training.plan_hash, training.layers, recipe_identity(asdict(training.config)),
                     training.request.fmt, training.verifier)


def trained_record(out, key: str) -> dict | None:
    """The training record of the head at `out` when it was trained and exported from inputs with
    `key` (the record is written after the export), else None."""
    out = location(out)
    finished = current_record(out / "training.json", key)
    return finished if finished and (out / "config.json").is_file() else None


@task(name="train-draft-head", cache_policy=NO_CACHE)
def train_task(training: Training) -> dict:
    """Train, export, then record; the resume checkpoint (optimizer state included, larger than the
    export) is removed once the record is written, unless the request keeps it."""
    logger = get_run_logger()
    t, request, out = training, training.request, location(training.out)
    key = training_key(t)
    finished = trained_record(out, key)
    if finished:
        logger.info("head %s is already trained from these inputs", t.out)
        return {**finished, "reused": True}
    head, record = train(request.store, t.model_key, t.layers, out, t.config, log=logger.info,
                         device=load_model.pick_device(request.device))
    logger.info("trainable parameters: %d", record["trainable_parameters"])
    export(head, out, request.fmt, t.verifier["name_or_path"], speculative_tokens=t.config.ttt_steps,
           architectures=t.verifier["architectures"], num_layers=t.num_layers)
    write_record(out / "training.json", record, key)
    if not request.keep_checkpoint:
        (out / "checkpoint.pt").unlink(missing_ok=True)  # only a finished head loses it: resume is kept
    final = record["final"]
    create_table_artifact(
        key="draft-head-accuracy",
        table=[{"ttt_step": i, "held_out_accuracy": round(a, 4), "held_out_loss": round(l, 4),
                "untrained_accuracy": round(u, 4)}
               for i, (a, l, u) in enumerate(zip(final["accuracy"], final["loss"], record["untrained"]["accuracy"]))],
        description=f"EAGLE-3 head for {t.model_key} layers {t.layers} (HF indices)")
    return {**record, "reused": False}
