"""Statistics oracles: the out-of-core pass equals in-memory numpy, and the measures obey their math."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from flows.analyze import analyze
from flows.cli import main
from store.errors import LayerwaveError
from store.synthetic import write_synthetic
from tasks.report.plots import plot_cka, plot_tau_by_set
from tasks.stats.analysis import layer_measures, set_entropy, set_h2_closed_form
from tasks.stats.measures import debiased_cka, h2_all_subsets, linear_cka, renyi_entropy, spectrum, tile_pairs
from tasks.stats.moments import TileMoments, accumulate
from tasks.stats.stats_pass import PassConfig, accumulate_statistics

D, LAYERS, TOKENS = 24, 5, 1000


def planted(seed: int = 0) -> np.ndarray:
    """(LAYERS, TOKENS, D): correlated layers with a large common offset (tests the shift), layer 3
    a rotated, scaled copy of layer 1, layer 4 low-rank."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((TOKENS, D)) @ np.diag(np.linspace(3, 0.2, D))
    layers = [base + 50, base + 0.7 * rng.standard_normal((TOKENS, D)) + 50, rng.standard_normal((TOKENS, D))]
    rotation, _ = np.linalg.qr(rng.standard_normal((D, D)))
    layers.append(3.0 * layers[1] @ rotation)
    layers.append(rng.standard_normal((TOKENS, 3)) @ rng.standard_normal((3, D)))
    return np.stack(layers).astype(np.float32)


def synthetic_store(tmp_path, values: np.ndarray, name: str = "planted") -> str:
    store = str(tmp_path / f"{name}.zarr")
    n_layers, n_tokens, d = values.shape
    entropy = np.random.default_rng(1).uniform(0, 5, n_tokens)
    write_synthetic(store, name, n_layers=n_layers, hidden_size=d, n_tokens=n_tokens,
                    shard_values=lambda a, b: values[:, a:b], entropy=entropy, doc_length=100,
                    tokens_per_chunk=32, chunks_per_shard=4)
    return store


def numpy_reference(values: np.ndarray):
    """Entropies and CKA computed directly in memory, in float64."""
    x = values.astype(np.float64)
    x = x - x.mean(axis=1, keepdims=True)
    covariances = np.einsum("ltd,mte->lmde", x, x)
    frob = np.einsum("lmde,lmde->lm", covariances, covariances)
    h1 = [renyi_entropy(spectrum(covariances[l, l], x.shape[1]), 1) for l in range(len(x))]
    h2 = [-np.log(frob[l, l] / np.trace(covariances[l, l]) ** 2) for l in range(len(x))]
    debiased = np.array([[kornblith_debiased_cka(x[l], x[m]) for m in range(len(x))] for l in range(len(x))])
    return np.array(h1), np.array(h2), linear_cka(frob), debiased, covariances


