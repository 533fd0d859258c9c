"""Check a store end to end: schema, every committed shard readable (checksums) and finite,
per-token arrays consistent, and which shards are still missing."""

from __future__ import annotations

import shlex
from contextlib import contextmanager

import numpy as np
import zarr

from store import paths, schema
from store.access import check_schema, consolidate, open_group
from store.dtypes import decode
from store.errors import LayerwaveError, is_damaged_chunk, store_writes
from store.layout import Layout

SHARD_ARRAYS = (schema.HIDDEN_STATES, schema.ENTROPY, schema.TOPK_IDS, schema.TOPK_LOGPROBS)


def _open(store: str, model_key: str | None = None, mode: str = "r") -> zarr.Group:
    """The store root or a model's activations; a missing one is the user's mistake, not a crash."""
    path = paths.activations(model_key) if model_key else ""
    try:
        return open_group(store, path, mode)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):
        what = f"no activations for {model_key} in store {store}" if model_key else f"no store at {store}"
        raise LayerwaveError(f"{what}; pass the --store (and --model) an extraction wrote") from None


def model_keys(store: str) -> list[str]:
    return sorted(name for name, group in _open(store).groups() if paths.ACTIVATIONS in group)


def verify_model(store: str, model_key: str) -> tuple[list[str], list[int]]:
    """(problems, shards to re-extract) for one model's activations."""
    group = _open(store, model_key)
    if "plan_hash" not in group.attrs:
        return [f"{model_key}: the template was never finished; re-run the extraction"], []
    layout = Layout(**group.attrs["layout"])
    problems, template = _template_problems(group, layout, model_key)
    if problems:
        return problems, []
    bad, committed = [], template[schema.SHARD_COMMITTED].astype(bool)
    in_document = template[schema.DOC] >= 0  # padding holds no labels (NaN), by design
    for shard in np.flatnonzero(committed):
        start, stop = layout.shard_range(int(shard))
        for name in SHARD_ARRAYS:
            try:
                values = group[name][start:stop] if name != schema.HIDDEN_STATES else \
                    decode(group[name][:, start:stop])
            except Exception as err:  # a codec's checksum or decompression error names no array
                problems.append(f"{model_key}: {name} shard {shard} (tokens {start}..{stop - 1}) is unreadable: {err}")
                bad.append(int(shard))
                break
            kept = values[:, in_document[start:stop]] if name == schema.HIDDEN_STATES else values[in_document[start:stop]]
            if values.dtype.kind == "f" and not np.isfinite(kept).all():
                problems.append(f"{model_key}: {name} shard {shard} (tokens {start}..{stop - 1}) holds NaN or inf")
                bad.append(int(shard))
                break
    missing = [int(s) for s in np.flatnonzero(~committed)]
    if missing:
        problems.append(f"{model_key}: shards {missing} are not committed (an extraction was interrupted)")
    elif not group.attrs.get("complete"):
        problems.append(f"{model_key}: every shard is committed but the store was not finalized (an extraction "
                        "was interrupted at its last step)")
    return problems, bad


PER_TOKEN = (schema.TOKEN_ID, schema.DOC, schema.POSITION, schema.LOSS_MASK, schema.TOKEN)


def _template_problems(group: zarr.Group, layout: Layout, key: str) -> tuple[list[str], dict[str, np.ndarray]]:
    """(problems, values) of the template's arrays (written once, before any shard): readable,
    shaped and consistent. They are not a shard's, so damage here is repaired by extracting anew
    (--overwrite)."""
    problems, values = [], {}
    for name in (*PER_TOKEN, schema.LAYER, schema.SHARD_COMMITTED):
        try:
            values[name] = group[name][:]
        except Exception as err:  # a codec's checksum or decompression error names no array
            problems.append(f"{key}: {name} is unreadable: {err}; extract this model again with --overwrite")
    if problems:
        return problems, values
    for name in PER_TOKEN:
        if values[name].shape != (layout.n_tokens,):
            problems.append(f"{key}: {name} has shape {values[name].shape}, expected ({layout.n_tokens},)")
    if problems:
        return problems, values
    if not np.array_equal(values[schema.LAYER], layout.stored_layers):
        problems.append(f"{key}: the layer coordinate is not {layout.stored_layers}")
    if not np.array_equal(values[schema.TOKEN], np.arange(layout.n_tokens)):
        problems.append(f"{key}: the token coordinate is not 0..{layout.n_tokens - 1}")
    doc, position = values[schema.DOC], values[schema.POSITION]
    starts = np.concatenate([[True], np.diff(doc) != 0])
    expected = np.arange(len(doc)) - np.maximum.accumulate(np.where(starts, np.arange(len(doc)), 0))
    documents = doc >= 0  # padding restarts at 0 per piece, and two pieces can meet at the budget's end
    if np.any(np.diff(doc[documents]) < 0) or not np.array_equal(position[documents], expected[documents]):
        problems.append(f"{key}: doc/position are inconsistent (documents must be contiguous, positions 0, 1, ...)")
    return problems, values


