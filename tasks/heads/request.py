"""`layerwave train`'s request: its options, declared once, and the check that resolves them.

Kept free of torch and Prefect at import, so building the command line stays fast; the check
imports what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from store.artefacts import location
from store.errors import LayerwaveError
from store.paths import Workspace
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import option
from tasks.precision import resolve_precision
from tasks.select.layer_ids import check_layers, check_stored, eagle3_default, parse_layers

if TYPE_CHECKING:
    from tasks.heads.train_head import TrainConfig


@dataclass(frozen=True)
class TrainRequest:
    """One head for one layer set, trained from the store and exported (`layerwave train`)."""

    model: str = option(DEFAULT_MODEL, "registry id (see `layerwave models`) or hf:PATH")
    store: str = option(DEFAULT_STORE, "Zarr store (directory or fsspec URL)")
    layers: list[int] | None = option(None, "HF hidden_states indices, e.g. 2,15,27 (default: the EAGLE-3 default)",
                                      type=parse_layers)
    out: str | None = option(None, "output directory (default: <store>.heads/<model>/<layers>)")
    preset_name: str = option("quick", "smoke (tiny model, seconds), quick (CPU), full (GPU)", flag="--preset")
    seed: int = option(0, "seed of the head's initialisation and data order")
    ttt_steps: int | None = option(None, "training-time-test unroll (default: the preset's)")
    fmt: str = option("vllm", "export format: vllm (speculators Eagle3) or sglang", flag="--format")
    epochs: int | None = option(None, "passes over the training documents (default: the preset's)")
    device: str = option("auto", "auto (CUDA when present), cpu or cuda")
    warm_start: bool | None = option(None, "start the lm_head (draft-vocabulary rows) and final norm from the "
                                           "target's (default: the preset's)")
    freeze_lm_head: bool | None = option(None, "keep the warm-started lm_head and final norm frozen "
                                               "(default: the preset's)")
    lm_head_lr_scale: float | None = option(None, "learning rate of the lm_head and final norm relative to the "
                                                  "rest (default: the preset's)")
    verifier: str | None = option(None, "the target as vLLM/SGLang should load it, recorded in the export "
                                        "(default: its Hugging Face id from the registry, else its local "
                                        "checkpoint path)")
    keep_checkpoint: bool = option(False, "keep checkpoint.pt (optimizer state) once the head is finished; an "
                                          "unfinished run always keeps it, so a killed run resumes")
    precision: str = option("auto", "float32, bfloat16 (autocast over float32 master weights, where the device "
                                    "has it natively) or auto: bfloat16 where native, else float32")
    layer_scaling: bool | None = option(None, "divide each layer's states by its RMS in the store before fc (folded "
                                              "into fc at export; default: the preset's)")
    loss_on_prompt: bool | None = option(None, "also learn at prompt positions, not only reply tokens "
                                               "(default: the preset's)")
    ttt_warmup: float | None = option(None, "share of the steps that unroll one TTT step only, before the full "
                                            "unroll (cheaper steps that train the first draft; default: the "
                                            "preset's)")
    attend_self: float | None = option(None, "start each query equal to its key, drawn with this std, so that "
                                             "attention starts on the diagonal; 0: the default init "
                                             "(default: the preset's)")

    def check(self) -> Training:
        """Every mistake, before any training starts; opens the activations once and resolves
        the layer set, the output directory, the training recipe and the target for the export."""
        from store.read import open_activations
        from tasks.data.registry import check_group_model, store_key

        model_key = store_key(self.model)
        if self.out and location(self.out).is_file():
            raise LayerwaveError(f"--out {self.out} is a file; a head is a directory: name another --out")
        ds = open_activations(self.store, model_key)
        check_group_model(ds.attrs.get("model", {}), self.model, self.store)
        for name in ("target_topk_ids", "target_topk_logprobs", "loss_mask"):
            if name not in ds:
                raise LayerwaveError(f"store {self.store} has no {name} for {model_key} (labels draft training "
                                     "needs); re-extract with this layerwave")
        partial = ds.attrs["layout"].get("layers") is not None  # a training store: N from the model
        n = ds.attrs["model"]["num_hidden_layers"] if partial else ds.sizes["layer"] - 1
        layers = check_layers(self.layers if self.layers is not None else eagle3_default(n) or [], n + 1)
        check_stored(layers, ds.layer.values.tolist(), self.store, model_key)
        recipe = {"warm_start": self.warm_start, "freeze_lm_head": self.freeze_lm_head,
                  "lm_head_lr_scale": self.lm_head_lr_scale, "layer_scaling": self.layer_scaling,
                  "loss_on_prompt": self.loss_on_prompt, "ttt_warmup": self.ttt_warmup,
                  "attend_self": self.attend_self}  # None keeps the preset's
        # Only now the modules that load transformers (~5 s): a store or layer mistake is refused before.
        from tasks.data import load_model
        from tasks.heads.export_head import to_runtime_ids
        from tasks.heads.train_head import preset

        device = load_model.pick_device(self.device)
        config = preset(self.preset_name, seed=self.seed, ttt_steps=self.ttt_steps, epochs=self.epochs,
                        precision=resolve_precision(self.precision, device), **recipe)
        to_runtime_ids(layers, self.fmt, n)  # a format the runtime can capture these layers for
        target = load_model.verifier(ds.attrs["model"].get("argument", self.model))
        return Training(self, model_key, layers, n, ds.attrs["plan_hash"], config,
                        str(location(self.out) if self.out else Workspace(self.store).single_head(model_key, layers)),
                        {**target, "name_or_path": self.verifier or target["name_or_path"]})


@dataclass(frozen=True)
class TrainedHead:
    """What training one head hands to the flows that compose it: where the head is and how it did."""

    out: str
    layers: list[int]
    steps: int
    trainable_parameters: int
    untrained: dict  # held-out accuracy and loss per TTT step before training
    final: dict  # the same after training, with τ_offline
    tokens_per_s: float
    reused: bool  # an earlier run trained it from the same inputs


@dataclass(frozen=True)
class Training:
    """A checked `TrainRequest`: what the training task runs."""

    request: TrainRequest
    model_key: str
    layers: list[int]
    num_layers: int  # N decoder layers
    plan_hash: str  # of the activations the head learns from
    config: TrainConfig  # the preset with this request's overrides
    out: str
    verifier: dict  # the target as the runtime loads it: name_or_path, architectures
