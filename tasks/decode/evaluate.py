"""The evaluation stage's work: the target and head loaded once per process, the request
checked, the benchmark's prompts chosen, and the side-by-side decoding task flows/evaluate.py runs.
"""

from __future__ import annotations

import functools

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from store.artefacts import location, read_json
from store.errors import LayerwaveError
from tasks.data import load_model
from tasks.data.prompts import (checked_prompts, encode_prompts, first_turns, fitting_prompts, heldout_prompts,
                                used_records)
from tasks.data.registry import resolve, store_key
from tasks.decode.decoders import COMPARED, DRAFTS, baseline, decoder, depth_of
from tasks.decode.draft_auto import acceptance_profile, auto_plan
from tasks.decode.side_by_side import side_by_side, summarize
from tasks.decode.spec_decode import for_drafting, plain_generate
from tasks.decode.tree_decode import TreeShape
from tasks.heads.export_head import load_exported
from tasks.heads.offline_tau import offline_tau
from tasks.heads.train_data import StoreBatches
from tasks.heads.train_head import TrainConfig


def load_pair(model: str, head_dir: str, device: str = "auto"):
    """Target and head on `device` (the head in the precision it drafts in: `for_drafting`), refusing
    a head made for another model or for layers the model lacks. Loaded once per process: the
    request's check and the work share them (a head rewritten on disk is loaded afresh)."""
    head = location(head_dir)
    if not (head / "config.json").is_file():
        raise LayerwaveError(f"--head {head_dir} has no config.json; pass a directory written by `layerwave train`")
    files = [head / name for name in ("config.json", "model.safetensors")]
    return _load_pair(model, str(head.resolve()), device,
                      tuple((p.stat().st_mtime, p.stat().st_size) if p.exists() else None for p in files))


@functools.lru_cache(maxsize=2)
def _load_pair(model: str, head_dir: str, device: str, _signature: tuple):
    key, trained_on = store_key(model), training_split(head_dir)[2]
    if trained_on is not None and trained_on != key:
        raise LayerwaveError(f"head {head_dir} was trained on {trained_on}'s activations, not {key}'s; pass "
                             f"--model {trained_on} or a head trained for {key}")
    target = load_model.load(model, device, "auto")
    head = load_exported(head_dir, embeddings=target.model.get_input_embeddings().weight.detach().float())
    c, t = head.config, target.model.config
    if (c.hidden_size, c.vocab_size) != (t.hidden_size, t.vocab_size):
        raise LayerwaveError(f"head {head_dir} was trained for a model of width {c.hidden_size} and vocabulary "
                             f"{c.vocab_size}; {model} has {t.hidden_size} and {t.vocab_size}")
    if max(c.layers) > t.num_hidden_layers:
        raise LayerwaveError(f"head {head_dir} reads layers {c.layers}; {model} has HF indices 0..{t.num_hidden_layers}")
    return target, for_drafting(head.to(target.device), target.device)


def check_request(model: str, head_dir: str, bench: str, limit: int | None, max_new_tokens: int, depth: int,
                  temperature: float = 0.0, draft: str = "chain", tree_topk: int = TreeShape.topk,
                  tree_tokens: int = TreeShape.tokens, device: str = "auto", store: str | None = None,
                  compare: bool = False, repeat: int = 1) -> None:
    """Every mistake in an evaluation request, before generation starts."""
    if depth < 1:
        raise LayerwaveError(f"--depth must be at least 1 (got {depth})")
    if repeat < 1:
        raise LayerwaveError(f"--repeat must be at least 1 (got {repeat})")
    if temperature < 0:
        raise LayerwaveError(f"--temperature must be >= 0 (got {temperature}); 0 is greedy")
    if draft not in DRAFTS:
        raise LayerwaveError(f"unknown --draft {draft!r}; use {', '.join(DRAFTS[:-1])} or {DRAFTS[-1]}")
    if tree_tokens < 1:
        raise LayerwaveError(f"--tree-tokens must be at least 1 (got {tree_tokens})")
    if (compare or draft == "auto") and store is None:
        acceptance_profile(head_dir)  # one line when the head records none and no store can measure it
    target, head = load_pair(model, head_dir, device)
    if not 1 <= tree_topk <= head.config.draft_vocab_size:
        raise LayerwaveError(f"--tree-topk must be between 1 and the head's draft vocabulary of "
                             f"{head.config.draft_vocab_size} (got {tree_topk})")
    bench_prompts(bench, target, limit, max_new_tokens, store, resolve(model).key, head_dir)


