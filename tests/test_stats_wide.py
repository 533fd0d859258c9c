"""Wide models and clusters: bounded memory by layer tiling, sketching where exact blocks cannot be
stored, and the same pass on a real Dask cluster."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from distributed import LocalCluster

from flows.analyze import analyze
from store.synthetic import write_synthetic
from tasks.stats.analysis import layer_measures
from tasks.stats.measures import linear_cka, renyi_entropy, spectrum
from tasks.stats.stats_pass import PassConfig, accumulate_statistics, effective_dim, layer_groups

WIDE_LAYERS, WIDE_D, WIDE_TOKENS, RANK = 33, 4096, 384, 24


def wide_values(start: int, stop: int) -> np.ndarray:
    """Layers mixing a shared low-rank signal with layer-specific parts, deterministic per token."""
    rng = np.random.default_rng(7)
    basis = rng.standard_normal((RANK, WIDE_D)).astype(np.float32)
    drift = np.cos(np.arange(WIDE_LAYERS)[:, None] / 6.0 + np.arange(RANK)).astype(np.float32)
    out = np.empty((WIDE_LAYERS, stop - start, WIDE_D), dtype=np.float32)
    for token in range(start, stop):
        token_rng = np.random.default_rng(token)
        signal = token_rng.standard_normal(RANK).astype(np.float32)
        out[:, token - start] = (signal * drift) @ basis + 0.3 * token_rng.standard_normal((WIDE_LAYERS, WIDE_D))
    return out


def test_exact_blocks_of_a_33x4096_model_would_not_fit_so_they_are_sketched():
    assert effective_dim(33, 4096, None) == 512  # exact: 561 blocks of 4096² float64 = 75 GB
    assert effective_dim(31, 576, None) == 576  # SmolLM2-135M stays exact (1.3 GB)
    groups = layer_groups(33, 512, 2, PassConfig(memory_bytes=1 << 30, partitions=2))
    assert 1 < len(groups) < 33 and sum(len(g) for g in groups) == 33


def test_wide_store_sketched_with_bounded_memory_and_measured_error(tmp_path):
    store = str(tmp_path / "wide.zarr")
    write_synthetic(store, "wide", n_layers=WIDE_LAYERS, hidden_size=WIDE_D, n_tokens=WIDE_TOKENS,
                    shard_values=wide_values, tokens_per_chunk=64, chunks_per_shard=2, storage_dtype="float16")
    budget = 64 << 20
    config = PassConfig(memory_bytes=budget, partitions=2, sketch_dim=128)
    tracemalloc.start()
    summary = accumulate_statistics(store, "wide", {"all": np.ones(WIDE_TOKENS, dtype=bool)}, config,
                                    {"plan_hash": "wide"}, {"scheduler": "threads", "num_workers": 2})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert summary["sketched"] and summary["features"] == 128 and summary["layer_groups"] > 1
    shard_bytes = WIDE_LAYERS * 128 * WIDE_D * 4  # one decoded float32 shard of every layer
    assert peak < budget + 3 * shard_bytes, f"peak {peak / 2**20:.0f} MiB"

    measures = layer_measures(store, "wide", "all")
    exact = wide_values(0, WIDE_TOKENS).astype(np.float64)
    exact -= exact.mean(axis=1, keepdims=True)
    grams = exact @ exact.transpose(0, 2, 1)  # few tokens: the Gram form is exact and small
    frob = np.einsum("lts,mts->lm", grams, grams)
    cka_error = np.abs(measures.cka.values - linear_cka(frob)).max()
    h1_exact = np.array([renyi_entropy(spectrum(g, WIDE_D), 1) for g in grams])
    h1_error = np.abs(measures.entropy_h1.values - h1_exact).max()
    # Measured on this data (README): k=128 → CKA max error 0.064, H1 0.11 nats; k=512 (the
    # automatic choice for 33 × 4096) → 0.019 and 0.026. Error shrinks about as 1/√k.
    assert cka_error < 0.08, cka_error
    assert h1_error < 0.15, h1_error


def test_the_pass_runs_on_an_existing_dask_cluster(tmp_path):
    values = np.random.default_rng(3).standard_normal((4, 512, 16)).astype(np.float32)
    stores = [str(tmp_path / "local.zarr"), str(tmp_path / "cluster.zarr")]
    for store in stores:
        write_synthetic(store, "small", n_layers=4, hidden_size=16, n_tokens=512,
                        shard_values=lambda a, b: values[:, a:b], tokens_per_chunk=32, chunks_per_shard=2)
    local = analyze(model="small", store=stores[0])
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1")
        clustered = analyze(model="small", store=stores[1], dask_address=cluster.scheduler_address)
    assert clustered["entropy_h1"] == pytest.approx(local["entropy_h1"], rel=1e-9)
    assert np.allclose(clustered["cka_debiased"], local["cka_debiased"], rtol=1e-9)
