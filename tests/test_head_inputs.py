"""What a head reads: per-layer input scaling (folded into fc at export) and the shuffled-layer
diagnostic that shows which layers a trained head uses."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import torch
import zarr

from tasks.heads.export_head import export, load_exported
from tasks.heads.train_data import StoreBatches
from tasks.heads.train_head import build_head, preset, train
from tests.conftest import LAYERS, TINY


def test_an_export_folds_the_layer_scaling_into_fc(training_store, tmp_path):
    """The runtimes load fc.weight × scale as plain fc.weight: the reloaded head (scale 1) gives the
    scaled head's logits from the same raw states."""
    data = StoreBatches(training_store, TINY, LAYERS, seq_len=32, batch_size=2, seed=0)
    head = build_head(data, replace(preset("smoke"), layer_scaling=True)).eval()
    rms = data.layer_rms()
    assert torch.allclose(head.aux_scale.view(len(LAYERS), -1)[:, 0], torch.from_numpy(1 / rms).float())
    assert len(set(np.round(rms, 3))) == len(LAYERS)  # the tiny model's layers differ in scale too
    reloaded = load_exported(export(head, tmp_path / "vllm", "vllm", verifier=TINY))
    assert torch.equal(reloaded.aux_scale, torch.ones_like(reloaded.aux_scale))
    batch = next(data.batches(data.plan(0)))
    with torch.no_grad():
        def logits(model):
            return model.logits(model.step(model.fuse(batch.aux), batch.input_ids, batch.positions, []))
        assert torch.allclose(logits(head), logits(reloaded), atol=1e-5)


def one_layer_carries_the_label(source: str, copy, carrier: int, labels: int = 40) -> None:
    """Rewrite a copy of `source`: the target's argmax at each token becomes a random id of `labels`
    (certain: top-1 log-probability 0), the carrier layer's state at t encodes the label at t+1 (what
    step 0 at t is taught), and every other layer holds noise."""
    shutil.copytree(source, copy)
    group = zarr.open_group(str(copy), path=f"{TINY}/activations", mode="a")
    rng = np.random.default_rng(0)
    ids, logprobs, hidden = group["target_topk_ids"], group["target_topk_logprobs"], group["hidden_states"]
    n, size = ids.shape[0], hidden.shape[-1]
    label = rng.integers(1, labels + 1, n)
    top = ids[:]
    top[:, 0] = label
    ids[:] = top
    certain = np.full(logprobs.shape, -20.0, dtype=logprobs.dtype)
    certain[:, 0] = 0.0
    logprobs[:] = certain
    code = rng.choice([-1.0, 1.0], size=(labels + 1, size))
    for slot in range(hidden.shape[0]):
        states = rng.normal(size=(n, size))
        if slot == carrier:
            states[:-1] = code[label[1:]]
        hidden[slot] = states.astype(hidden.dtype)


def test_shuffling_the_layer_that_carries_the_label_costs_accuracy_and_the_others_nothing(training_store,
                                                                                             tmp_path):
    copy = tmp_path / "one-layer.zarr"
    one_layer_carries_the_label(training_store, copy, carrier=4)
    once = replace(preset("smoke"), ttt_steps=1, eval_every=10**9)  # one evaluation, at the end
    _, record = train(str(copy), TINY, LAYERS, tmp_path / "head", once)
    use = record["final"]["layer_use"]
    assert use["accuracy"] > 0.5, use
    assert use["drop"][4] > 0.4, use
    assert abs(use["drop"][2]) < 0.05 and abs(use["drop"][5]) < 0.05, use
