"""Statistics pass: speed against this machine's float32 product peak, memory against the data
size, and subset scoring time, all measured in the same run.

    python benchmarks/stats.py [--tokens 8192] [--out benchmarks/out/stats.json]

1. cross-block accumulation throughput (the pass's core) vs a bare `X.T @ X` (numpy SYRK) and
   `X.T @ Y` (GEMM) of the same shape: GFLOP/s and ratio (goal >= 50% of peak);
2. peak RSS of the whole pass on synthetic stores of growing token counts, several times larger
   than the memory the pass is allowed (goal: flat, independent of tokens);
3. time to score all 3-layer subsets of a 31-layer model with the closed form (goal < 1 s).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from store.synthetic import write_synthetic
from tasks.stats.measures import h2_all_subsets, linear_cka
from tasks.stats.moments import TileMoments, accumulate
from tasks.stats.stats_pass import PassConfig, accumulate_statistics

LAYERS, D = 31, 576  # SmolLM2-135M


def best_seconds(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def accumulation_speed(tokens: int) -> dict:
    rng = np.random.default_rng(0)
    chunk = rng.standard_normal((LAYERS, tokens, D), dtype=np.float32)
    flat = np.ascontiguousarray(chunk.transpose(1, 0, 2)).reshape(tokens, LAYERS * D)
    half = flat[:, : flat.shape[1] // 2]
    flops_full = 2.0 * flat.shape[1] ** 2 * tokens
    syrk = best_seconds(lambda: flat.T @ flat)
    gemm = best_seconds(lambda: half.T @ np.ascontiguousarray(flat[:, flat.shape[1] // 2:]))
    flops_gemm = 2.0 * half.shape[1] * (flat.shape[1] - half.shape[1]) * tokens
    moments = TileMoments.zeros(LAYERS, LAYERS, D)
    ours = best_seconds(lambda: accumulate(moments, chunk, None))
    return {"tokens_per_chunk": tokens, "syrk_seconds": syrk, "gemm_gflops": flops_gemm / gemm / 1e9,
            "syrk_gflops_full_equivalent": flops_full / syrk / 1e9, "accumulate_seconds": ours,
            "accumulate_gflops_full_equivalent": flops_full / ours / 1e9, "accumulate_vs_syrk": syrk / ours}


def rss_child(store: str, memory_mb: int) -> None:
    """Run one pass and print peak RSS (MiB) as the last line."""
    tokens = int(json.loads(Path(store, "planted", "activations", "zarr.json").read_text())
                 ["attributes"]["layout"]["n_tokens"])
    accumulate_statistics(store, "planted", {"all": np.ones(tokens, dtype=bool)},
                          PassConfig(memory_bytes=memory_mb << 20, partitions=2), {"plan_hash": store},
                          {"scheduler": "threads", "num_workers": 2})
    print(peak_rss_mib())


def peak_rss_mib() -> float:
    """VmHWM: unlike ru_maxrss it starts afresh at exec, so a child does not report its parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_growth(sizes: list[int], memory_mb: int, workdir: Path) -> list[dict]:
    rows = []
    for tokens in sizes:
        store = str(workdir / f"rss-{tokens}.zarr")
        write_synthetic(store, "planted", n_layers=LAYERS, hidden_size=D, n_tokens=tokens,
                        shard_values=lambda a, b: np.random.default_rng(a).standard_normal((LAYERS, b - a, D),
                                                                                           dtype=np.float32),
                        tokens_per_chunk=512, chunks_per_shard=4, storage_dtype="float16")
        began = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--rss-child", store, str(memory_mb)],
                             check=True, capture_output=True, text=True).stdout.split()
        rows.append({"tokens": tokens, "activations_mib": LAYERS * D * 2 * tokens / 2**20,
                     "float32_in_memory_mib": LAYERS * D * 4 * tokens / 2**20, "peak_rss_mib": float(out[-1]),
                     "seconds": time.perf_counter() - began})
    return rows


def subset_scoring() -> dict:
    rng = np.random.default_rng(0)
    features = rng.standard_normal((LAYERS, 64))
    cka = linear_cka((features @ features.T) ** 2)
    h2 = rng.uniform(2, 5, LAYERS)
    began = time.perf_counter()
    subsets, scores = h2_all_subsets(cka, h2, range(LAYERS), 3)
    return {"subsets": len(subsets), "seconds": time.perf_counter() - began, "best": subsets[np.argmax(scores)].tolist()}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--rss-child":
        rss_child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per accumulated chunk")
    parser.add_argument("--rss-tokens", default="8192,32768,65536")
    parser.add_argument("--memory-mb", type=int, default=1024, help="memory the pass may use")
    parser.add_argument("--out", default="benchmarks/out/stats.json")
    args = parser.parse_args()
    speed = accumulation_speed(args.tokens)
    print(f"accumulate {speed['accumulate_gflops_full_equivalent']:.1f} GFLOP/s vs bare X.T@X "
          f"{speed['syrk_gflops_full_equivalent']:.1f} GFLOP/s (GEMM {speed['gemm_gflops']:.1f}) -> "
          f"{speed['accumulate_vs_syrk']:.2f}x")
    with tempfile.TemporaryDirectory(prefix="layerwave-stats-bench-") as workdir:
        rss = rss_growth([int(t) for t in args.rss_tokens.split(",")], args.memory_mb, Path(workdir))
    for row in rss:
        print(f"{row['tokens']:6d} tokens: activations {row['activations_mib']:.0f} MiB (float32 "
              f"{row['float32_in_memory_mib']:.0f} MiB), pass peak RSS {row['peak_rss_mib']:.0f} MiB, "
              f"{row['seconds']:.1f} s")
    scoring = subset_scoring()
    print(f"scored all {scoring['subsets']} 3-layer subsets of {LAYERS} layers in {scoring['seconds'] * 1e3:.1f} ms")
    result = {"layers": LAYERS, "hidden_size": D, "memory_budget_mib": args.memory_mb, "accumulation": speed,
              "rss": rss, "subset_scoring": scoring}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
