"""The training stage's work: the task that trains, exports, records and tidies one head, from a
checked request (tasks/heads/request.py).
"""

from __future__ import annotations

from dataclasses import asdict

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from store.artefacts import location, read_json
from tasks.data import load_model
from tasks.heads.export_head import export, export_format, is_whole, load_exported
from tasks.heads.request import Training
from tasks.heads.train_head import recipe_identity, train
from tasks.stage_key import current_record, stage_key, write_record


def training_key(training: Training) -> str:
    """A head's inputs: the activations (by their plan hash), its layers, its recipe and its export."""
    return stage_key(training.plan_hash, training.layers, recipe_identity(asdict(training.config)),
                     training.request.fmt, training.verifier)


def weights_key(training: Training) -> str:
    """What a head's weights depend on: its inputs but the export's format and verifier."""
    return stage_key(training.plan_hash, training.layers, recipe_identity(asdict(training.config)))


def trained_record(out, key: str, field: str = "stage_key") -> dict | None:
    """The training record of the head at `out` when it was trained from inputs with `key` (in
    `field`) and its export is whole (the record is written after the export), else None."""
    out = location(out)
    finished = current_record(out / "training.json", key, field)
    return finished if finished and is_whole(out) else None


def export_for(head, training: Training) -> None:
    t = training
    export(head, t.out, t.request.fmt, t.verifier["name_or_path"], speculative_tokens=t.config.ttt_steps,
           architectures=t.verifier["architectures"], num_layers=t.num_layers)


def exported_head(training: Training):
    """The finished head at `training.out`, read back from its export (an SGLang export leaves the
    target's embeddings out: they come from the target)."""
    out = location(training.out)
    written = export_format(read_json(out / "config.json")["layerwave"]["format"])
    embeddings = None
    if not written.keeps_embeddings:
        embeddings = load_model.load(training.request.model, "cpu").model.get_input_embeddings().weight.float()
    return load_exported(out, embeddings)


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
    trained = trained_record(out, weights_key(t), "weights_key")
    if trained:  # only the format or the verifier changed: the weights stand
        logger.info("head %s is already trained from these inputs; exporting it again (%s, verifier %s)",
                    t.out, request.fmt, t.verifier["name_or_path"])
        export_for(exported_head(t), t)
        write_record(out / "training.json", trained, key)
        return {**trained, "reused": True}
    head, record = train(request.store, t.model_key, t.layers, out, t.config, log=logger.info,
                         device=load_model.pick_device(request.device))
    logger.info("trainable parameters: %d", record["trainable_parameters"])
    export_for(head, t)
    write_record(out / "training.json", {**record, "weights_key": weights_key(t)}, key)
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
