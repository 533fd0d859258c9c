"""`layerwave evaluate`'s requests: real decoding of a benchmark, or τ_offline along a store's
held-out replies; their options, declared once, and the checks that load the target and head once.

Kept free of torch and Prefect at import, so building the command line stays fast; the checks
import what they need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from store.errors import LayerwaveError
from tasks.decode.tree_shape import TreeShape
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE, DRAFTS
from tasks.request import option


@dataclass(frozen=True)
class EvaluateRequest:
    """Speculative decoding of a benchmark's prompts with a trained head, against the target alone."""

    model: str = option(DEFAULT_MODEL, "registry id (see `layerwave models`) or hf:PATH")
    head: str = option("", "directory written by `layerwave train` (every --draft but lookup drafts with it)")
    bench: str = option("mt-bench", "mt-bench (first turns), sharegpt (held out), heldout (the exact prompts of "
                        "the head's held-out documents in --store) or jsonl:PATH")
    limit: int | None = option(10, "number of prompts (default 10); with --offline, held-out documents "
                               "(default: all)", cli_default=None)
    max_new_tokens: int = option(128, "tokens generated per prompt (default 128); with --offline, each reply is "
                                 "cut there (default: whole replies)", cli_default=None)
    depth: int = option(4, "draft tokens per verification (chain), levels (tree)")
    store: str | None = option(None, "store whose ShareGPT records are excluded from --bench sharegpt; with "
                               "--offline, the store whose held-out replies are simulated")
    temperature: float = option(0.0, "0 = greedy (checked lossless); > 0 samples")
    seed: int = option(0, "sampling seed")
    draft: str = option("chain", "chain, tree (EAGLE-2 dynamic tree), lookup (copies from the context's own "
                        "n-grams, no head), hybrid (the head's chain and the context's copy verified together) or "
                        "auto (whichever of these, or the target alone, has the most expected tokens/s from measured "
                        "acceptance and this device's round cost; it says why)")
    tree_topk: int = option(TreeShape.topk, "tree: children expanded per node and per level")
    tree_tokens: int = option(TreeShape.tokens, "tree: draft tokens verified per round")
    device: str = option("auto", "auto (CUDA when present), cpu or cuda")
    precision: str = option("auto", "the target's precision, for every decoder and the baseline alike: auto "
                            "(bfloat16 where the device computes it natively, else float32), float32 or bfloat16")
    compare: bool = option(False, "the target alone, Hugging Face prompt lookup, lookup, chain, tree, hybrid and "
                           "auto side by side on the same prompts")
    repeat: int = option(1, "time every prompt N times (order alternating) and keep each side's median: a "
                         "speed-up a busy moment cannot move")

    def check(self) -> Evaluation:
        """Every mistake, before generation starts; loads the target and head, and picks the prompts."""
        from tasks.data.registry import resolve
        from tasks.decode.decoders import HEADLESS
        from tasks.decode.draft_auto import acceptance_profile
        from tasks.decode.evaluate import bench_prompts, load_pair

        for name in ("depth", "repeat", "tree_tokens", "limit"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise LayerwaveError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.temperature < 0:
            raise LayerwaveError(f"--temperature must be >= 0 (got {self.temperature}); 0 is greedy")
        if self.draft not in DRAFTS:
            raise LayerwaveError(f"unknown --draft {self.draft!r}; use {', '.join(DRAFTS[:-1])} or {DRAFTS[-1]}")
        if not self.head and (self.compare or self.draft not in HEADLESS):
            asked = "--compare" if self.compare else f"--draft {self.draft}"
            raise LayerwaveError(f"{asked} drafts with a head: pass --head DIR, or use --draft lookup")
        if (self.compare or self.draft == "auto") and self.store is None:
            acceptance_profile(self.head)  # one line when the head records none and no store can measure it
        target, head = load_pair(self.model, self.head, self.device, self.precision)
        if head is not None and not 1 <= self.tree_topk <= head.config.draft_vocab_size:
            raise LayerwaveError(f"--tree-topk must be between 1 and the head's draft vocabulary of "
                                 f"{head.config.draft_vocab_size} (got {self.tree_topk})")
        model_key = resolve(self.model).key
        prompts = bench_prompts(self.bench, target, self.limit, self.max_new_tokens, self.store, model_key, self.head)
        return Evaluation(self, model_key, target, head, prompts)


@dataclass(frozen=True)
class Evaluation:
    """A checked `EvaluateRequest`: the loaded target and head and the prompt token ids."""

    request: EvaluateRequest
    model_key: str
    target: Any  # tasks.data.load_model.Loaded
    head: Any  # the draft head, ready to draft (tasks.decode.spec_decode.for_drafting); None for lookup alone
    prompts: list[list[int]]


@dataclass(frozen=True)
class OfflineEvaluateRequest:
    """τ_offline: chain rounds simulated along a store's held-out replies, without running the target."""

    model: str = option(DEFAULT_MODEL)
    head: str = option("")
    store: str = option(DEFAULT_STORE)
    depth: int = option(4)
    max_new_tokens: int | None = option(None)
    first_turn_only: bool = option(False, "--offline: only each document's first reply")
    limit: int | None = option(None)
    draft: str = option("chain")  # chain, lookup or hybrid (the option is decoding's --draft)

    def check(self) -> OfflineEvaluation:
        from store.read import open_activations
        from tasks.data.registry import store_key
        from tasks.decode.evaluate import load_pair
        from tasks.heads.offline_tau import DRAFTS as SIMULATED

        for name in ("depth", "max_new_tokens", "limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise LayerwaveError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")
        if self.draft not in SIMULATED:
            raise LayerwaveError(f"--offline simulates --draft {', '.join(SIMULATED[:-1])} or {SIMULATED[-1]} "
                                 f"(got {self.draft!r}); measure {self.draft} by decoding, without --offline")
        if not self.head:
            raise LayerwaveError("--offline replays the head's own held-out replies: pass --head DIR "
                                 "(--draft lookup uses its split only)")
        model_key = store_key(self.model)
        corpus = open_activations(self.store, model_key).attrs.get("corpus", {}).get("spec", "")
        target, head = load_pair(self.model, self.head, "cpu")
        return OfflineEvaluation(self, model_key, corpus, target, head)


@dataclass(frozen=True)
class OfflineEvaluation:
    """A checked `OfflineEvaluateRequest`."""

    request: OfflineEvaluateRequest
    model_key: str
    corpus: str  # the store's corpus spec (τ_offline assumes the target's own replies: regen:DIR)
    target: Any
    head: Any
