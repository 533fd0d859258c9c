"""Heads side by side on a local Dask cluster against one after another, same heads.

    python benchmarks/heads_cluster.py [--workers 2 | --dask-address tcp://HOST:8786] [--epochs 40]
                                       [--out benchmarks/out/heads_cluster.json]

Runs the tiny model's smoke study once to build its stores (untimed), then times its head rounds
(screening and finals; every other stage is current and skipped) three times from no heads: in
process, one head after another with every core (the baseline, what a run without a cluster
does); in process with each head at the cluster's share of the cores (the same threads per head);
and on a local Dask cluster of `--workers` processes (or on the cluster at `--dask-address`, its
workers started with one thread each). `--epochs` lengthens every head so the
rounds are bound by training rather than by the cluster's start-up. Prints the times and their
ratios, checks the cluster's heads are the same files as the equal-threads run's, and writes the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.pipeline import pipeline  # noqa: E402
from store.paths import Workspace  # noqa: E402
from tasks.pipeline_presets import PIPELINE_PRESETS  # noqa: E402

PRESET = "smoke-study"


def heads(store: str) -> dict[str, str]:
    folder = Workspace(store).beside("heads")
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("model.safetensors"))}


def timed_rounds(store: str, **cluster) -> float:
    shutil.rmtree(Workspace(store).beside("heads"), ignore_errors=True)
    started = time.perf_counter()
    pipeline(model="tiny-random-llama", preset=PRESET, store=store, **cluster)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dask-address", help="an existing cluster of --workers workers instead of a local one")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", default="benchmarks/out/heads_cluster.json")
    args = parser.parse_args()
    PIPELINE_PRESETS[PRESET] = dataclasses.replace(PIPELINE_PRESETS[PRESET], epochs=args.epochs,
                                                   screen_epochs=args.epochs // 2)
    store = str(Path(tempfile.mkdtemp(prefix="layerwave-bench-heads-")) / "study.zarr")
    pipeline(model="tiny-random-llama", preset=PRESET, store=store)  # the stores; heads are removed below
    cores, share = torch.get_num_threads(), max(1, (os.cpu_count() or 1) // args.workers)
    alone = timed_rounds(store)
    torch.set_num_threads(share)
    alone_at_share = timed_rounds(store)
    torch.set_num_threads(cores)
    share_heads = heads(store)
    cluster = {"dask_address": args.dask_address} if args.dask_address else {"workers": args.workers}
    clustered = timed_rounds(store, **cluster)
    result = {"preset": PRESET, "epochs": args.epochs, "screen_epochs": args.epochs // 2, "heads": len(share_heads),
              "workers": args.workers, "cluster": args.dask_address or "local", "threads_in_process": cores, "threads_per_head_on_cluster": share,
              "in_process_s": round(alone, 2), "in_process_at_share_s": round(alone_at_share, 2),
              "cluster_s": round(clustered, 2), "speedup": round(alone / clustered, 3),
              "speedup_at_equal_threads": round(alone_at_share / clustered, 3),
              "same_heads_at_equal_threads": heads(store) == share_heads}
    where = f"Dask workers at {args.dask_address}" if args.dask_address else "local Dask workers"
    print(f"{len(share_heads)} heads: in process {alone:.1f} s ({cores} threads), {alone_at_share:.1f} s ({share} "
          f"per head); {args.workers} {where} {clustered:.1f} s: {alone / clustered:.2f}x, "
          f"{alone_at_share / clustered:.2f}x at equal threads; same heads: {result['same_heads_at_equal_threads']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
