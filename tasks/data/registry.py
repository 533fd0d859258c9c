"""The model registry: built-in ids from models.toml, or `hf:PATH` for any Hugging Face checkpoint."""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from store.errors import LayerwaveError


@dataclass(frozen=True)
class ModelSpec:
    key: str  # group name in the store
    source: str  # gguf | random | hf
    options: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def description(self) -> str:
        return self.options.get("description", self.key)


def registry() -> dict[str, dict]:
    """Built-in models, then the ones users added with `layerwave models add` (see user_registry)."""
    built_in = tomllib.loads(resources.files("tasks.data").joinpath("models.toml").read_text())["models"]
    path = user_registry()
    try:
        added = tomllib.loads(path.read_text(encoding="utf-8")).get("models", {}) if path.exists() else {}
    except tomllib.TOMLDecodeError as err:
        raise LayerwaveError(f"model registry {path} is not valid TOML ({err}); fix or delete it") from None
    return {**added, **built_in}


def user_registry() -> Path:
    """Where added models are kept: $LAYERWAVE_REGISTRY, else ~/.config/layerwave/models.toml.
    Point every worker of a deployment at the same file (a shared path) so they see the same models."""
    return Path(os.environ.get("LAYERWAVE_REGISTRY", Path.home() / ".config" / "layerwave" / "models.toml"))


def add_model(name: str, source: str, description: str = "") -> dict:
    """Register `name` for checkpoint `source` (hf:PATH); refuses names taken or unsafe, and
    sources that are not Hugging Face checkpoints."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise LayerwaveError(f"model name {name!r} must be letters, digits, '.', '_' or '-' (it names a store group)")
    if name in registry():
        raise LayerwaveError(f"model {name!r} is already registered; pick another name")
    if not source.startswith("hf:"):
        raise LayerwaveError(f"--source {source!r} is not supported; use hf:PATH (a Hugging Face checkpoint "
                             "directory, or a hub id where the hub is reachable)")
    checkpoint = resolve(source).options["path"]
    if Path(checkpoint).exists():
        checkpoint = str(Path(checkpoint).resolve())  # workers may start elsewhere
    entry = {"description": description or f"added from {source}", "source": "hf", "path": checkpoint}
    path = user_registry()
    path.parent.mkdir(parents=True, exist_ok=True)
    # JSON's escapes are TOML's, but for characters beyond the BMP, which JSON writes as surrogate
    # pairs and TOML refuses: written as they are, in UTF-8
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"\n[models.{json.dumps(name)}]\n"
                     + "".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n" for k, v in entry.items()))
    return entry


def resolve(model: str) -> ModelSpec:
    """Turn a `--model` argument into a spec, or say which ids exist."""
    if model.startswith("hf:"):
        path = model[3:]
        if not path:
            raise LayerwaveError("--model hf: needs a checkpoint path or hub id, e.g. hf:./my-model")
        local = Path(path).expanduser()
        if local.exists() and not (local / "config.json").is_file():
            raise LayerwaveError(f"--model {model}: {local} is not a Hugging Face checkpoint (no config.json)")
        return ModelSpec(key=hf_key(path), source="hf", options={"path": str(local) if local.exists() else path})
    models = registry()
    if model not in models:
        raise LayerwaveError(
            f"unknown model {model!r}; registered models: {', '.join(sorted(models))}; pass hf:PATH, or register "
            "one with `layerwave models add NAME --source hf:PATH`"
        )
    options = dict(models[model])
    return ModelSpec(key=model, source=options.pop("source"), options=options)


def hf_key(path: str) -> str:
    """A store group name for a user checkpoint: `hf-` + its last path part, made path-safe."""
    name = Path(path.rstrip("/")).name or "model"
    return "hf-" + re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def store_key(model: str) -> str:
    """The store group of a model for stages that only read the store: a registry id, `hf:PATH`,
    or the name of any group already in the store (e.g. a synthetic one)."""
    if model.startswith("hf:") or model in registry():
        return resolve(model).key
    if not re.fullmatch(r"[A-Za-z0-9._-]+", model):
        raise LayerwaveError(f"--model {model!r} is neither a known model nor a store group name")
    return model


def check_group_model(recorded: dict, model: str, store: str) -> None:
    """Two checkpoints whose folders share a name share a store group (`hf-<name>`): refuse to use
    one's activations for the other, instead of training on the wrong model's states silently."""
    argument = recorded.get("argument", "")
    if not (model.startswith("hf:") and argument.startswith("hf:")):
        return
    if os.path.abspath(argument[3:]) != os.path.abspath(model[3:]):
        raise LayerwaveError(f"store {store}'s group {hf_key(model[3:])} holds activations of {argument}, not "
                             f"{model}; extract {model} into another --store, or pass --model {argument}")