def bench_prompts(bench: str, target, limit: int | None, max_new_tokens: int, store: str | None, model_key: str,
                  head_dir: str) -> list[list[int]]:
    """Prompt token ids of a benchmark: chat-templated first turns (ShareGPT ones not in `store`'s
    training data, skipping those too long for the context), or `heldout`: the exact prompts of the
    head's held-out documents in `store`."""
    max_positions = target.model.config.max_position_embeddings
    if bench == "sharegpt":  # a sample: prompts too long for the context are skipped
        turns = first_turns(bench, None, exclude=used_records(store, model_key))
        return fitting_prompts(target.tokenizer, turns, max_positions, max_new_tokens, limit)
    if bench != "heldout":
        return encode_prompts(target.tokenizer, first_turns(bench, limit), max_positions, max_new_tokens)
    seed, holdout, _ = training_split(head_dir)
    return checked_prompts(heldout_prompts(store, model_key, seed, holdout, limit, target.tokenizer.eos_token_id,
                                           max_new_tokens), max_positions, max_new_tokens)


def heldout_data(head, head_dir: str, store: str, model_key: str) -> StoreBatches:
    """The head's own held-out split of `store`, for offline τ."""
    seed, holdout, _ = training_split(head_dir)
    return StoreBatches(store, model_key, head.config.layers, seq_len=1, batch_size=1, seed=seed, holdout=holdout)


def measured_acceptance(head, head_dir: str, store: str, model_key: str, eos: int | None, depth: int = 8):
    """Acceptance per position measured offline along 8 of the head's held-out replies in `store`."""
    return lambda: offline_tau(head, heldout_data(head, head_dir, store, model_key), depth, eos,
                               limit=8)["per_position"]


@task(name="speculative-decoding", cache_policy=NO_CACHE)
def evaluate_task(model: str, head_dir: str, bench: str, limit: int | None, max_new_tokens: int, depth: int,
                  store: str | None, temperature: float = 0.0, seed: int = 0, draft: str = "chain",
                  tree_topk: int = TreeShape.topk, tree_tokens: int = TreeShape.tokens,
                  device: str = "auto", compare: bool = False, repeat: int = 1) -> dict:
    """Each decoder asked for beside the target alone on the same prompts (tasks/decode/side_by_side.py)."""
    logger = get_run_logger()
    target, head = load_pair(model, head_dir, device)
    key = resolve(model).key
    prompts = bench_prompts(bench, target, limit, max_new_tokens, store, key, head_dir)
    eos = target.tokenizer.eos_token_id
    plain_generate(target.model, prompts[0], 2, eos)  # warm-up, untimed
    names = list(COMPARED) if compare else [draft]
    plan = None
    if "auto" in names:
        per_position, source = acceptance_profile(
            head_dir, measured_acceptance(head, head_dir, store, key, eos) if store else None)
        plan = {**auto_plan(target.model, head, prompts[0], per_position, eos, max_new_tokens), "source": source}
        logger.info("auto: depth %d (0 = the target alone), expected %.2fx, from acceptance per position %s (%s)",
                    plan["depth"], plan["expected_speedup"], " ".join(f"{p:.2f}" for p in per_position), source)
    options = {"max_new_tokens": max_new_tokens, "depth": depth, "eos": eos, "temperature": temperature,
               "generator": torch.Generator().manual_seed(seed), "tree": TreeShape(tree_topk, tree_tokens),
               "auto_depth": plan and plan["depth"]}
    rows = side_by_side(baseline(target.model, max_new_tokens, eos, temperature),
                        [decoder(name, target.model, head, **options) for name in names], prompts, logger.info,
                        repeat)
    results = {name: summarize(rows[name], depth_of(name, depth, options["auto_depth"]), sampled=temperature > 0)
               for name in names}
    settings = {"draft": draft, "tree_topk": tree_topk, "tree_tokens": tree_tokens, "device": str(target.device),
                "auto": plan, "repeat": repeat}
    if compare:
        return {"compare": results, **settings, "prompts": len(prompts), "depth": depth,
                "lossless": all(r["lossless"] is not False for r in results.values())}
    return {**results[draft], **settings}


def training_split(head_dir: str) -> tuple[int, float, str | None]:
    """(seed, held-out fraction, model key) the head was trained with, from its training.json."""
    path = location(head_dir) / "training.json"
    if not path.is_file():
        return TrainConfig.seed, TrainConfig.holdout, None  # a head from elsewhere: the training defaults
    record = read_json(path)
    return record["config"]["seed"], record["config"]["holdout"], record.get("model")