def kornblith_debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Debiased CKA the Gram way (U-centred Grams), independent of the feature-space formulas."""
    def u_center(gram):
        n = len(gram)
        gram = gram.copy()
        np.fill_diagonal(gram, 0)
        means = gram.sum(0) / (n - 2) - gram.sum() / (2 * (n - 1) * (n - 2))
        gram -= means[:, None] + means[None, :]
        np.fill_diagonal(gram, 0)
        return gram

    kx, ky = u_center(x @ x.T), u_center(y @ y.T)
    return float((kx * ky).sum() / np.sqrt((kx * kx).sum() * (ky * ky).sum()))


@pytest.mark.parametrize("memory_gb", [4.0, 1e-6])  # one tile, and one layer per group (many tiles)
def test_streaming_statistics_equal_in_memory_numpy(tmp_path, memory_gb):
    values = planted()
    store = synthetic_store(tmp_path, values)
    masks = {"all": np.ones(TOKENS, dtype=bool)}
    accumulate_statistics(store, "planted", masks, PassConfig(memory_bytes=int(memory_gb * 2**30), partitions=3),
                          {"plan_hash": "x"}, {"scheduler": "threads", "num_workers": 2})
    measures = layer_measures(store, "planted", "all", alphas=[0.5, 3.0])
    h1, h2, cka, dcka, covariances = numpy_reference(values)
    np.testing.assert_allclose(measures.entropy_h1, h1, rtol=1e-6)
    np.testing.assert_allclose(measures.entropy_h2, h2, rtol=1e-6)
    np.testing.assert_allclose(measures.cka, cka, rtol=1e-6)
    np.testing.assert_allclose(measures.cka_debiased, dcka, rtol=1e-6)
    for alpha, layers in ((3.0, range(LAYERS)), (0.5, range(LAYERS - 1))):
        # α < 1 weighs the tiny eigenvalues up, so on the rank-3 layer 4 it sees the float32
        # product noise floor (~1e-7 of λ_max); α ≥ 1 does not.
        expected = [renyi_entropy(spectrum(covariances[l, l], TOKENS), alpha) for l in layers]
        np.testing.assert_allclose(measures.entropy.sel(alpha=alpha)[list(layers)], expected, rtol=1e-6)
    subset = [0, 2, 4]
    weights = 1 / np.sqrt([np.trace(covariances[l, l]) for l in subset])
    joint = np.block([[weights[i] * weights[j] * covariances[l, m] for j, m in enumerate(subset)]
                      for i, l in enumerate(subset)])
    np.testing.assert_allclose(set_entropy(store, "planted", "all", subset), renyi_entropy(spectrum(joint, TOKENS), 1),
                               rtol=1e-6)


def test_classic_cka_example():
    np.random.seed(1337)
    x = np.random.randn(100, 10)
    y = np.random.randn(100, 10) + x
    moments = TileMoments.zeros(2, 2, 10)
    data = np.stack([x, y]).astype(np.float32)
    accumulate(moments, data[:, :37], None)
    accumulate(moments, data[:, 37:], None)
    frob, hsic = np.zeros((2, 2)), np.zeros((2, 2))
    for left, right, _, f, h in tile_pairs(moments, [0, 1], [0, 1], 10):
        frob[left, right], hsic[left, right] = f, h
    assert linear_cka(frob)[0, 1] == pytest.approx(0.55761, abs=1e-5)
    assert debiased_cka(hsic)[0, 1] == pytest.approx(0.51346, abs=1e-5)


def test_cka_is_one_for_itself_and_invariant_to_rotation_and_scale(tmp_path):
    store = synthetic_store(tmp_path, planted())
    analyze(model="planted", store=store)
    ds = xr.open_zarr(store, group="planted/analysis/all", consolidated=False)
    np.testing.assert_allclose(np.diag(ds.cka), 1, rtol=1e-9)
    np.testing.assert_allclose(np.diag(ds.cka_debiased), 1, rtol=1e-9)
    assert float(ds.cka[1, 3]) == pytest.approx(1, rel=1e-5)  # layer 3 = 3 · layer 1 · rotation
    assert float(ds.cka_debiased[1, 3]) == pytest.approx(1, rel=1e-5)
    assert float(ds.cka[0, 2]) < 0.1  # independent layers


def test_entropy_of_known_spectra():
    rng = np.random.default_rng(0)
    n, d = 20000, 32
    x = rng.standard_normal((n, d))
    x -= x.mean(0)
    h1 = renyi_entropy(spectrum(x.T @ x, n), 1)
    assert h1 == pytest.approx(np.log(d) - d / (2 * n), abs=2e-3)
    r = 5  # rank r with equal singular values: every H_alpha = ln r
    u, _ = np.linalg.qr(rng.standard_normal((200, r)))
    v, _ = np.linalg.qr(rng.standard_normal((d, r)))
    equal = u @ v.T
    for alpha in (0.5, 1, 2, 3, np.inf):
        assert renyi_entropy(spectrum(equal.T @ equal, 200), alpha) == pytest.approx(np.log(r), rel=1e-9)
    small = rng.standard_normal((20, d))  # Gram and covariance forms share the nonzero spectrum
    gram, covariance = spectrum(small @ small.T, d), spectrum(small.T @ small, 20)
    assert renyi_entropy(gram, 1) == pytest.approx(renyi_entropy(covariance, 1), rel=1e-9)


def test_set_entropy_duplicates_and_closed_form(tmp_path):
    values = planted()
    values = np.concatenate([values, values[1:2]])  # layer 5 duplicates layer 1
    store = synthetic_store(tmp_path, values, "dup")
    analyze(model="dup", store=store)
    ds = xr.open_zarr(store, group="dup/analysis/all", consolidated=False).load()
    alone = set_entropy(store, "dup", "all", [1])
    assert set_entropy(store, "dup", "all", [1, 5]) == pytest.approx(alone, rel=1e-6)
    assert set_entropy(store, "dup", "all", [1, 2]) > alone + 0.5  # an independent layer adds information
    subsets, scores = h2_all_subsets(ds.cka.values, ds.entropy_h2.values, range(6), 3)
    assert len(subsets) == 20
    for subset, score in zip(subsets, scores):
        assert score == pytest.approx(set_h2_closed_form(ds, subset), rel=1e-12)
    for subset in ([0, 1], [0, 2, 4], [1, 3, 5], [0, 1, 2, 3]):
        assert set_h2_closed_form(ds, subset) == pytest.approx(set_entropy(store, "dup", "all", subset, alpha=2),
                                                               rel=1e-6)


def test_filtered_statistics_equal_those_of_the_kept_tokens(tmp_path):
    values = planted()
    store = synthetic_store(tmp_path, values)
    result = analyze(model="planted", store=store, entropy_threshold=2.5, drop_first_token=True)
    ds = xr.open_zarr(store, group="planted/activations", consolidated=False)
    keep = (ds.entropy.values >= 2.5) & (ds.position.values != 0)
    assert result["filter"] == "entropy-ge-2.5-drop-first"
    assert result["tokens_kept"] == keep.sum() == result["tokens_kept_per_filter"]["entropy-ge-2.5-drop-first"]
    assert result["tokens_kept_per_filter"]["all-drop-first"] == (ds.position.values != 0).sum()
    h1, h2, cka, dcka, _ = numpy_reference(values[:, keep])
    np.testing.assert_allclose(result["entropy_h1"], h1, rtol=1e-6)
    np.testing.assert_allclose(result["cka_debiased"], dcka, rtol=1e-6)
    quantile = analyze(model="planted", store=store, entropy_quantile=0.75)
    assert quantile["tokens_kept"] == (ds.entropy.values >= np.quantile(ds.entropy.values, 0.75)).sum()


def test_a_massive_first_token_costs_debiased_cka_nothing_once_dropped(tmp_path):
    """Attention sinks: each document's first token carries activations ~10^4 times the rest. The
    statistics of the tokens kept stay those numpy computes on them alone."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((2, 2048, 16))
    first = np.arange(2048) % 256 == 0
    values[:, first, 0] = 5e4
    values = values.astype(np.float32)
    store = str(tmp_path / "sinks.zarr")
    write_synthetic(store, "sinks", n_layers=2, hidden_size=16, n_tokens=2048, shard_values=lambda a, b: values[:, a:b],
                    doc_length=256, tokens_per_chunk=32, chunks_per_shard=4)
    accumulate_statistics(store, "sinks", {"all-drop-first": ~first}, PassConfig(), {"plan_hash": "x"},
                          {"scheduler": "sync"})
    kept = [values[layer][~first].astype(np.float64) for layer in range(2)]
    expected = kornblith_debiased_cka(*(x - x.mean(axis=0) for x in kept))
    assert float(layer_measures(store, "sinks", "all-drop-first").cka_debiased[0, 1]) == pytest.approx(expected, abs=1e-4)


