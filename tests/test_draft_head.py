"""EAGLE-3 draft heads trained from the store: learning, exact resume, vocabulary, exports, layers."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import zarr

from flows.cli import main
from store.errors import LayerwaveError
from store.read import open_activations
from tasks.heads.draft_head import draft_vocabulary, target_to_draft
from tasks.heads.export_head import export, from_runtime_ids, load_exported, to_runtime_ids
from tasks.heads.train_data import StoreBatches
from tasks.heads.train_head import build_head, preset, train
from tasks.heads.ttt import score, unroll
from tests.conftest import LAYERS, TINY


def test_held_out_loss_falls_and_the_accuracy_is_reported_over_every_reply_position(trained):
    """The tiny random target's next-token distributions are nearly flat (log-probabilities about
    −10.1 to −10.2 over a 49k vocabulary), so its argmax is noise a head cannot learn; the loss
    is what falls. That a head learns what its inputs carry is tested on a store where a layer
    carries the label (test_head_inputs.py)."""
    _, record, _ = trained
    first, last = record["history"][0], record["final"]
    assert record["finished"] and record["steps"] == record["total_steps"]
    assert last["loss"][0] < first["loss"][0] < record["untrained"]["loss"][0]
    assert len(last["accuracy"]) == preset("smoke").ttt_steps
    for accuracy, in_vocab, coverage in zip(last["accuracy"], last["accuracy_in_vocab"], last["coverage"]):
        assert 0.5 < coverage < 1 and accuracy == pytest.approx(in_vocab * coverage)
    assert record["trainable_parameters"] > 0


def test_resume_from_a_checkpoint_continues_identically(training_store, tmp_path):
    config = replace(preset("smoke"), epochs=1, eval_every=5)
    straight, whole = train(training_store, TINY, LAYERS, tmp_path / "straight", config)
    _, halfway = train(training_store, TINY, LAYERS, tmp_path / "resumed", config, stop_after=7)
    assert halfway["steps"] == 7 and not halfway["finished"]
    saved = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)["head"]
    assert "embed_tokens.weight" not in saved and "fc.weight" in saved  # the target gives the frozen embedding back
    resumed, record = train(training_store, TINY, LAYERS, tmp_path / "resumed", config)
    assert record["finished"] and record["token_passes"] == whole["token_passes"] > halfway["token_passes"]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_ttt_warmup_trains_step_0_alone_first_then_the_whole_unroll(training_store, tmp_path):
    """Up to the warmup's end the head is the one a one-step unroll trains (same data, same
    learning rates); after it every step trains, and evaluations always score every step."""
    config = replace(preset("smoke"), epochs=1, eval_every=10**6)
    warm = replace(config, ttt_warmup=0.5)
    data = StoreBatches(training_store, TINY, LAYERS, seq_len=config.seq_len, batch_size=config.batch_size, seed=0,
                        holdout=config.holdout)
    halfway = round(0.5 * len(data.plan(0)))
    one_step_config = replace(config, ttt_steps=1)

    def heads_after(steps: int) -> tuple:
        return tuple(train(training_store, TINY, LAYERS, tmp_path / name, recipe, stop_after=steps)[0].state_dict()
                     for name, recipe in (("one", one_step_config), ("warm", warm)))
    one_step, warmed = heads_after(halfway)
    assert all(torch.equal(one_step[name], warmed[name]) for name in one_step)
    one_step, warmed = heads_after(halfway + 1)  # the first full unroll
    assert not torch.equal(one_step["midlayer.mlp.up_proj.weight"], warmed["midlayer.mlp.up_proj.weight"])
    _, record = train(training_store, TINY, LAYERS, tmp_path / "warm", warm)
    assert record["finished"] and len(record["final"]["accuracy"]) == config.ttt_steps


def test_attend_self_starts_attention_on_the_diagonal(training_store):
    """With queries equal to their group's keys, almost every position scores itself above every
    earlier position at init (0.98 of them here); with the default init, about as many as chance."""
    data = StoreBatches(training_store, TINY, LAYERS, seq_len=64, batch_size=1, seed=0, holdout=0.05)
    config = preset("smoke")
    tied, default = (build_head(data, replace(config, attend_self=std)).midlayer.self_attn for std in (0.05, 0.0))
    groups = tied.c.num_attention_heads // tied.c.num_key_value_heads
    keys = tied.k_proj.weight.view(tied.c.num_key_value_heads, tied.c.head_dim, -1)
    assert torch.equal(tied.q_proj.weight.view(tied.c.num_attention_heads, tied.c.head_dim, -1),
                       keys.repeat_interleave(groups, dim=0))
    torch.manual_seed(0)
    x, positions = torch.randn(1, 32, tied.q_proj.in_features), torch.arange(32)[None]

    def diagonal_share(attention) -> float:
        with torch.no_grad():
            q, k, _ = attention._project(x, positions)
            scores = (q @ k.transpose(-1, -2)).masked_fill(~torch.ones(32, 32, dtype=torch.bool).tril(), float("-inf"))
        return float((scores.argmax(-1) == torch.arange(32)).float()[..., 1:].mean())
    assert diagonal_share(tied) > 0.9 and diagonal_share(default) < 0.5


def test_draft_vocabulary_round_trip():
    counts = torch.tensor([5, 0, 9, 9, 1, 0, 3])
    d2t, t2d = draft_vocabulary(counts, 4)
    draft_ids = torch.arange(4)
    targets = draft_ids + d2t
    assert targets.tolist() == [0, 2, 3, 6]  # most frequent, in id order
    assert t2d[targets].all() and int(t2d.sum()) == 4
    assert torch.equal(target_to_draft(t2d)[targets], draft_ids)
    assert (target_to_draft(t2d)[~t2d] == -1).all()


def test_accuracy_counts_every_reply_position_and_coverage_the_ones_the_vocabulary_holds():
    """Six positions, one not a reply; of the five replies, the target's argmax is outside the draft
    vocabulary at two (label −1), and the draft is right at two of the other three."""
    predicted = torch.tensor([[3, 1, 0, 2, 2, 5]])
    label = torch.tensor([[3, 1, -1, 4, -1, 5]])
    reply = torch.tensor([[True, True, True, True, True, False]])
    assert score(predicted, label, reply) == (2, 3, 5)  # accuracy 2/5, coverage 3/5, in-vocabulary 2/3


def test_layer_ids_translate_for_each_runtime_in_both_directions():
    assert to_runtime_ids([2, 15, 27], "vllm") == [2, 15, 27]
    assert to_runtime_ids([2, 15, 27], "sglang") == [1, 14, 26]
    assert from_runtime_ids([1, 14, 26], "sglang") == [2, 15, 27]
    assert from_runtime_ids([2, 15, 27], "vllm") == [2, 15, 27]
    with pytest.raises(LayerwaveError, match="embedding output"):
        to_runtime_ids([0, 4], "sglang")


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_export_then_reload_gives_identical_logits(trained, tmp_path, fmt, training_store):
    head, _, _ = trained
    out = export(head, tmp_path / fmt, fmt, verifier="tiny-random-llama")
    config = json.loads((out / "config.json").read_text())
    if fmt == "vllm":
        assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == LAYERS
        assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny-random-llama"
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    reloaded = load_exported(out, embeddings=head.embed_tokens.weight.detach().clone())
    batch = next(StoreBatches(training_store, TINY, LAYERS, seq_len=32, batch_size=2, seed=0).batches(
        StoreBatches(training_store, TINY, LAYERS, seq_len=32, batch_size=2, seed=0).plan(0)))
    with torch.no_grad():
        def logits(model):
            return model.logits(model.step(model.fuse(batch.aux), batch.input_ids, batch.positions, []))
        assert torch.equal(logits(head.eval()), logits(reloaded))


def test_the_head_reads_exactly_the_layers_asked_for(training_store):
    ds = open_activations(training_store, TINY)
    forward = StoreBatches(training_store, TINY, [2, 4, 5], seq_len=64, batch_size=1, seed=0)
    swapped = StoreBatches(training_store, TINY, [5, 4, 2], seq_len=64, batch_size=1, seed=0)
    plan = forward.plan(0)
    a, b = next(forward.batches(plan)), next(swapped.batches(plan))
    (shard, windows) = plan[0]
    start, stop = windows[0]
    width = ds.sizes["hidden"]
    for slot, layer in enumerate([2, 4, 5]):
        expected = ds.hidden_states.sel(layer=layer).values[start:stop].astype(np.float32)
        np.testing.assert_array_equal(a.aux[0, : stop - start, slot * width:(slot + 1) * width].numpy(), expected)
    assert not torch.equal(a.aux, b.aux)
    assert torch.equal(a.aux[..., :width], b.aux[..., 2 * width:])
    head = build_head(forward, preset("smoke"))
    with torch.no_grad():
        assert not torch.equal(head.fuse(a.aux), head.fuse(b.aux))


def test_training_bad_input(training_store, tmp_path, capsys):
    def refused(argv, expected):
        capsys.readouterr()
        assert main(["train", "--model", TINY, "--store", training_store, "--preset", "smoke", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err
    refused(["--layers", "2,40"], "layers [40] are not in the store")
    refused(["--layers", "2,2,5"], "repeats a layer")
    refused(["--layers", ""], "the layer set is empty")
    refused(["--layers", "2,4,5", "--format", "onnx"], "unknown --format")
    refused(["--layers", "2,4,5", "--preset", "huge"], "unknown --preset")
    refused(["--layers", "2,4,5", "--epochs", "0"], "--epochs must be at least 1 (got 0)")
    refused(["--layers", "2,4,5", "--ttt-steps", "0"], "--ttt-steps must be at least 1 (got 0)")
    refused(["--layers", "2,4,5", "--ttt-warmup", "1"], "--ttt-warmup is a share of the steps, in [0, 1) (got 1.0)")
    refused(["--layers", "2,4,5", "--device", "tpu"], "unknown --device 'tpu'; use auto, cpu or cuda")
    refused(["--layers", "2,4,5", "--attend-self", "-0.1"], "--attend-self is the std of the shared query/key init, >= 0")
    refused(["--layers", "2,4,5", "--seed", "-1"], "--seed must be >= 0 (got -1)")
    (tmp_path / "head.json").write_text("{}")
    refused(["--layers", "2,4,5", "--out", str(tmp_path / "head.json")], "is a file; a head is a directory")


def test_store_without_labels_is_refused(training_store, tmp_path, capsys):
    import shutil
    copy = tmp_path / "nolabels.zarr"
    shutil.copytree(training_store, copy)
    del zarr.open_group(copy, path=f"{TINY}/activations", mode="a")["target_topk_ids"]
    zarr.consolidate_metadata(str(copy))
    assert main(["train", "--model", TINY, "--store", str(copy), "--preset", "smoke", "--layers", "2,4,5"]) == 2
    assert "has no target_topk_ids" in capsys.readouterr().err


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(training_store, tmp_path):
    config = replace(preset("smoke"), lr=1e30, warmup_steps=1, eval_every=1, grad_clip=1e30)
    with pytest.raises(LayerwaveError, match="training loss became nan at step .*last good checkpoint"):
        train(training_store, TINY, LAYERS, tmp_path, config)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert state["step"] >= 1 and all(torch.isfinite(t).all() for t in state["head"].values() if t.is_floating_point())


def test_train_cli_exports_records_and_exports_again_without_training(training_store, tmp_path, caplog):
    """Layers given out of order are read in model order, as vLLM and SGLang hand them over; a
    finished head changes format without training again, and an export cut short is redone."""
    out = tmp_path / "cli-head"

    def train_cli(*argv):
        caplog.clear()
        assert main(["train", "--model", TINY, "--store", training_store, "--layers", "5,2,4", "--preset", "smoke",
                     "--ttt-steps", "2", "--epochs", "1", "--out", str(out), *argv]) == 0
        return json.loads((out / "config.json").read_text())

    config = train_cli("--json", str(tmp_path / "t.json"))
    record = json.loads((out / "training.json").read_text())
    assert record["layers"] == [2, 4, 5] and record["config"]["ttt_steps"] == 2 and record["config"]["epochs"] == 1
    assert (out / "model.safetensors").is_file() and config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    trained = load_exported(out).state_dict()

    config = train_cli("--format", "sglang")
    assert "exporting it again" in caplog.text and "trainable parameters" not in caplog.text
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    again = load_exported(out, trained["embed_tokens.weight"]).state_dict()
    assert all(torch.equal(again[name], trained[name]) for name in trained)
    assert json.loads((out / "training.json").read_text())["history"] == record["history"]

    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:1000])
    train_cli("--format", "sglang")
    assert "trainable parameters" in caplog.text
    assert all(torch.equal(load_exported(out, trained["embed_tokens.weight"]).state_dict()[name], trained[name])
               for name in trained)


def test_a_batch_of_windows_shorter_than_the_unroll_trains(training_store):
    """Document tails can leave a batch of 2-token windows; a 3-step unroll must still score it
    (the steps past the window's end count nothing)."""
    data = StoreBatches(training_store, TINY, LAYERS, seq_len=64, batch_size=2, seed=0)
    shard, windows = data.plan(0)[0]
    short = [(start, start + 2) for start, _ in windows]
    batch = next(data.batches([(shard, short)]))
    head = build_head(data, preset("smoke"))
    results = unroll(head, batch, target_to_draft(head.t2d), steps=3)
    assert [r.positions for r in results][1:] == [0, 0] and all(torch.isfinite(r.loss) for r in results)


@pytest.mark.parametrize("family", ["llama-tied", "llama-untied", "gemma"])
def test_warm_start_copies_the_draft_vocabularys_lm_head_rows_and_the_final_norm(family):
    """Rows through d2t for tied and untied lm_heads; the final norm's effective scale, whether it
    multiplies by `weight` (Llama) or `1 + weight` (Gemma)."""
    from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM

    from tasks.heads.draft_head import DraftConfig, DraftHead
    from tasks.heads.warm_start import final_norm, warm_start

    shape = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    target = (GemmaForCausalLM(GemmaConfig(**shape)) if family == "gemma"
              else LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=family == "llama-tied")))
    with torch.no_grad():
        final_norm(target).weight.normal_()  # a norm that is not the identity
        if family == "llama-untied":
            target.lm_head.weight.normal_()
    assert (target.lm_head.weight is target.model.embed_tokens.weight) == (family != "llama-untied")
    head = DraftHead(DraftConfig.from_target(target.config, [1, 2], draft_vocab_size=40))
    d2t, t2d = draft_vocabulary(torch.randint(0, 50, (300,), generator=torch.Generator().manual_seed(1)), 40)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    assert warm_start(head, target) == ["lm_head", "norm"]
    target_ids = torch.arange(40) + d2t
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[target_ids])
    x = torch.randn(3, 32)
    with torch.no_grad():
        torch.testing.assert_close(head.logits(x), target.lm_head(final_norm(target)(x))[:, target_ids])


