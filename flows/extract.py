"""The extraction flow: tokenize and plan → extract every shard → finalize.

Re-running skips committed shards, so a killed run resumes where it stopped. With `part` "i/n",
n runs (e.g. deployment runs on n GPU workers) fill one store together: run i writes the pending
shards s with s mod n = i − 1, whole shards only, and whichever part finishes last finalizes.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from store.errors import LayerwaveError
from store.lock import WHOLE, setup_lock, writer_lock
from tasks.extract.extract import (ExtractRequest, check_request, committed_shards, extract_shard, finalize_store,
                                   prepare_store)
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE


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
    topk: int = 20,
    tokens_per_chunk: int | None = None,
    chunks_per_shard: int | None = None,
    batch_tokens: int | None = None,
    overwrite: bool = False,
    workers: int = 1,
    part: str | None = None,
) -> dict:
    """Write the hidden states of every layer of `model` over `corpus` into `store` (or, with
    `part` "i/n", the i-th of n interleaved subsets of its shards)."""
    logger = get_run_logger()
    request = ExtractRequest(model, corpus, tokens, store, max_length, seed, device, dtype, storage_dtype, topk,
                             tokens_per_chunk, chunks_per_shard, batch_tokens, overwrite)
    index, count = parse_part(part)
    check_request(request, (index, count))
    with writer_lock(store, request.model_key, (index, count)):
        with setup_lock(store, request.model_key):
            plan = prepare_store(request)
        key = plan["model_key"]
        pending = [shard for shard in plan["pending"] if shard % count == index]
        logger.info("%s: %d tokens in %d shards, %d already committed, %d to extract%s (storage %s)",
                    key, plan["n_tokens"], plan["n_shards"], plan["committed"], len(pending),
                    f" as part {part}" if count > 1 else "", plan["storage_dtype"])
        if plan["n_tokens"] < tokens:
            logger.warning("corpus %s holds only %d tokens (within --max-length %d), fewer than --tokens %d: "
                           "extracting all of them", corpus, plan["n_tokens"], max_length, tokens)
        artifact = create_progress_artifact(progress=100.0 * plan["committed"] / plan["n_shards"],
                                            description=f"layerwave extract {key} → {store}")
        started, written, done, wrote = time.perf_counter(), 0, plan["committed"], []
        for result in _windowed(lambda shard: extract_shard.submit(store, key, shard, device), pending, workers):
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


def parse_part(part: str | None) -> tuple[int, int]:
    """"i/n" (1-based, as users count) → (i − 1, n); None → the whole store."""
    if part is None:
        return WHOLE
    try:
        index, count = (int(x) for x in part.split("/"))
    except ValueError:
        raise LayerwaveError(f"--part {part!r} should be i/n, e.g. 1/2 for the first of two parts") from None
    if not 1 <= index <= count:
        raise LayerwaveError(f"--part {part}: i must be between 1 and n (got {index} of {count})")
    return index - 1, count


def _windowed(submit, items, width: int):
    """Submit at most `width` tasks at a time; yield their results in order of submission."""
    in_flight = deque()
    for item in items:
        in_flight.append(submit(item))
        if len(in_flight) >= max(1, width):
            yield in_flight.popleft().result()
    while in_flight:
        yield in_flight.popleft().result()