def test_a_constant_layer_has_no_entropy_and_a_set_holding_it_is_one_line(tmp_path):
    values = np.random.default_rng(1).standard_normal((3, 512, 8)).astype(np.float32)
    values[1] = 3.0
    store = synthetic_store(tmp_path, values)
    result = analyze(model="planted", store=store)
    assert np.isnan(result["entropy_h1"][1]) and np.isfinite(result["entropy_h1"][0])
    with pytest.raises(LayerwaveError, match=r"layers \[1\] do not vary over the kept tokens"):
        analyze(model="planted", store=store, sets=[[0, 1, 2]])


def test_analyze_cli_writes_json_and_plots_and_reuses_statistics(tmp_path, capsys):
    store = synthetic_store(tmp_path, planted())
    out = tmp_path / "a.json"
    assert main(["analyze", "--model", "planted", "--store", store, "--json", str(out), "--set", "0,1,2"]) == 0
    payload = json.loads(out.read_text())
    assert {"layers", "tokens_kept", "entropy_h1", "entropy_h2", "cka", "cka_debiased"} <= payload.keys()
    assert payload["layers"] == list(range(LAYERS)) and payload["tokens_kept"] == TOKENS
    assert [s["layers"] for s in payload["sets"]] == [[0, 1, 2]]  # N = 4 has no distinct EAGLE-3 default
    assert all(path.endswith(".png") for path in payload["plots"])
    printed = capsys.readouterr().out
    assert "H1" in printed and "set [0, 1, 2]" in printed
    assert main(["analyze", "--model", "planted", "--store", store, "--alpha", "3"]) == 0


