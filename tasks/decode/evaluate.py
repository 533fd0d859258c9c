"""The evaluation stage's work: the target and head loaded once per process, the benchmark's
prompts chosen, and the side-by-side decoding task flows/evaluate.py runs on a checked request
(tasks/decode/request.py).
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
from tasks.data.registry import store_key
from tasks.decode.decoders import COMPARED, baseline, decoder, depth_of, drafted
from tasks.decode.draft_auto import acceptance_profile, auto_plan
from tasks.decode.lossless import TieCheck
from tasks.decode.request import Evaluation
from tasks.decode.side_by_side import side_by_side, summarize
from tasks.decode.spec_decode import for_drafting, plain_generate
from tasks.decode.tree_shape import TreeShape
from tasks.heads.export_head import load_exported
from tasks.heads.offline_tau import offline_tau
from tasks.heads.train_data import StoreBatches
from tasks.heads.train_head import TrainConfig
from tasks.precision import resolve_precision


def load_pair(model: str, head_dir: str, device: str = "auto", precision: str = "float32"):
    """Target in `precision` (tasks/precision.py) and head on `device` (the head in the precision it
    drafts in: `for_drafting`; None without `head_dir`), refusing a head made for another model or
    for layers the model lacks. Loaded once per process: the request's check and the work share
    them (a head rewritten on disk is loaded afresh)."""
    dtype = resolve_precision(precision, load_model.pick_device(device))
    if not head_dir:
        return load_model.load(model, device, dtype), None
    head = location(head_dir)
    if not (head / "config.json").is_file():
        raise LayerwaveError(f"--head {head_dir} has no config.json; pass a directory written by `layerwave train`")
    files = [head / name for name in ("config.json", "model.safetensors")]
    return _load_pair(model, str(head.resolve()), device, dtype,
                      tuple((p.stat().st_mtime, p.stat().st_size) if p.exists() else None for p in files))


@functools.lru_cache(maxsize=2)
def _load_pair(model: str, head_dir: str, device: str, dtype: str, _signature: tuple):
    key, trained_on = store_key(model), training_split(head_dir)[2]
    if trained_on is not None and trained_on != key:
        raise LayerwaveError(f"head {head_dir} was trained on {trained_on}'s activations, not {key}'s; pass "
                             f"--model {trained_on} or a head trained for {key}")
    target = load_model.load(model, device, dtype)
    head = load_exported(head_dir, embeddings=target.model.get_input_embeddings().weight.detach().float())
    c, t = head.config, target.model.config
    if (c.hidden_size, c.vocab_size) != (t.hidden_size, t.vocab_size):
        raise LayerwaveError(f"head {head_dir} was trained for a model of width {c.hidden_size} and vocabulary "
                             f"{c.vocab_size}; {model} has {t.hidden_size} and {t.vocab_size}")
    if max(c.layers) > t.num_hidden_layers:
        raise LayerwaveError(f"head {head_dir} reads layers {c.layers}; {model} has HF indices 0..{t.num_hidden_layers}")
    return target, for_drafting(head.to(target.device), target.device)


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
def evaluate_task(evaluation: Evaluation) -> dict:
    """Each decoder asked for beside the target alone on the same prompts (tasks/decode/side_by_side.py)."""
    logger = get_run_logger()
    r, target, head, prompts = evaluation.request, evaluation.target, evaluation.head, evaluation.prompts
    eos = target.tokenizer.eos_token_id
    plain_generate(target.model, prompts[0], 2, eos)  # warm-up, untimed
    names = list(COMPARED) if r.compare else [r.draft]
    options = {"max_new_tokens": r.max_new_tokens, "depth": r.depth, "eos": eos, "temperature": r.temperature,
               "generator": torch.Generator().manual_seed(r.seed), "tree": TreeShape(r.tree_topk, r.tree_tokens)}
    plan = None
    if "auto" in names:
        measure = measured_acceptance(head, r.head, r.store, evaluation.model_key, eos) if r.store else None
        per_position, source = acceptance_profile(r.head, measure)
        plan = {**auto_plan(target.model, head, prompts[0], per_position, eos, r.max_new_tokens,
                            lambda name: drafted(name, target.model, head, **options)), "source": source}
        logger.info("auto: %s; chain acceptance per position %s (%s)", plan["why"],
                    " ".join(f"{p:.2f}" for p in per_position), source)
    choice = plan and plan["choice"]
    rows = side_by_side(baseline(target.model, r.max_new_tokens, eos, r.temperature),
                        [decoder(name, target.model, head, auto_choice=choice, **options) for name in names], prompts,
                        logger.info, r.repeat,
                        TieCheck(target.model) if r.temperature == 0 else None)
    results = {name: summarize(rows[name], depth_of(name, r.depth, choice), sampled=r.temperature > 0)
               for name in names}
    settings = {"draft": r.draft, "tree_topk": r.tree_topk, "tree_tokens": r.tree_tokens,
                "device": str(target.device), "precision": str(target.model.dtype).removeprefix("torch."),
                "auto": plan, "repeat": r.repeat}
    if r.compare:
        return {"compare": results, **settings, "prompts": len(prompts), "depth": r.depth,
                "lossless": all(row["lossless"] is not False for row in results.values())}
    return {**results[r.draft], **settings}


def training_split(head_dir: str) -> tuple[int, float, str | None]:
    """(seed, held-out fraction, model key) the head was trained with, from its training.json."""
    path = location(head_dir) / "training.json"
    if not path.is_file():
        return TrainConfig.seed, TrainConfig.holdout, None  # a head from elsewhere: the training defaults
    record = read_json(path)
    return record["config"]["seed"], record["config"]["holdout"], record.get("model")