def uncommit(store: str, model_key: str, shards: list[int]) -> None:
    """Mark damaged shards for rewriting: the next extraction with the same arguments redoes them."""
    group = _open(store, model_key, mode="r+")
    with store_writes(store):
        for shard in shards:
            group[schema.SHARD_COMMITTED][shard] = False
        group.attrs["complete"] = False
        consolidate(store)  # readers through consolidated metadata (xarray) must see it incomplete too


def extract_command(store: str, model_key: str) -> str:
    """The `layerwave extract` command line that resumes this model's extraction."""
    attrs = open_group(store, paths.activations(model_key)).attrs
    corpus, extraction, layout = attrs["corpus"], attrs["extraction"], attrs["layout"]
    arguments = {"model": attrs["model"]["argument"], "corpus": corpus["spec"], "tokens": corpus["tokens_requested"],
                 "seed": corpus["seed"], "max-length": corpus["max_length"], "topk": extraction["topk"],
                 "dtype": extraction["dtype"], "storage-dtype": extraction["storage_dtype_requested"],
                 "tokens-per-chunk": layout["tokens_per_chunk"], "chunks-per-shard": layout["chunks_per_shard"],
                 "store": store}
    if layout.get("layers") is not None:  # a training store: the same layers again
        arguments["layers"] = ",".join(map(str, layout["layers"]))
    return "layerwave extract " + " ".join(f"--{name} {shlex.quote(str(value))}" for name, value in arguments.items())


def verify(store: str, model: str | None = None, repair: bool = False) -> tuple[bool, list[str]]:
    """(sound, report lines). With `repair`, damaged shards are un-committed for re-extraction."""
    check_schema(store)
    keys = [model] if model else model_keys(store)
    lines, sound = [], True
    for key in keys:
        problems, bad = verify_model(store, key)
        if not problems:
            lines.append(f"{key}: sound")
            continue
        sound = False
        lines += problems
        if bad and repair:
            uncommit(store, key, bad)
            lines.append(f"{key}: shards {bad} marked for rewriting")
        if bad and not repair:
            lines.append(f"{key}: to repair, run `layerwave verify --store {store} --model {key} --repair`, then:")
        if bad or any("not committed" in p or "not finalized" in p for p in problems):
            lines.append(f"  {extract_command(store, key)}")
    return sound, lines


def first_damage(store: str) -> tuple[str, bool] | None:
    """The first unreadable array (shard) of any model in `store`, as `verify` reports it, and
    whether extracting its shards again repairs it (a template array needs a new extraction)."""
    for key in model_keys(store):
        for problem in verify_model(store, key)[0]:
            if "is unreadable" in problem:
                return problem.split(" is unreadable")[0], "--overwrite" not in problem
    return None


@contextmanager
def store_reads(store: str | None):
    """Turn a chunk whose checksum fails, met by any command that reads the store, into one line
    naming the damaged array and shard (found by scanning the store as `verify` does) and the fix,
    instead of a codec traceback."""
    try:
        yield
    except (ValueError, RuntimeError) as err:
        if not is_damaged_chunk(err):
            raise
        where, by_shard = (first_damage(store) if store else None) or ("a chunk", True)
        option = f" --store {store}" if store else ""
        fix = (f"run `layerwave verify{option} --repair`, then the `layerwave extract` command it prints, to rewrite it"
               if by_shard else "extract this model again with --overwrite")
        raise LayerwaveError(f"{f'store {store}' if store else 'the store'}: {where} is damaged (its checksum does "
                             f"not match); {fix}") from err