def test_a_figure_is_drawn_again_only_when_what_it_shows_changed(tmp_path):
    rows = [{"layers": [0, 1, 2], "method": "eagle3-default", "bench": "mt-bench", "tau_mean": 1.2, "tau_ci95": 0.1,
             "tau_per_seed": [1.1, 1.3]}]
    path = tmp_path / "tau.png"
    plot_tau_by_set(rows, ["mt-bench"], "first", path=path)
    drawn = path.stat().st_mtime_ns, path.read_bytes()
    assert drawn[1].startswith(b"\x89PNG")
    plot_tau_by_set(rows, ["mt-bench"], "first", path=path)
    assert (path.stat().st_mtime_ns, path.read_bytes()) == drawn  # the same inputs: the file is kept
    plot_tau_by_set([{**rows[0], "tau_mean": 1.3}], ["mt-bench"], "first", path=path)
    assert path.read_bytes() != drawn[1]
    layers = xr.Dataset({name: (("layer", "other"), np.eye(3)) for name in ("cka", "cka_debiased")},
                        coords={"layer": [0, 1, 2], "other": [0, 1, 2]}, attrs={"filter": "all"})
    cka = tmp_path / "cka.png"
    plot_cka(layers, "a title", path=cka)
    before = cka.read_bytes()
    plot_cka(layers.assign(cka=layers.cka * 0.5), "a title", path=cka)  # the data changed: drawn again
    assert cka.read_bytes() != before


def test_analyze_bad_input(tmp_path, capsys, extracted):
    store, _ = extracted
    def refused(argv, expected):
        capsys.readouterr()
        assert main(["analyze", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err
    refused(["--model", "smollm2-135m", "--store", store], "no activations for smollm2-135m")
    refused(["--model", "tiny-random-llama", "--store", store, "--entropy-threshold", "99"],
            "keeps 0 of 1500 tokens; at least 4 are needed")
    refused(["--model", "tiny-random-llama", "--store", store, "--set", "2,40"],
            "layers [40] are not in the store (it has HF indices 0..8)")
    refused(["--model", "tiny-random-llama", "--store", store, "--entropy-threshold", "2", "--entropy-quantile", "0.5"],
            "give --entropy-threshold or --entropy-quantile, not both")
    for option, value, expected in (("--partitions", "0", "--partitions must be above 0 (got 0)"),
                                    ("--sketch-dim", "0", "--sketch-dim must be above 0"),
                                    ("--memory-gb", "-1", "--memory-gb must be above 0"),
                                    ("--alpha", "nan", "--alpha is a Rényi order, a finite number >= 0 (got nan)")):
        refused(["--model", "tiny-random-llama", "--store", store, option, value], expected)
    from tasks.stats.token_filter import TokenFilter
    assert TokenFilter(2.5).key == "entropy-ge-2.5" != TokenFilter(2.5000004).key  # no two filters share a name
    with pytest.raises(LayerwaveError, match="repeats a layer"):
        from tasks.select.layer_ids import check_layers
        check_layers([2, 2], 9)
