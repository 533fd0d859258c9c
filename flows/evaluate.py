"""The evaluation flow: a trained head and its target generate together; τ and speed-up, checked lossless."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from store.errors import LayerwaveError
from store.read import open_activations
from tasks import load_model
from tasks.export_head import load_exported
from tasks.offline_tau import offline_tau
from tasks.prompts import checked_prompts, encode_prompts, first_turns, heldout_prompts, used_records
from tasks.registry import resolve, store_key
from tasks.spec_decode import HeadDrafter, plain_generate, speculative_generate
from tasks.train_data import StoreBatches
from tasks.train_head import TrainConfig
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
                  tree_tokens: int = TreeShape.tokens, device: str = "auto", store: str | None = None) -> None:
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
    bench_prompts(bench, target, limit, max_new_tokens, store, resolve(model).key, head_dir)


def bench_prompts(bench: str, target, limit: int | None, max_new_tokens: int, store: str | None, model_key: str,
                  head_dir: str) -> list[list[int]]:
    """Prompt token ids of a benchmark: chat-templated first turns (ShareGPT ones not in `store`'s
    training data), or `heldout`: the exact prompts of the head's held-out documents in `store`."""
    max_positions = target.model.config.max_position_embeddings
    if bench != "heldout":
        turns = first_turns(bench, limit, exclude=used_records(store, model_key))
        return encode_prompts(target.tokenizer, turns, max_positions, max_new_tokens)
    seed, holdout, _ = training_split(head_dir)
    return checked_prompts(heldout_prompts(store, model_key, seed, holdout, limit, target.tokenizer.eos_token_id,
                                           max_new_tokens), max_positions, max_new_tokens)


@task(name="speculative-decoding", cache_policy=NO_CACHE)
def evaluate_task(model: str, head_dir: str, bench: str, limit: int | None, max_new_tokens: int, depth: int,
                  store: str | None, temperature: float = 0.0, seed: int = 0, draft: str = "chain",
                  tree_topk: int = TreeShape.topk, tree_tokens: int = TreeShape.tokens,
                  device: str = "auto") -> dict:
    logger = get_run_logger()
    target, head = load_pair(model, head_dir, device)
    prompts = bench_prompts(bench, target, limit, max_new_tokens, store, resolve(model).key, head_dir)
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
                  device, store)
    result = evaluate_task(model, head, bench, limit, max_new_tokens, depth, store, temperature, seed, draft,
                           tree_topk, tree_tokens, device)
    create_table_artifact(key="speculative-decoding", table=[{k: result[k] for k in (
        "tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "lossless", "prompts")}],
        description=f"{model} with head {head} on {bench}")
    if result["lossless"] is False:
        raise LayerwaveError(f"speculative output differs from plain greedy decoding on prompts "
                             f"{result['mismatched_prompts']}: decoding is not lossless (a bug; please report it)")
    return {"model": model, "head": head, "bench": bench, **result}


def training_split(head_dir: str) -> tuple[int, float, str | None]:
    """(seed, held-out fraction, model key) the head was trained with, from its training.json."""
    path = Path(head_dir) / "training.json"
    if not path.is_file():
        return TrainConfig.seed, TrainConfig.holdout, None  # a head from elsewhere: the training defaults
    record = json.loads(path.read_text())
    return record["config"]["seed"], record["config"]["holdout"], record.get("model")


@flow(name="layerwave-evaluate-offline")
def evaluate_offline(model: str = "smollm2-135m", head: str = "", store: str = "layerwave.zarr", depth: int = 4,
                     max_new_tokens: int | None = None, first_turn_only: bool = False,
                     limit: int | None = None) -> dict:
    """τ_offline: chain decoding `depth` drafts per round simulated along the held-out replies of
    `store` (the head's own held-out split, its first `limit` documents that have a reply),
    without running the target (tasks/offline_tau.py)."""
    logger = get_run_logger()
    if depth < 1:
        raise LayerwaveError(f"--depth must be at least 1 (got {depth})")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise LayerwaveError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    if limit is not None and limit < 1:
        raise LayerwaveError(f"--limit must be at least 1 (got {limit})")
    key = store_key(model)
    ds = open_activations(store, key)
    seed, holdout, trained_on = training_split(head)
    if trained_on is not None and trained_on != key:
        raise LayerwaveError(f"head {head} was trained on {trained_on}'s activations, not {key}'s; pass "
                             f"--model {trained_on} or a head trained for {key}")
    target, drafter = load_pair(model, head, "cpu")
    data = StoreBatches(store, key, drafter.config.layers, seq_len=1, batch_size=1, seed=seed, holdout=holdout)
    result = offline_tau(drafter, data, depth, target.tokenizer.eos_token_id, max_new_tokens, first_turn_only, limit)
    corpus = ds.attrs.get("corpus", {}).get("spec", "")
    if not corpus.startswith("regen:"):
        logger.warning("store %s was extracted from %s, not from the target's own replies (regen:DIR): "
                       "τ_offline assumes the stored replies are what the target would generate", store, corpus)
    logger.info("τ_offline %.3f (95%% CI %.3f–%.3f) over %d rounds in %d held-out replies; acceptance per "
                "position %s", result["tau"], *result["tau_ci95"], result["rounds"], result["replies"],
                " ".join(f"{p:.2f}" for p in result["per_position"]))
    return {"model": model, "head": head, "store": store, "corpus": corpus, **result}
