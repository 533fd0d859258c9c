"""Write a trained head as the checkpoint vLLM (speculators Eagle3) or SGLang (SpecForge) loads.

Layer ids are translated explicitly (DESIGN.md): the store and layerwave use HF hidden_states
indices; vLLM's `eagle_aux_hidden_state_layer_ids` are the same indices (captured before layer k
runs); SGLang/SpecForge ids name the decoder layer whose output is captured, i.e. HF index − 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from store.artefacts import location, read_json, write_bytes, write_json
from store.errors import LayerwaveError
from tasks.heads.draft_head import DraftConfig, DraftHead

RUNTIME_AUX_LAYERS = 3  # vLLM's and SGLang's EAGLE-3 drafts size fc for exactly 3 aux layers


@dataclass(frozen=True)
class ExportFormat:
    """How one runtime reads an EAGLE-3 head: its aux layer ids, its weight names, its config."""

    name: str
    runtime: str  # as users know it, for messages
    first_capturable: int  # the smallest HF index the runtime can capture
    id_offset: int  # runtime aux id = HF index − id_offset
    keeps_embeddings: bool  # False: the runtime takes the target's
    renames: tuple[str, str] | None  # (layerwave's prefix, the runtime's) of the decoder layer's weights
    config: Callable[[DraftConfig, list[int], str, int, list[str]], dict]  # (head, aux ids, verifier, k, archs)
    aux_ids: Callable[[dict], list[int]]  # where its config keeps them

    def runtime_state(self, state: dict) -> dict:
        if not self.keeps_embeddings:
            state = {name: t for name, t in state.items() if name != "embed_tokens.weight"}
        return state if self.renames is None else {name.replace(*self.renames): t for name, t in state.items()}

    def layerwave_state(self, state: dict) -> dict:
        return state if self.renames is None else {name.replace(*self.renames[::-1]): t for name, t in state.items()}


def _vllm_config(c: DraftConfig, ids: list[int], verifier: str, speculative_tokens: int,
                 architectures: list[str]) -> dict:
    """speculators' Eagle3 config, which vLLM reads."""
    return {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": _layer_config(c), "draft_vocab_size": c.draft_vocab_size,
            "norm_before_residual": False, "target_hidden_size": c.hidden_size,
            "eagle_aux_hidden_state_layer_ids": ids,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy",
                                                         "speculative_tokens": speculative_tokens,
                                                         "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                                   "verifier": {"name_or_path": verifier, "architectures": architectures}}}


def _sglang_config(c: DraftConfig, ids: list[int], verifier: str, speculative_tokens: int,
                   architectures: list[str]) -> dict:
    """SpecForge's LlamaForCausalLMEagle3 config, which SGLang reads (the target comes from its own flags)."""
    return {**_layer_config(c), "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": c.draft_vocab_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}}


def export_format(name: str) -> ExportFormat:
    if name not in FORMATS:
        raise LayerwaveError(f"unknown --format {name!r}; use {' or '.join(FORMATS)}")
    return FORMATS[name]


def to_runtime_ids(layers: list[int], fmt: str, num_layers: int | None = None) -> list[int]:
    """HF hidden_states indices → the runtime's aux layer ids. Both runtimes capture a state before
    a decoder layer runs, so the last one, HF index N (the final layer's output), never is; SGLang
    also cannot capture index 0 (the embedding output)."""
    spec = export_format(fmt)
    if num_layers is not None and max(layers) >= num_layers:
        raise LayerwaveError(f"{fmt} cannot capture HF index {max(layers)} (the output of the last of {num_layers} "
                             f"decoder layers); choose layers up to {num_layers - 1}")
    if min(layers) < spec.first_capturable:
        raise LayerwaveError(f"{spec.runtime} cannot capture the embedding output (HF index 0); choose layers "
                             f">= {spec.first_capturable}")
    return [layer - spec.id_offset for layer in layers]


