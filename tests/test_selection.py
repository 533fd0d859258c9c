"""Layer-set selection on planted structure, baselines for real depths, constraints, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flows.analyze import analyze
from flows.cli import main
from flows.selection import select
from store.errors import LayerwaveError
from store.synthetic import write_synthetic
from tasks.select.layer_ids import eagle3_default
from tasks.select.selection import Constraints, even, last_k, random_sets

TOKENS, D = 800, 16
DUPLICATES = [(1, 2), (4, 5)]
LOW_RANK = [3, 7]


def planted_layers() -> np.ndarray:
    """10 entries (N = 9): 1≡2 and 4≡5 duplicated, 3 and 7 rank-2, 0, 6, 8 independent full-rank."""
    rng = np.random.default_rng(11)
    full = lambda: rng.standard_normal((TOKENS, D)) @ np.diag(np.linspace(2, 1, D))  # noqa: E731
    rank2 = lambda: rng.standard_normal((TOKENS, 2)) @ rng.standard_normal((2, D))  # noqa: E731
    a, b = full(), full()
    layers = [full(), a, a.copy(), rank2(), b, b.copy(), full(), rank2(), full(), full()]
    return np.stack(layers).astype(np.float32)


@pytest.fixture(scope="module")
def planted_store(tmp_path_factory, prefect_api) -> str:
    store = str(tmp_path_factory.mktemp("select") / "planted.zarr")
    values = planted_layers()
    write_synthetic(store, "planted", n_layers=len(values), hidden_size=D, n_tokens=TOKENS,
                    shard_values=lambda a, b: values[:, a:b], tokens_per_chunk=32, chunks_per_shard=4)
    analyze(model="planted", store=store)
    analyze(model="planted", store=store, entropy_threshold=2.0)
    return store


def by_method(candidates) -> dict[str, list[int]]:
    return {method: c.layers for c in candidates for method in c.methods}


def test_methods_pick_what_the_planted_structure_calls_for(planted_store):
    candidates = select(model="planted", store=planted_store, k=3)
    chosen = by_method(candidates)
    for method in ("cka-mrmr", "cka-logdet", "aggregate-entropy"):
        layers = chosen[method]
        assert not any(set(pair) <= set(layers) for pair in DUPLICATES), (method, layers)
        assert not set(LOW_RANK) & set(layers), (method, layers)
    assert set(chosen["entropy-topk"]) <= {1, 2, 4, 5, 6, 8}  # informative, redundancy ignored
    informative = [c for c in candidates if not set(LOW_RANK) & set(c.layers)
                   and not any(set(p) <= set(c.layers) for p in DUPLICATES)]
    assert candidates[0].layers in [c.layers for c in informative]  # best aggregate entropy first
    assert "aggregate-entropy@entropy-ge-2" in chosen  # every method also runs on the filtered analysis
    for c in candidates:
        assert {"aggregate_h1", "aggregate_h2", "mean_entropy", "mean_pairwise_cka"} <= c.scores.keys()
        assert all(1 <= layer <= 8 for layer in c.layers) and len(c.layers) == 3
    assert len({tuple(c.layers) for c in candidates}) == len(candidates)  # duplicates merged


def test_duplicated_sets_keep_every_method_name(planted_store):
    candidates = select(model="planted", store=planted_store, k=3, methods=["cka-mrmr", "cka-logdet"])
    names = [m for c in candidates for m in c.methods]
    assert len(names) == len(set(names)) and {"cka-mrmr", "cka-logdet", "even", "last-k", "eagle3-default"} <= set(names)


@pytest.mark.parametrize("n, expected", [(8, [2, 4, 5]), (24, [2, 12, 21]), (30, [2, 15, 27]), (32, [2, 16, 29])])
def test_baselines_for_real_depths(n, expected):
    c = Constraints(k=3)
    assert eagle3_default(n) == expected
    spaced = even(c, n + 1)
    assert len(spaced) == 3 and spaced[0] == 1 and spaced[-1] == n - 1
    assert abs((spaced[1] - spaced[0]) - (spaced[2] - spaced[1])) <= 1
    assert last_k(c, n + 1) == [n - 3, n - 2, n - 1]
    assert last_k(Constraints(k=3, min_gap=2), n + 1) == [n - 5, n - 3, n - 1]
    first, again = random_sets(c, n + 1, seed=5, count=3), random_sets(c, n + 1, seed=5, count=3)
    assert first == again and first != random_sets(c, n + 1, seed=6, count=3)
    assert all(1 <= layer <= n - 1 for s in first for layer in s)


def test_constraints_are_respected(planted_store):
    for gap in (0, -1):  # 0 would repeat a layer, -1 list one backwards
        with pytest.raises(LayerwaveError, match=f"--min-gap must be at least 1 \\(got {gap}\\)"):
            Constraints(k=3, min_gap=gap).allowed(9)
    candidates = select(model="planted", store=planted_store, k=2, low=2, high=8, min_gap=3)
    for c in candidates:
        assert len(c.layers) == 2 and 2 <= min(c.layers) and max(c.layers) <= 8
        assert c.layers[1] - c.layers[0] >= 3, c
    wide = select(model="planted", store=planted_store, k=5)
    assert all(len(c.layers) == 5 for c in wide)


def test_select_cli_json_and_bad_input(planted_store, tmp_path, capsys):
    out = tmp_path / "sel.json"
    assert main(["select", "--model", "planted", "--store", planted_store, "--json", str(out), "--limit", "2"]) == 0
    payload = json.loads(out.read_text())
    assert len(payload["candidates"]) == 2 and {"methods", "layers", "aggregate_h1"} <= payload["candidates"][0].keys()

    def refused(argv, expected):
        capsys.readouterr()
        assert main(["select", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("layerwave: error: ") and expected in err, err
    refused(["--model", "planted", "--store", planted_store, "--k", "9"], "k=9 layers at least 1 apart do not fit")
    refused(["--model", "planted", "--store", planted_store, "--methods", "magic"], "unknown selection method")
    refused(["--model", "other", "--store", planted_store], "no analysis for other")
    refused(["--model", "planted", "--store", planted_store, "--filter", "quantile-ge-0.9"],
            "no analysis with token filter quantile-ge-0.9 for planted; it has ")
    with pytest.raises(LayerwaveError, match="run `layerwave analyze"):
        select(model="nothing", store=planted_store)
