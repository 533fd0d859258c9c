"""The extraction flow: tokenize and plan → extract every shard → finalize.

Re-running skips committed shards, so a killed run resumes where it stopped. With `part` "i/n",
n runs (e.g. deployment runs on n GPU workers) fill one store together: run i writes the pending
shards s with s mod n = i − 1, whole shards only, and whichever part finishes last finalizes.
"""

from __future__ import annotations

import time

import numpy as np
from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from store.lock import setup_lock, writer_lock
from tasks.extract.extract import committed_shards, extract_shard, finalize_store, prepare_store, windowed
from tasks.data.load_model import pick_device
from tasks.extract.request import ExtractRequest
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.precision import emulated_bfloat16_warning
from tasks.request import checked


@flow(name="layerwave-extract")
def extract(
    model: str = DEFAULT_MODEL,
    corpus: str = "sharegpt",
    tokens: int = 20000,
    store: str = DEFAULT_STORE,
    max_length: int = 2048,
    seed: int = 0,
    device: str = "auto",
    dtype: str = "auto",
    storage_dtype: str = "auto",
    layers: list[int] | None = None,
    topk: int = 20,
    tokens_per_chunk: int | None = None,
    chunks_per_shard: int | None = None,
    batch_tokens: int | None = None,
    overwrite: bool = False,
    workers: int = 1,
    part: str | None = None,
) -> dict:
    """Write the hidden states of every layer of `model` (or only `layers`: a training store) over
    `corpus` into `store` (or, with `part` "i/n", the i-th of n interleaved subsets of its shards)."""
    logger = get_run_logger()
    extraction = checked(ExtractRequest(model, corpus, tokens, store, max_length, seed, device, dtype, storage_dtype,
                                        layers, topk, tokens_per_chunk, chunks_per_shard, batch_tokens, overwrite,
                                        workers, part))
    request, (index, count) = extraction.request, extraction.part
    if warning := emulated_bfloat16_warning(dtype, pick_device(device)):
        logger.warning(warning)
    with writer_lock(store, extraction.model_key, (index, count)):
        with setup_lock(store, extraction.model_key):
            plan = prepare_store(request)
        key = plan["model_key"]
        pending = [shard for shard in plan["pending"] if shard % count == index]
        logger.info("%s: %d tokens in %d shards, %d already committed, %d to extract%s (storage %s)",
                    key, plan["n_tokens"], plan["n_shards"], plan["committed"], len(pending),
                    f" as part {part}" if count > 1 else "", plan["storage_dtype"])
        if plan["truncated"]:
            cut_at_shard = plan["truncated_to"] < max_length  # --chunks-per-shard made shards shorter
            logger.warning("%d of %d documents are longer than %d tokens and were truncated to it%s",
                           plan["truncated"], plan["documents"], plan["truncated_to"],
                           ", the shard size: raise --chunks-per-shard to keep them up to --max-length"
                           if cut_at_shard else " (--max-length)")
        if plan["n_tokens"] < tokens:
            logger.warning("corpus %s runs out at %d tokens, fewer than --tokens %d (documents longer than "
                           "--max-length %d or a shard are truncated): extracting those", corpus, plan["n_tokens"],
                           tokens, max_length)
        artifact = create_progress_artifact(progress=100.0 * plan["committed"] / plan["n_shards"],
                                            description=f"layerwave extract {key} → {store}")
        started, written, done, wrote = time.perf_counter(), 0, plan["committed"], []
        for result in windowed(lambda shard: extract_shard.submit(store, key, shard, device), pending, workers):
            done, written = done + 1, written + result["tokens"]
            if not result["skipped"]:
                wrote.append(result["shard"])
            rate = written / max(time.perf_counter() - started, 1e-9)
            eta = (plan["n_tokens"] * (1 - done / plan["n_shards"])) / max(rate, 1e-9)
            logger.info("shard %d done (%d/%d), %.0f tokens/s, ~%.0f s left", result["shard"], done,
                        plan["n_shards"], rate, eta)
            update_progress_artifact(artifact, progress=100.0 * done / plan["n_shards"])
        with setup_lock(store, key):
            flags = committed_shards(store, key)
            complete = bool(flags.all())
            now = {"committed": int(flags.sum()), "pending": [int(s) for s in np.flatnonzero(~flags)]}
            summary = {**(finalize_store(store, key) if complete else {**plan, **now}), "complete": complete}
    # what this run (this part) wrote, beside the store's state after it
    summary.update(part=part or "1/1", shards_written=wrote, tokens_requested=tokens, tokens_written=written,
                   seconds=round(time.perf_counter() - started, 3))
    if complete:
        logger.info("%s complete: %d tokens in %s (group %s/activations)", key, summary["n_tokens"], store, key)
    else:
        logger.info("part %s of %s done; other parts still have shards to write", part, key)
    return summary
