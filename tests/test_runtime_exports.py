"""Exports that the serving runtimes load as they are.

vLLM reads EAGLE-3 checkpoints through `speculators` (installed by .ci/run, pinned in
.ci/runtime-exports.txt): every vLLM export is loaded with speculators' own `from_pretrained`,
whose step-0 logits must equal layerwave's head on the same inputs. SGLang's loader is pinned by
its rules (sgl-project/sglang, python/sglang/srt/models/llama_eagle3.py and llama.py): weights
`midlayer.*`, `fc.weight`, `norm.weight`, `lm_head.weight` (anything else is dropped silently),
`d2t` as offsets (target id = draft id + d2t), `t2d` ignored, aux ids "output of decoder layer
k" = HF index k + 1, captured before layer k + 1 runs, fc sized for exactly 3 layers.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from store.errors import LayerwaveError
from tasks.data import load_model
from tasks.data.registry import resolve
from tasks.heads.draft_head import DraftConfig, DraftHead, draft_vocabulary
from tasks.heads.export_head import export, runtime_warning, to_runtime_ids
from tests.conftest import LAYERS, TINY, saved_checkpoint

if importlib.util.find_spec("speculators") is None:  # installed, it must import: a broken install fails here
    pytest.skip("speculators is installed by .ci/run from .ci/runtime-exports.txt", allow_module_level=True)
import speculators  # noqa: E402

# speculators' own code paths on the CPU, not ours: its Llama layer uses a deprecated argument, and
# flex attention runs unfused without torch.compile
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning",
                                        "ignore:flex_attention called without torch.compile:UserWarning")

SGLANG_WEIGHTS = ("midlayer.", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")


def step0_logits_match(head: DraftHead, out: Path, tokens: int = 7) -> float:
    """Largest difference between speculators' step-0 logits and layerwave's on random inputs."""
    model = speculators.SpeculatorModel.from_pretrained(str(out)).eval()
    assert type(model).__name__ == "Eagle3DraftModel"
    k, width = len(head.config.layers), head.config.hidden_size
    aux = torch.randn(1, tokens, k * width, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, head.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(1))
    seen = {}
    model.lm_head.register_forward_hook(lambda module, inputs, output: seen.setdefault("logits", output))
    with torch.no_grad():
        model(hidden_states=aux, input_ids=ids, document_ids=torch.zeros_like(ids), ttt_steps=1)
        ours = head.logits(head.step(head.fuse(aux), ids, torch.arange(tokens)[None], []))
    return float((seen["logits"].float() - ours.float()).abs().max())


@pytest.mark.parametrize("registered_as", ["tiny-random-llama", "hf:PATH"])
def test_the_tiny_models_vllm_export_loads_in_speculators_with_equal_logits(tiny, trained, tmp_path, registered_as):
    """speculators loads the verifier an export names, so the registry's random model must name a
    saved checkpoint (with the same weights), not a hub id that does not exist."""
    if registered_as == TINY:
        target = load_model.verifier(TINY)
        saved = AutoModelForCausalLM.from_pretrained(target["name_or_path"]).state_dict()
        assert all(torch.equal(saved[name], value) for name, value in tiny.model.state_dict().items())
    else:
        checkpoint = saved_checkpoint(tiny, tmp_path / "target")
        target = load_model.verifier(f"hf:{checkpoint}")
        assert target["name_or_path"] == checkpoint
    assert target["architectures"] == ["LlamaForCausalLM"] and Path(target["name_or_path"], "config.json").is_file()
    out = export(trained[0], tmp_path / "head", "vllm", target["name_or_path"],
                 architectures=target["architectures"], num_layers=tiny.model.config.num_hidden_layers)
    verifier = json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == target
    assert step0_logits_match(trained[0], out) < 1e-5


def test_a_smollm2_shaped_export_loads_in_speculators_with_equal_logits(tmp_path):
    """A head of SmolLM2-135M's shape on [2, 15, 27] (random weights: the shapes are the test),
    its verifier the local checkpoint, as `layerwave train --verifier PATH` records it."""
    checkpoint = load_model.gguf_checkpoint(resolve("smollm2-135m"))
    config = AutoConfig.from_pretrained(checkpoint)
    torch.manual_seed(0)
    head = DraftHead(DraftConfig.from_target(config, [2, 15, 27], draft_vocab_size=8192))
    d2t, t2d = draft_vocabulary(torch.randint(0, 1000, (config.vocab_size,)), 8192)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    out = export(head, tmp_path / "head", "vllm", str(checkpoint), architectures=config.architectures,
                 num_layers=config.num_hidden_layers)
    assert step0_logits_match(head, out) < 1e-4


def test_the_registry_names_the_real_target():
    smollm2 = load_model.verifier("smollm2-135m")
    assert smollm2 == {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "architectures": ["LlamaForCausalLM"]}


def test_the_sglang_export_follows_sglangs_loader(trained, tmp_path):
    head = trained[0]
    out = export(head, tmp_path / "sglang", "sglang", "tiny", num_layers=8)
    names = load_file(str(out / "model.safetensors"))
    assert all(name.startswith(SGLANG_WEIGHTS) for name in names), sorted(names)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "midlayer.self_attn.q_proj.weight"} <= names.keys()
    assert "embed_tokens.weight" not in names  # SGLang takes the target's embeddings
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert [i + 1 for i in ids] == head.config.layers == LAYERS  # SGLang captures layer (id + 1)'s input
    targets = torch.arange(head.config.draft_vocab_size) + names["d2t"]  # SGLang's hot_token_id
    assert torch.equal(targets, torch.nonzero(head.t2d).flatten())
    assert names["fc.weight"].shape[1] == 3 * head.config.hidden_size  # SGLang's fc: exactly 3 layers


def test_layers_the_runtimes_cannot_capture_are_refused():
    assert to_runtime_ids([2, 15, 27], "vllm", 30) == [2, 15, 27]
    assert to_runtime_ids([2, 15, 27], "sglang", 30) == [1, 14, 26]
    with pytest.raises(LayerwaveError, match="cannot capture HF index 30"):
        to_runtime_ids([2, 15, 30], "vllm", 30)
    with pytest.raises(LayerwaveError, match="embedding output"):
        to_runtime_ids([0, 15, 27], "sglang", 30)
    assert runtime_warning([2, 15, 27]) is None
    assert "reads 2 layers" in runtime_warning([2, 15]) and "exactly 3" in runtime_warning([2, 15])
