"""`layerwave extract`'s request: its options, declared once, and the check that needs no model
or forward pass, so bad input fails before any write.

Kept free of torch and Prefect at import, so building the command line stays fast; the check
imports what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import LayerwaveError
from store.lock import WHOLE
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import option
from tasks.select.layer_ids import parse_stored_layers


@dataclass(frozen=True)
class ExtractRequest:
    """Every layer's hidden states of a model over a corpus, into the store."""

    model: str = option(DEFAULT_MODEL, "registry id (see `layerwave models`) or hf:PATH")
    corpus: str = option("sharegpt", "sharegpt, mt-bench, jsonl:PATH or regen:DIR (a corpus `layerwave generate` "
                         "wrote)")
    tokens: int = option(20000, "token budget (documents are picked by --seed)")
    store: str = option(DEFAULT_STORE, "Zarr store directory (or fsspec URL)")
    max_length: int = option(2048, "truncate documents to this many tokens")
    seed: int = option(0, "order in which documents are picked")
    device: str = option("auto", "auto (CUDA when present), cpu or cuda[:N]")
    dtype: str = option("auto", "compute dtype: auto (the checkpoint's), float32, float16, bfloat16")
    storage_dtype: str = option("auto", "auto (lossless for 16-bit models, else float16 when in range), float16, "
                                "bfloat16, float32")
    layers: list[int] | None = option(None, "HF hidden-state indices to store, e.g. 2,15,27: a training store of "
                                      "the layers heads read; all (the default) keeps every one, as analysis "
                                      "needs", type=parse_stored_layers)
    topk: int = option(20, "target top-k next-token labels kept per token")
    tokens_per_chunk: int | None = option(None, "default: ~1 MiB chunks")
    chunks_per_shard: int | None = option(None, "default: ~128 MiB shards")
    batch_tokens: int | None = option(None, "tokens per forward pass (default: adapts to the device)")
    overwrite: bool = option(False, "replace this model's activations made with other settings")
    workers: int = option(1, "shards extracted concurrently")
    part: str | None = option(None, "i/n: write only the i-th of n interleaved shard subsets, so n machines or "
                              "deployment runs fill one store together (the last part to finish finalizes)")

    @property
    def model_key(self) -> str:
        from tasks.data.registry import resolve

        return resolve(self.model).key

    def check(self) -> Extraction:
        """Every check that needs no model or forward pass, so bad input fails before any write."""
        from store.access import check_schema
        from store.dtypes import choose_storage_dtype
        from store.lock import refuse_if_busy
        from tasks.data.corpus import load_corpus
        from tasks.data.regen_corpus import generator_key
        from tasks.data.registry import resolve
        from tasks.select.layer_ids import check_layers

        for name in ("tokens", "topk", "workers", "tokens_per_chunk", "chunks_per_shard", "batch_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise LayerwaveError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")
        part = parse_part(self.part)
        spec = resolve(self.model)
        check_schema(self.store)
        from tasks.data import load_model  # only now (transformers, ~5 s): an unknown model is refused before

        load_model.pick_device(self.device)
        load_model.pick_dtype(self.dtype)
        choose_storage_dtype(self.storage_dtype, load_model.DTYPES["float32"], 0.0)
        refuse_if_busy(self.store, spec.key, part)
        if self.layers is not None:
            check_layers(self.layers, load_model.num_hidden_layers(self.model) + 1, f"model {spec.key}")
            if list(self.layers) != sorted(self.layers):
                raise LayerwaveError(f"--layers {','.join(map(str, self.layers))}: give them in increasing order, "
                                     f"e.g. {','.join(map(str, sorted(self.layers)))} (the order heads read them in)")
        load_corpus(self.corpus)
        generator = generator_key(self.corpus)
        if generator is not None and generator != spec.key:
            raise LayerwaveError(f"corpus {self.corpus} holds {generator}'s own replies and tokens; extract it "
                                 f"with --model {generator}, or generate one with --model {self.model}")
        return Extraction(self, spec.key, part)


@dataclass(frozen=True)
class Extraction:
    """A checked `ExtractRequest`."""

    request: ExtractRequest
    model_key: str
    part: tuple[int, int]  # (index, count), WHOLE for every shard


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
