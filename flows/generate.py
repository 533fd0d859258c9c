"""The generation flow: the target answers a corpus's prompts itself, shard by shard.

    plan (manifest) → generate shard 0, 1, ... until the reply-token budget is spent → complete

Re-running skips committed shards and regenerates the rest exactly (tasks/data/generate.py).
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from store.artefacts import location
from store.lock import WHOLE, writer_lock
from tasks.data import load_model
from tasks.data.corpus import load_corpus
from tasks.data.generate import (check_chat_template, finish, generate_shard_task, generation_summary, prepare,
                                 shard_records, shard_stats)
from tasks.data.generate_request import GenerateRequest
from tasks.data.regen_corpus import committed_shards
from tasks.data.registry import resolve
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.precision import emulated_bfloat16_warning
from tasks.progress import GenerationMeter
from tasks.request import checked


@flow(name="layerwave-generate")
def generate(model: str = DEFAULT_MODEL, source: str = "sharegpt", out: str | None = None, tokens: int = 20000,
             max_new_tokens: int = 256, max_prompt_tokens: int = 1024, turns: int = 3, temperature: float = 0.0,
             seed: int = 0, batch_size: int = 32, shard_size: int = 64, device: str = "auto", dtype: str = "auto",
             overwrite: bool = False, store: str = DEFAULT_STORE) -> dict:
    """`model` writes its own replies to `source`'s user turns into `out` (a regen:DIR corpus;
    default: beside `store`), until at least `tokens` reply tokens exist; greedy unless
    `temperature` > 0. The parameters are `GenerateRequest`'s fields."""
    logger = get_run_logger()
    request = checked(GenerateRequest(model, source, out, tokens, max_new_tokens, max_prompt_tokens, turns,
                                      temperature, seed, batch_size, shard_size, device, dtype, overwrite, store))
    out, key = request.out, resolve(model).key
    with writer_lock(out, key, WHOLE, activity="generation"):
        loaded = load_model.load(model, device, dtype)
        if warning := emulated_bfloat16_warning(dtype, loaded.device):
            logger.warning(warning)
        check_chat_template(loaded.tokenizer, model)
        conversations = load_corpus(source)
        compute_dtype = str(loaded.model.dtype).removeprefix("torch.")
        manifest = prepare(request, {**loaded.provenance, "compute_dtype": compute_dtype}, conversations)
        if manifest["complete"]:
            logger.info("corpus %s is complete: %d reply tokens in %d shards", out, manifest["tokens"],
                        manifest["shards"])
            return generation_summary(out, manifest, 0, 0.0)
        stats = [shard_stats(path) for path in committed_shards(location(out))]
        spent, shard = sum(s["tokens"] for s in stats), len(stats)
        logger.info("%s answers %s into %s: %d of at least %d reply tokens already generated (%d shards)",
                    key, source, out, spent, tokens, shard)
        artifact = create_progress_artifact(progress=min(100.0, 100.0 * spent / tokens),
                                            description=f"layerwave generate {key} → {out}")
        meter = GenerationMeter(logger, spent, tokens)
        while spent < tokens and shard * shard_size < len(conversations):
            meter.shard = shard
            records = shard_records(len(conversations), request, shard)
            stats.append(generate_shard_task(request, shard, {r: conversations[r] for r in records},
                                             progress=meter.add, beat=meter.beat))
            spent, shard = spent + stats[-1]["tokens"], shard + 1
            update_progress_artifact(artifact, progress=min(100.0, 100.0 * spent / tokens))
        if spent < tokens:
            logger.warning("the corpus ran out after %d reply tokens (asked for %d)", spent, tokens)
        manifest = finish(location(out), manifest, stats)
    logger.info("corpus %s complete: %d replies, %d reply tokens; use --corpus regen:%s", out, manifest["replies"],
                spent, out)
    return generation_summary(out, manifest, meter.generated, meter.elapsed())