def runtime_warning(layers: list[int]) -> str | None:
    """One line when vLLM and SGLang could not load the head as exported."""
    if len(layers) == RUNTIME_AUX_LAYERS:
        return None
    return (f"this head reads {len(layers)} layers; vLLM's and SGLang's EAGLE-3 drafts read exactly "
            f"{RUNTIME_AUX_LAYERS} (their fc input is 3 x hidden), so only layerwave and speculators load it as it is")


def from_runtime_ids(ids: list[int], fmt: str) -> list[int]:
    """The runtime's aux layer ids → HF hidden_states indices."""
    return [i + export_format(fmt).id_offset for i in ids]


def _layer_config(c: DraftConfig) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
            "max_position_embeddings": c.max_position_embeddings, "rope_theta": c.rope_theta,
            "tie_word_embeddings": False, "torch_dtype": "float32"}


def export(head: DraftHead, out, fmt: str, verifier: str, speculative_tokens: int = 3,
           architectures: list[str] | None = None, num_layers: int | None = None):
    """Write `out/config.json` and `out/model.safetensors`; returns `out`. `verifier` is the
    target as the runtime loads it (a Hugging Face id or a local checkpoint path: vLLM serves it
    and speculators reads its config), `architectures` its config's (default: a Llama)."""
    out, c, spec = location(out), head.config, export_format(fmt)
    ids = to_runtime_ids(c.layers, fmt, num_layers)
    state = spec.runtime_state({name: tensor.detach().contiguous() for name, tensor in head.folded_state().items()})
    config = spec.config(c, ids, verifier, speculative_tokens, architectures or ["LlamaForCausalLM"])
    config["layerwave"] = {"layers_hf_index": c.layers, "format": fmt, "draft_config": c.as_dict()}
    write_bytes(out / "model.safetensors", save_safetensors(state))
    write_json(out / "config.json", config)
    return out


def is_whole(out) -> bool:
    """Whether `out` holds config.json and a model.safetensors whose header accounts for every byte:
    exports are written whole, but a copy cut short leaves a file whose config still looks done."""
    out = location(out)
    weights = out / "model.safetensors"
    if not ((out / "config.json").is_file() and weights.is_file()):
        return False
    with weights.open("rb") as handle:  # safetensors: 8-byte header length, JSON header, then the data
        length = int.from_bytes(handle.read(8), "little")
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return False
    data = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    return weights.stat().st_size == 8 + length + data


def load_exported(out, embeddings: torch.Tensor | None = None) -> DraftHead:
    """Rebuild a head from an export (SGLang exports need the target's embeddings passed in)."""
    out = location(out)
    config = read_json(out / "config.json")
    spec = export_format(config["layerwave"]["format"])
    c = DraftConfig(**config["layerwave"]["draft_config"])
    runtime_ids = spec.aux_ids(config)
    if from_runtime_ids(runtime_ids, spec.name) != c.layers:
        raise LayerwaveError(f"{out}: aux layer ids {runtime_ids} do not translate back to {c.layers}")
    try:
        weights = load_safetensors((out / "model.safetensors").read_bytes())
    except Exception as err:  # safetensors raises its own error type for a truncated or foreign file
        raise LayerwaveError(f"{out / 'model.safetensors'} is unreadable ({err}); run the same `layerwave train` "
                             "again: it exports the head anew (trains it again unless --keep-checkpoint kept it)") from None
    state = spec.layerwave_state(weights)
    if "embed_tokens.weight" not in state:
        if embeddings is None:
            raise LayerwaveError(f"{out} has no embeddings (SGLang format); pass the target's")
        state["embed_tokens.weight"] = embeddings
    head = DraftHead(c)
    head.load_state_dict(state)
    return head.eval()


FORMATS = {
    "vllm": ExportFormat("vllm", "vLLM", first_capturable=0, id_offset=0, keeps_embeddings=True,
                         renames=("midlayer.", "layers.0."), config=_vllm_config,
                         aux_ids=lambda config: config["eagle_aux_hidden_state_layer_ids"]),
    # SpecForge names a captured state by the decoder layer whose output it is: HF index − 1
    "sglang": ExportFormat("sglang", "SGLang", first_capturable=1, id_offset=1, keeps_embeddings=False,
                           renames=None, config=_sglang_config,
                           aux_ids=lambda config: config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
}
