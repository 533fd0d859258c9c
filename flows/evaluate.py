"""The evaluation flow: a trained head and its target generate together; τ and speed-up, checked lossless."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from store.errors import LayerwaveError
from tasks import load_model
from tasks.export_head import load_exported
from tasks.prompts import encode_prompts, first_turns, used_records
from tasks.registry import resolve
from tasks.spec_decode import HeadDrafter, plain_generate, speculative_generate
from tasks.tree_decode import TreeShape

DRAFTS = ("chain", "tree")


def load_pair(model: str, head_dir: str, device: str = "auto"):
    """Target and head on `device`, refusing a head made for another model or for layers the
    model lacks."""
    if not (Path(head_dir) / "config.json").is_file():
        raise LayerwaveError(f"--head {head_dir} has no config.json; pass a directory written by `layerwave train`")
    target = load_model.load(model, device, "auto")
    head = load_exported(Path(head_dir), embeddings=target.model.get_input_embeddings().weight.detach().float())
    c, t = head.config, target.model.config
    if (c.hidden_size, c.vocab_size) != (t.hidden_size, t.vocab_size):
        raise LayerwaveError(f"head {head_dir} was trained for a model of width {c.hidden_size} and vocabulary "
                             f"{c.vocab_size}; {model} has {t.hidden_size} and {t.vocab_size}")
    if max(c.layers) > t.num_hidden_layers:
        raise LayerwaveError(f"head {head_dir} reads layers {c.layers}; {model} has HF indices 0..{t.num_hidden_layers}")
    return target, head.to(target.device)


def check_request(model: str, head_dir: str, bench: str, limit: int | None, max_new_tokens: int, depth: int,
                  temperature: float = 0.0, draft: str = "chain", tree_topk: int = TreeShape.topk,
                  tree_tokens: int = TreeShape.tokens, device: str = "auto") -> None:
    """Every mistake in an evaluation request, before generation starts."""
    if depth < 1:
        raise LayerwaveError(f"--depth must be at least 1 (got {depth})")
    if temperature < 0:
        raise LayerwaveError(f"--temperature must be >= 0 (got {temperature}); 0 is greedy")
    if draft not in DRAFTS:
        raise LayerwaveError(f"unknown --draft {draft!r}; use {' or '.join(DRAFTS)}")
    if tree_tokens < 1:
        raise LayerwaveError(f"--tree-tokens must be at least 1 (got {tree_tokens})")
    target, head = load_pair(model, head_dir, device)
    if not 1 <= tree_topk <= head.config.draft_vocab_size:
        raise LayerwaveError(f"--tree-topk must be between 1 and the head's draft vocabulary of "
                             f"{head.config.draft_vocab_size} (got {tree_topk})")
    encode_prompts(target.tokenizer, first_turns(bench, limit), target.model.config.max_position_embeddings,
                   max_new_tokens)


@task(name="speculative-decoding", cache_policy=NO_CACHE)
def evaluate_task(model: str, head_dir: str, bench: str, limit: int | None, max_new_tokens: int, depth: int,
                  store: str | None, temperature: float = 0.0, seed: int = 0, draft: str = "chain",
                  tree_topk: int = TreeShape.topk, tree_tokens: int = TreeShape.tokens,
                  device: str = "auto") -> dict:
    logger = get_run_logger()
    target, head = load_pair(model, head_dir, device)
    turns = first_turns(bench, limit, exclude=used_records(store, resolve(model).key))
    prompts = encode_prompts(target.tokenizer, turns, target.model.config.max_position_embeddings, max_new_tokens)
    eos = target.tokenizer.eos_token_id
    plain_generate(target.model, prompts[0], 2, eos)  # warm-up, untimed
    rows, mismatches = [], []
    generator = torch.Generator().manual_seed(seed)
    tree = TreeShape(tree_topk, tree_tokens) if draft == "tree" else None
    for number, prompt in enumerate(prompts):
        base = plain_generate(target.model, prompt, max_new_tokens, eos, temperature)
        spec = speculative_generate(target.model, head.config.layers, HeadDrafter(head), prompt, max_new_tokens,
                                    depth, eos, temperature, generator, tree)
        if temperature == 0 and spec.tokens != base.tokens:
            mismatches.append(number)
        rows.append({"prompt": number, "tokens": len(spec.tokens), "tau": spec.tau, "accepted": spec.accepted,
                     "seconds": spec.seconds, "baseline_tokens": len(base.tokens), "baseline_seconds": base.seconds})
        logger.info("prompt %d/%d: τ %.2f, %d tokens, %.2fs vs %.2fs plain", number + 1, len(prompts), spec.tau,
                    len(spec.tokens), spec.seconds, base.seconds)
    settings = {"draft": draft, "tree_topk": tree_topk if tree else None,
                "tree_tokens": tree_tokens if tree else None, "device": str(target.device)}
    return {**summarize(rows, depth, mismatches, sampled=temperature > 0), **settings}


def summarize(rows: list[dict], depth: int, mismatches: list[int], sampled: bool = False) -> dict:
    """Totals over prompts. Sampled outputs differ from a sampled baseline by chance, so
    `lossless` (token-for-token identity) is only defined, and checked, for greedy decoding."""
    rounds = [a for row in rows for a in row["accepted"]]
    tokens = sum(row["tokens"] for row in rows)
    baseline_tokens = sum(row["baseline_tokens"] for row in rows)
    seconds, baseline = sum(row["seconds"] for row in rows), sum(row["baseline_seconds"] for row in rows)
    return {"tau": (sum(rounds) + len(rounds)) / max(len(rounds), 1),
            "per_position": [float(np.mean([a > i for a in rounds])) if rounds else 0.0 for i in range(depth)],
            "tokens_per_s": tokens / seconds, "baseline_tokens_per_s": baseline_tokens / baseline,
            "speedup": (tokens / seconds) / (baseline_tokens / baseline),
            "lossless": None if sampled else not mismatches, "mismatched_prompts": mismatches,
            "prompts": len(rows), "tokens": tokens, "depth": depth, "rows": rows}


@flow(name="layerwave-evaluate")
def evaluate(model: str = "smollm2-135m", head: str = "", bench: str = "mt-bench", limit: int | None = 10,
             max_new_tokens: int = 128, depth: int = 4, store: str | None = None, temperature: float = 0.0,
             seed: int = 0, draft: str = "chain", tree_topk: int = TreeShape.topk,
             tree_tokens: int = TreeShape.tokens, device: str = "auto") -> dict:
    """Speculative decoding of `bench` prompts with `head`, against the target decoding alone, on
    `device` (auto: CUDA when present). `draft`: "chain" (`depth` tokens per round) or "tree"
    (EAGLE-2 dynamic tree `depth` levels deep, `tree_topk` children per expanded node,
    `tree_tokens` nodes verified per round)."""
    check_request(model, head, bench, limit, max_new_tokens, depth, temperature, draft, tree_topk, tree_tokens,
                  device)
    result = evaluate_task(model, head, bench, limit, max_new_tokens, depth, store, temperature, seed, draft,
                           tree_topk, tree_tokens, device)
    create_table_artifact(key="speculative-decoding", table=[{k: result[k] for k in (
        "tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "lossless", "prompts")}],
        description=f"{model} with head {head} on {bench}")
    if result["lossless"] is False:
        raise LayerwaveError(f"speculative output differs from plain greedy decoding on prompts "
                             f"{result['mismatched_prompts']}: decoding is not lossless (a bug; please report it)")
    return {"model": model, "head": head, "bench": bench, **result}