def test_frozen_lm_head_stays_the_targets_and_needs_warm_start(training_store, tmp_path):
    config = replace(preset("smoke"), epochs=1, warm_start=True, freeze_lm_head=True)
    head, record = train(training_store, TINY, LAYERS, tmp_path / "frozen", config)
    data = StoreBatches(training_store, TINY, LAYERS, seq_len=64, batch_size=8, seed=0)
    fresh = build_head(data, config)
    assert torch.equal(head.lm_head.weight, fresh.lm_head.weight) and torch.equal(head.norm.weight, fresh.norm.weight)
    assert not torch.equal(head.fc.weight, fresh.fc.weight)
    assert record["trainable_parameters"] == fresh.trainable_parameters() < all_parameters(fresh)
    with pytest.raises(LayerwaveError, match="--freeze-lm-head keeps the lm_head as it starts; it needs --warm-start"):
        preset("smoke", freeze_lm_head=True)


def all_parameters(head) -> int:
    return sum(p.numel() for p in head.parameters())


def test_windows_without_a_loss_masked_token_are_not_trained_on(training_store):
    data = StoreBatches(training_store, TINY, LAYERS, seq_len=16, batch_size=4, seed=0)
    mask = data.loss_mask
    windows = [w for shard in range(data.layout.n_shards) for w in data.windows(shard, heldout=False)]
    assert windows and all(mask[a: b - 1].any() for a, b in windows)
    assert any(not mask[a: a + 15].any() for a in range(0, len(mask) - 16, 16))  # such windows exist to skip
