"""Extraction speed and store size, measured against baselines in the same run.

    python benchmarks/extract.py [--model smollm2-135m] [--tokens 8192] [--out benchmarks/out/extract.json]

1. tokens/s of the extraction flow's shard phase vs a bare HF forward with
   output_hidden_states over exactly the same batches (goal >= 0.9x);
2. bytes per token on disk vs raw float16 of all N+1 layers;
3. writing the same hidden states as the store does (sharded Zarr) vs a per-sample
   torch.save dump (what SpecForge/speculators write offline): seconds and bytes;
4. the same extraction with the model in bfloat16 (`--dtype bfloat16`), and as a training store
   of the EAGLE-3 default layers (`--layers`): tokens/s and hidden-state bytes per token.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import zarr

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.extract import extract  # noqa: E402
from store import schema  # noqa: E402
from store import paths
from store.layout import Layout  # noqa: E402
from tasks.data import load_model  # noqa: E402
from tasks.extract.forward import batches, padded_batch  # noqa: E402
from tasks.extract.plan import documents_in  # noqa: E402
from tasks.select.layer_ids import eagle3_default  # noqa: E402


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bare_forward_seconds(loaded, token_id: np.ndarray, doc: np.ndarray, layout: Layout, batch_tokens: int) -> float:
    """The baseline: the same padded batches through model(..., output_hidden_states=True), nothing else."""
    elapsed = 0.0
    for shard in range(layout.n_shards):
        start, stop = layout.shard_range(shard)
        for group in batches(documents_in(doc[start:stop]), batch_tokens):
            ids, mask = padded_batch(token_id[start:stop], group)
            began = time.perf_counter()
            with torch.inference_mode():
                loaded.model(input_ids=ids.to(loaded.device), attention_mask=mask.to(loaded.device),
                             output_hidden_states=True)
            elapsed += time.perf_counter() - began
    return elapsed


def write_comparison(group: zarr.Group, layout: Layout, workdir: Path) -> dict:
    """Write the stored hidden states again, as the store does and as per-sample torch.save files."""
    hidden = group[schema.HIDDEN_STATES]
    doc = group[schema.DOC][:]
    zarr_copy = zarr.open_group(workdir / "copy.zarr", mode="w", zarr_format=3)
    target = zarr_copy.create_array("h", shape=hidden.shape, chunks=hidden.chunks, shards=hidden.shards,
                                    dtype=hidden.dtype, filters=hidden.filters, compressors=hidden.compressors,
                                    fill_value=0)
    dump = workdir / "torch-save"
    dump.mkdir()
    zarr_seconds = torch_seconds = 0.0
    for shard in range(layout.n_shards):
        start, stop = layout.shard_range(shard)
        block = hidden[:, start:stop, :]
        began = time.perf_counter()
        target[:, start:stop, :] = block
        zarr_seconds += time.perf_counter() - began
        tensor = torch.from_numpy(block)
        if layout.storage_dtype == "bfloat16":  # torch.save keeps 2 bytes per value too
            tensor = tensor.to(torch.bfloat16)
        for a, b in documents_in(doc[start:stop]):
            began = time.perf_counter()
            torch.save({"hidden_states": tensor[:, a:b].transpose(0, 1).clone()}, dump / f"{start + a:09d}.pt")
            torch_seconds += time.perf_counter() - began
    return {"zarr_seconds": zarr_seconds, "zarr_bytes": directory_bytes(workdir / "copy.zarr"),
            "torch_save_seconds": torch_seconds, "torch_save_bytes": directory_bytes(dump)}


def variants(args, workdir: Path, n_layers: int) -> list[dict]:
    """Extraction in float32 and bfloat16 compute, all layers and a training store, one after another."""
    rows = []
    for dtype, layers in (("float32", None), ("bfloat16", None), ("bfloat16", eagle3_default(n_layers))):
        store = workdir / f"{dtype}-{'all' if layers is None else 'training'}.zarr"
        summary = extract(model=args.model, corpus=args.corpus, tokens=args.tokens, store=str(store), dtype=dtype,
                          layers=layers)
        hidden = directory_bytes(store / summary["model_key"] / paths.ACTIVATIONS / schema.HIDDEN_STATES)
        rows.append({"dtype": dtype, "layers": layers or "all", "tokens_per_s": summary["n_tokens"] / summary["seconds"],
                     "hidden_bytes_per_token": hidden / summary["n_tokens"]})
        print(f"compute {dtype}, layers {rows[-1]['layers']}: {rows[-1]['tokens_per_s']:.0f} tok/s, "
              f"{rows[-1]['hidden_bytes_per_token']:.0f} B/token of hidden states", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="sharegpt")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--out", default="benchmarks/out/extract.json")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="layerwave-bench-"))
    store = workdir / "bench.zarr"
    try:
        loaded = load_model.load(args.model, "auto", "auto")
        summary = extract(model=args.model, corpus=args.corpus, tokens=args.tokens, store=str(store))
        group = zarr.open_group(store, path=paths.activations(summary["model_key"]), mode="r")
        layout = Layout(**group.attrs["layout"])
        batch_tokens = group.attrs["extraction"]["batch_tokens"]
        token_id, doc = group[schema.TOKEN_ID][:], group[schema.DOC][:]
        bare_forward_seconds(loaded, token_id[:64], doc[:64], Layout(**{**layout.as_attrs(), "n_tokens": 64}),
                             batch_tokens)  # warm-up
        bare = bare_forward_seconds(loaded, token_id, doc, layout, batch_tokens)
        hidden_bytes = directory_bytes(store / summary["model_key"] / paths.ACTIVATIONS / schema.HIDDEN_STATES)
        store_bytes = directory_bytes(store)
        raw_fp16_per_token = layout.n_layers * layout.hidden_size * 2
        writes = write_comparison(group, layout, workdir)
        by_dtype = variants(args, workdir, layout.n_layers - 1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    n = summary["n_tokens"]
    result = {
        "model": args.model, "corpus": args.corpus, "tokens": n, "layers": layout.n_layers,
        "hidden_size": layout.hidden_size, "storage_dtype": layout.storage_dtype, "device": str(loaded.device),
        "torch_threads": torch.get_num_threads(), "batch_tokens": batch_tokens,
        "extract_tokens_per_s": n / summary["seconds"], "bare_forward_tokens_per_s": n / bare,
        "extract_vs_bare_forward": (n / summary["seconds"]) / (n / bare),
        "hidden_bytes_per_token": hidden_bytes / n, "store_bytes_per_token": store_bytes / n,
        "raw_fp16_bytes_per_token": raw_fp16_per_token,
        "hidden_vs_raw_fp16": hidden_bytes / n / raw_fp16_per_token,
        **writes,
        "zarr_write_mb_per_s": writes["zarr_bytes"] / 2**20 / writes["zarr_seconds"],
        "torch_save_write_mb_per_s": writes["torch_save_bytes"] / 2**20 / writes["torch_save_seconds"],
        "zarr_vs_torch_save_seconds": writes["zarr_seconds"] / writes["torch_save_seconds"],
        "zarr_vs_torch_save_bytes": writes["zarr_bytes"] / writes["torch_save_bytes"],
        "variants": by_dtype,
        "bfloat16_vs_float32_tokens_per_s": by_dtype[1]["tokens_per_s"] / by_dtype[0]["tokens_per_s"],
        "training_store_vs_all_layers_bytes": by_dtype[2]["hidden_bytes_per_token"] / by_dtype[1]["hidden_bytes_per_token"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"extraction {result['extract_tokens_per_s']:.0f} tok/s vs bare forward "
          f"{result['bare_forward_tokens_per_s']:.0f} tok/s -> {result['extract_vs_bare_forward']:.2f}x")
    print(f"hidden states on disk {result['hidden_bytes_per_token']:.0f} B/token vs raw fp16 "
          f"{raw_fp16_per_token} B/token -> {result['hidden_vs_raw_fp16']:.2f}x")
    print(f"write: zarr {writes['zarr_seconds']:.2f} s / {writes['zarr_bytes'] / 2**20:.1f} MiB vs torch.save "
          f"{writes['torch_save_seconds']:.2f} s / {writes['torch_save_bytes'] / 2**20:.1f} MiB -> "
          f"{result['zarr_vs_torch_save_seconds']:.2f}x time, {result['zarr_vs_torch_save_bytes']:.2f}x size")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
