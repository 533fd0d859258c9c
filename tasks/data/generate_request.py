"""`layerwave generate`'s request: its options, declared once, and the check that runs before any
model runs or anything is written.

Kept free of torch and Prefect at import, so building the command line stays fast; the check
imports what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from store.errors import LayerwaveError
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import option


@dataclass(frozen=True)
class GenerateRequest:
    """The target's own replies to a corpus's user turns, as a regen:DIR corpus for extraction."""

    model: str = option(DEFAULT_MODEL, "registry id (see `layerwave models`) or hf:PATH")
    source: str = option("sharegpt", "corpus whose user turns are answered: sharegpt, mt-bench or jsonl:PATH")
    out: str | None = option(None, "output directory (default: <store>.corpora/<model>-<source>)")
    tokens: int = option(20000, "reply-token budget (generation stops past it)")
    max_new_tokens: int = option(256, "longest reply")
    max_prompt_tokens: int = option(1024, "skip longer prompts (conversation so far)")
    turns: int = option(3, "user turns answered per conversation (later ones see the earlier generated replies)")
    temperature: float = option(0.0, "0 = greedy; > 0 samples")
    seed: int = option(0, "order of the source conversations, and sampling")
    batch_size: int = option(32, "replies decoded together (a row whose reply ends takes the next prompt)")
    shard_size: int = option(64, "conversations per committed shard (a shard ends by draining its slots: 256 with "
                                    "--batch-size 64 generates 1.4x faster for budgets of 100k tokens and more)")
    device: str = option("auto", "auto (CUDA when present), cpu or cuda[:N]")
    dtype: str = option("auto", "compute dtype: auto (the checkpoint's), float32, float16, bfloat16 (1.7x "
                                "faster on a CPU with avx512_bf16; the replies are then the bfloat16 model's)")
    overwrite: bool = option(False, "replace a corpus generated with other settings")
    store: str = option(DEFAULT_STORE, "store the default --out sits beside")

    def check(self) -> GenerateRequest:
        """Every mistake a generation request can hold; returns it with its output directory resolved."""
        from store.artefacts import location
        from store.paths import Workspace
        from tasks.data import load_model
        from tasks.data.corpus import load_corpus
        from tasks.data.generate import identity
        from tasks.data.regen_corpus import read_manifest
        from tasks.data.registry import resolve

        for name in ("tokens", "max_new_tokens", "max_prompt_tokens", "turns", "batch_size", "shard_size"):
            if getattr(self, name) < 1:
                raise LayerwaveError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.temperature < 0:
            raise LayerwaveError(f"--temperature must be >= 0 (got {self.temperature}); 0 is greedy")
        out = location(self.out) if self.out else Workspace(self.store).corpus(resolve(self.model).key, self.source)
        if out.exists() and not out.is_dir():
            raise LayerwaveError(f"--out {out} is a file; give a directory for the generated corpus")
        load_model.pick_device(self.device)
        load_model.pick_dtype(self.dtype)
        load_corpus(self.source)
        resolved = replace(self, out=str(out))
        manifest = read_manifest(out)
        if manifest is not None and not self.overwrite and manifest.get("identity") != identity(resolved):
            raise LayerwaveError(f"{out} holds a corpus generated with other settings or by another model; pass "
                                 "--overwrite to replace it, or use another --out")
        return resolved
