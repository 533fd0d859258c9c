"""Extraction tasks: prepare the store template, fill one shard, finalize.

Tasks pass only small metadata between them; the arrays go through the store.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict

import numpy as np
import zarr
from prefect import task
from prefect.cache_policies import NO_CACHE

from store import commit, paths, schema
from store.access import consolidate, open_group, open_root
from store.dtypes import choose_storage_dtype, encode
from store.errors import LayerwaveError, store_writes
from store.layout import Layout, auto_chunking, checked_codecs, create_template
from tasks.data import load_model
from tasks.data.corpus import load_corpus
from tasks.extract.forward import auto_batch_tokens, forward_shard
from tasks.extract.plan import TokenPlan, documents_in, plan_hash, plan_tokens
from tasks.extract.request import ExtractRequest
from tasks.stage_key import without_later_defaults


@task(name="prepare-store", cache_policy=NO_CACHE)
def prepare_store(request: ExtractRequest) -> dict:
    """Tokenize, plan shards and write the template, or find the matching one of an earlier run."""
    loaded = load_model.load(request.model, request.device, request.dtype)
    if request.topk > loaded.model.config.vocab_size:
        raise LayerwaveError(f"--topk {request.topk} is more than {request.model}'s vocabulary of "
                             f"{loaded.model.config.vocab_size} tokens; give at most that (the default is 20)")
    conversations = load_corpus(request.corpus)
    n_layers = len(request.layers) if request.layers is not None else loaded.num_layers + 1
    tokens_per_chunk, default_shard = auto_chunking(n_layers, loaded.hidden_size, tokens_per_chunk=request.tokens_per_chunk,
                                                    longest_document=request.max_length)
    chunks_per_shard = request.chunks_per_shard or default_shard
    plan = plan_tokens(loaded.tokenizer, conversations, tokens=request.tokens, max_length=request.max_length,
                       shard_tokens=tokens_per_chunk * chunks_per_shard, seed=request.seed)
    # What fixes the stored values: the resolved chunking, not whether it was given or defaulted.
    identity = {k: v for k, v in asdict(request).items()
                if k not in ("store", "device", "batch_tokens", "overwrite", "tokens_per_chunk", "chunks_per_shard",
                             "workers", "part")}
    identity = without_later_defaults(identity, {"layers": None})  # all layers: what every store once held
    identity.update(provenance=loaded.provenance, tokens_per_chunk=tokens_per_chunk, chunks_per_shard=chunks_per_shard)
    wanted_hash = plan_hash(plan, identity)

    probe_peak = _probe_peak(loaded, plan, request)  # before any write: a NaN model changes nothing
    with store_writes(request.store):  # a full or read-only disk: one clear message
        root = open_root(request.store)
        key = loaded.provenance["key"]
        existing = _existing_group(root, key)
        if existing is not None and _same_extraction(existing, plan, identity, wanted_hash):
            return _summary(request.store, key, existing)
        if existing is not None and existing.attrs.get("plan_hash") and not request.overwrite:
            raise LayerwaveError(
                f"store {request.store} already holds activations of {key} from another corpus or settings; "
                "pass --overwrite to replace them, or use another --store"
            )
        if existing is not None:
            del root[key][paths.ACTIVATIONS]  # an interrupted template or a replaced extraction
        storage_dtype = choose_storage_dtype(request.storage_dtype, loaded.model.dtype, probe_peak)
        layout = Layout(n_layers=n_layers, n_tokens=plan.n_tokens, hidden_size=loaded.hidden_size,
                        topk=request.topk, tokens_per_chunk=tokens_per_chunk, chunks_per_shard=chunks_per_shard,
                        storage_dtype=storage_dtype, layers=request.layers)
        batch_tokens = request.batch_tokens or auto_batch_tokens(
            loaded.device, n_layers, loaded.hidden_size, loaded.model.config.vocab_size)
        group = root.require_group(key).create_group(paths.ACTIVATIONS)
        group.create_array("source_record", shape=plan.source_record.shape, dtype="int32",
                           compressors=checked_codecs(), dimension_names=["document"])[:] = plan.source_record
        create_template(group, layout, _per_token(plan), attrs={
            "schema_version": schema.SCHEMA_VERSION,
            "layer_convention": schema.LAYER_CONVENTION,
            "labels": schema.LABELS_DOC,
            "model": {**loaded.provenance, "argument": request.model, "num_hidden_layers": loaded.num_layers,
                      "hidden_size": loaded.hidden_size, "vocab_size": loaded.model.config.vocab_size,
                      "compute_dtype": str(loaded.model.dtype).removeprefix("torch.")},
            "corpus": {"spec": request.corpus, "seed": request.seed, "tokens_requested": request.tokens,
                       "max_length": request.max_length, "documents": int(len(plan.source_record)),
                       "tokens": plan.n_tokens, "sha256": plan.digest(), "truncated": plan.truncated},
            "extraction": {"topk": request.topk, "batch_tokens": batch_tokens, "dtype": request.dtype,
                           "layers": request.layers or "all",
                           "storage_dtype_requested": request.storage_dtype, "probe_peak_abs": probe_peak},
            "layout": layout.as_attrs(),
            "complete": False,
            "plan_hash": wanted_hash,  # written last by create_template: marks the template whole
        })
        consolidate(request.store)
        return _summary(request.store, key, group)


def _same_extraction(existing: zarr.Group, plan: TokenPlan, identity: dict, wanted_hash: str) -> bool:
    """Whether the store holds this extraction, its corpus path perhaps spelled another way (relative
    to another folder, absolute, through a link): the hash covers the tokens themselves, so the same
    hash under the recorded spelling means the same tokens and settings."""
    found = existing.attrs.get("plan_hash")
    if found == wanted_hash:
        return True
    recorded = existing.attrs.get("corpus", {}).get("spec", "")
    kind = identity["corpus"].partition(":")[0]
    return (kind in ("regen", "jsonl") and recorded.startswith(kind + ":")
            and found == plan_hash(plan, {**identity, "corpus": recorded}))


def _existing_group(root: zarr.Group, key: str) -> zarr.Group | None:
    try:
        return root[paths.activations(key)]
    except KeyError:
        return None


def _per_token(plan: TokenPlan) -> dict[str, np.ndarray]:
    return {schema.TOKEN_ID: plan.token_id, schema.DOC: plan.doc, schema.POSITION: plan.position,
            schema.LOSS_MASK: plan.loss_mask}


def _probe_peak(loaded, plan: TokenPlan, request: ExtractRequest) -> float:
    """Largest |hidden state| over the first document (up to 512 tokens), to choose float16 safely."""
    if request.storage_dtype != "auto" or loaded.model.dtype != load_model.DTYPES["float32"]:
        return 0.0
    stop = min(documents_in(plan.doc)[0][1], 512)
    outputs = forward_shard(loaded.model, loaded.device, plan.token_id[:stop], [(0, stop)], stop, 1, request.layers)
    encode(outputs.hidden, "float32")  # refuses NaN/inf before anything is written
    return float(outputs.hidden.abs().max())


def _summary(store: str, key: str, group: zarr.Group) -> dict:
    layout = Layout(**group.attrs["layout"])
    done = commit.committed(group)
    corpus = group.attrs["corpus"]
    return {"store": store, "model_key": key, "n_tokens": layout.n_tokens, "n_shards": layout.n_shards,
            "documents": corpus["documents"], "truncated": corpus.get("truncated", 0),
            "truncated_to": min(corpus["max_length"], layout.shard_tokens),
            "committed": int(done.sum()), "pending": [int(i) for i in np.flatnonzero(~done)],
            "storage_dtype": layout.storage_dtype, "plan_hash": group.attrs["plan_hash"]}


def open_activations_group(store: str, key: str) -> zarr.Group:
    return open_group(store, paths.activations(key), "r+")


def _retry_unless_user_error(task, task_run, state) -> bool:
    """Retry crashes and I/O hiccups, not problems a retry cannot fix (NaN model, overflow, a full
    or read-only disk: `store_writes` makes those LayerwaveErrors)."""
    return not isinstance(state.result(raise_on_failure=False), LayerwaveError)


@task(name="extract-shard", retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_unless_user_error,
      cache_policy=NO_CACHE)
def extract_shard(store: str, key: str, shard: int, device: str = "auto") -> dict:
    """Forward one shard's documents and write the whole shard, then its commit marker."""
    group = open_activations_group(store, key)
    if commit.is_committed(group, shard):
        return {"shard": shard, "tokens": 0, "seconds": 0.0, "skipped": True}
    started = time.perf_counter()
    layout = Layout(**group.attrs["layout"])
    model_attrs, extraction = group.attrs["model"], group.attrs["extraction"]
    loaded = load_model.load(model_attrs["argument"], device, extraction["dtype"])
    start, stop = layout.shard_range(shard)
    token_id = group[schema.TOKEN_ID][start:stop]
    documents = documents_in(group[schema.DOC][start:stop])
    try:
        outputs = forward_shard(loaded.model, loaded.device, token_id, documents, extraction["batch_tokens"],
                                layout.topk, layout.layers)
        hidden = encode(outputs.hidden, layout.storage_dtype)
    except LayerwaveError as err:
        raise LayerwaveError(f"shard {shard}: {err}") from None
    with store_writes(store):
        group[schema.HIDDEN_STATES][:, start:stop, :] = hidden
        group[schema.ENTROPY][start:stop] = outputs.entropy
        group[schema.TOPK_IDS][start:stop] = outputs.topk_ids
        group[schema.TOPK_LOGPROBS][start:stop] = outputs.topk_logprobs
        commit.mark_committed(group, shard)
    return {"shard": shard, "tokens": stop - start, "seconds": time.perf_counter() - started, "skipped": False}


def committed_shards(store: str, key: str) -> np.ndarray:
    """One flag per shard: committed (written in full) or not."""
    return commit.committed(open_activations_group(store, key))


@task(name="finalize-store", cache_policy=NO_CACHE)
def finalize_store(store: str, key: str) -> dict:
    """Mark the group complete and refresh consolidated metadata: the last write of an extraction."""
    group = open_activations_group(store, key)
    with store_writes(store):
        commit.mark_complete(group)
        consolidate(store)
    return _summary(store, key, group)


def windowed(submit, items, width: int):
    """Submit at most `width` tasks at a time; yield their results in order of submission."""
    in_flight = deque()
    for item in items:
        in_flight.append(submit(item))
        if len(in_flight) >= max(1, width):
            yield in_flight.popleft().result()
    while in_flight:
        yield in_flight.popleft().result()
