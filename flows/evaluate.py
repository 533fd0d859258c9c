"""The evaluation flow: a trained head and its target generate together; τ and speed-up, checked lossless."""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from store.errors import LayerwaveError
from tasks.decode.evaluate import evaluate_task, heldout_data
from tasks.decode.request import EvaluateRequest, OfflineEvaluateRequest
from tasks.decode.tree_shape import TreeShape
from tasks.heads.offline_tau import offline_tau
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import checked


@flow(name="layerwave-evaluate")
def evaluate(model: str = DEFAULT_MODEL, head: str = "", bench: str = "mt-bench", limit: int | None = 10,
             max_new_tokens: int = 128, depth: int = 4, store: str | None = None, temperature: float = 0.0,
             seed: int = 0, draft: str = "chain", tree_topk: int = TreeShape.topk,
             tree_tokens: int = TreeShape.tokens, device: str = "auto", precision: str = "auto",
             compare: bool = False, repeat: int = 1) -> dict:
    """Speculative decoding of `bench` prompts against the target decoding alone, on `device`
    (auto: CUDA when present), the target in `precision` (auto: bfloat16 where native). `draft`:
    "chain" (the head drafts `depth` tokens per round), "tree" (EAGLE-2 dynamic tree `depth`
    levels deep, `tree_topk` children per expanded node, `tree_tokens` nodes verified per round),
    "lookup" (copies from the context's own n-grams; no head), "hybrid" (the head's chain and the
    copy verified together) or "auto" (whichever has the most expected tokens per second).
    `compare`: Hugging Face prompt lookup and every draft side by side, each against the target
    alone on the same prompts. `repeat`: each prompt timed that many times, each side's median kept."""
    evaluation = checked(EvaluateRequest(model=model, head=head, bench=bench, limit=limit,
                                         max_new_tokens=max_new_tokens, depth=depth, store=store,
                                         temperature=temperature, seed=seed, draft=draft, tree_topk=tree_topk,
                                         tree_tokens=tree_tokens, device=device, precision=precision,
                                         compare=compare, repeat=repeat))
    result = evaluate_task(evaluation)
    results = result["compare"] if compare else {draft: result}
    create_table_artifact(key="speculative-decoding", table=[{"decoder": name, **{k: r[k] for k in (
        "tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "lossless", "prompts")}}
        for name, r in results.items()], description=f"{model} with head {head} on {bench}")
    mismatched = {name: r["mismatched_prompts"] for name, r in results.items() if r["lossless"] is False}
    if mismatched:
        raise LayerwaveError(f"output differs from plain greedy decoding ({mismatched}, decoder: prompts): "
                             "decoding is not lossless (a bug; please report it)")
    return {"model": model, "head": head, "bench": bench, **result}


@flow(name="layerwave-evaluate-offline")
def evaluate_offline(model: str = DEFAULT_MODEL, head: str = "", store: str = DEFAULT_STORE, depth: int = 4,
                     max_new_tokens: int | None = None, first_turn_only: bool = False,
                     limit: int | None = None, draft: str = "chain") -> dict:
    """τ_offline: `draft` decoding (the head's chain of `depth` drafts per round, the context's
    copy, or both as hybrid drafting's tree) simulated along the held-out replies of `store` (the
    head's own held-out split, its first `limit` documents that have a reply), without running
    the target (tasks/heads/offline_tau.py)."""
    logger = get_run_logger()
    e = checked(OfflineEvaluateRequest(model, head, store, depth, max_new_tokens, first_turn_only, limit, draft))
    result = offline_tau(e.head, heldout_data(e.head, head, store, e.model_key), depth, e.target.tokenizer.eos_token_id,
                         max_new_tokens, first_turn_only, limit, draft)
    corpus = e.corpus
    if not corpus.startswith("regen:"):
        logger.warning("store %s was extracted from %s, not from the target's own replies (regen:DIR): "
                       "τ_offline assumes the stored replies are what the target would generate", store, corpus)
    logger.info("τ_offline (%s) %.3f (95%% CI %.3f–%.3f) over %d rounds in %d held-out replies; acceptance per "
                "position %s", draft, result["tau"], *result["tau_ci95"], result["rounds"], result["replies"],
                " ".join(f"{p:.2f}" for p in result["per_position"]))
    return {"model": model, "head": head, "store": store, "corpus": corpus, "draft": draft, **result}
