"""The report's work: result rows read back from the heads on disk (and from the published
ledger for heads trained on an earlier machine), its own plots drawn, report.md and results.json
written (and published, with the ledger), and Prefect artifacts.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from upath import UPath

from store import paths
from store.access import open_dataset, open_existing
from store.artefacts import copy, write_json, write_text
from store.errors import LayerwaveError
from store.paths import Workspace
from store.read import open_activations
from tasks.data.regen_corpus import replies_summary
from tasks.pipeline_presets import REFERENCE_FILTER, pipeline_preset
from tasks.report.ledger import LEDGER, Ledger, head_slot, heads_on_disk
from tasks.report.plots import plot_cka, plot_entropy_vs_depth, plot_tau_by_set
from tasks.report.report import SCORES, correlations, markdown, mean_ci95, result_rows
from tasks.report.study import screening_rows, with_finalists
from tasks.select.select import analysis_filters, candidates_from

REFERENCE = REFERENCE_FILTER.key
SCREENED = "screening: τ_offline"


def check_reportable(store: str, model_key: str, preset: str) -> None:
    """A report of a preset no run trained heads for would replace the report of the run that did
    (one report per model beside a store) and, for a publishing preset, the published results."""
    p = pipeline_preset(preset)
    published = p.publish and (Path(p.publish) / model_key / LEDGER).is_file()
    if not (Workspace(store).heads(model_key, preset).exists() or published):
        raise LayerwaveError(f"no {preset} heads of {model_key} beside {store}; run `layerwave run --model "
                             f"{model_key} --store {store} --preset {preset}` first, or pass the preset that made them")


@task(name="write-report", cache_policy=NO_CACHE)
def report_task(store: str, model_key: str, preset: str, sets: list[list[int]] | None = None) -> dict:
    """`<store>.reports/<model>/report.md` and `results.json` from what is on disk; `sets` limits
    the report to the sets a pipeline run trained (default: every candidate with results)."""
    p = pipeline_preset(preset)
    group = paths.selection(model_key, REFERENCE)
    if open_existing(store, group) is None:
        raise LayerwaveError(f"no selection for {model_key} in {store}; run `layerwave run --model {model_key} "
                             f"--store {store} --preset {preset}` first")
    selection = open_dataset(store, group).load()
    every = candidates_from(selection)
    candidates = [c for c in every if sets is None or c.layers in sets]
    benches, training_store = list(p.benches), p.training_store(store)
    if training_store != store and open_existing(training_store, paths.activations(model_key)) is None:
        raise LayerwaveError(f"the training store {training_store} of the {preset} run is gone; `layerwave run --model "
                             f"{model_key} --store {store} --preset {preset}` extracts it again (and reuses the heads)")
    trained_on = open_activations(training_store, model_key)  # what the heads were trained from
    on_disk = heads_on_disk(store, model_key, preset, [c.layers for c in every], p.seeds, benches,
                            trained_on.attrs["plan_hash"])
    ledger = Ledger.published(p.publish, model_key)
    records = on_disk + earlier_records(ledger, trained_on.attrs["plan_hash"], on_disk, p.seeds)
    rows = result_rows(candidates, final_scores(records, benches), benches)
    screening = (with_finalists(every, screening_rows(every, screening_scores(records)), p.finalists)
                 if p.screen_epochs else [])
    screened = {tuple(r["layers"]): r["tau_offline_mean"] for r in screening}
    for row in rows:
        row["screening_tau_offline"] = screened.get(tuple(row["layers"]))
    correlation = correlations(rows, benches, SCORES + (("screening_tau_offline",) if screening else ()))
    folder = Workspace(store).reports(model_key)
    corpus = trained_on.attrs["corpus"]
    facts = {"model": model_key, "store": seen_from_the_run(store, store), "preset": preset,
             "training store": seen_from_the_run(training_store, store), "training corpus": seen_from_the_run(corpus["spec"], store), "training tokens": corpus["tokens"], "documents": corpus["documents"],
             "target replies": replies_summary(beside_the_store(corpus["spec"], store)),
             "seeds": ", ".join(map(str, p.seeds)), "benchmarks": ", ".join(benches),
             "prompts per benchmark": p.prompts, "max new tokens": p.max_new_tokens, "draft depth": p.depth,
             "selection scored on token filter": REFERENCE,
             "evaluated (set, seed, bench)": f"{sum(len(r['seeds']) for r in rows)} of "
                                             f"{len(candidates) * len(p.seeds) * len(benches)}"}
    plots = report_plots(store, model_key, folder, rows, benches, f"{model_key} ({preset})", screening)
    text = markdown(f"layerwave report: {model_key} ({preset})", facts, plots, candidates, rows, correlation, benches,
                    screening, replayed=p.replay)
    write_text(folder / "report.md", text)
    write_json(folder / "results.json", {"rows": rows, "screening": screening, "rank_correlation": correlation})
    if p.publish:
        _publish(folder, [name for name, _ in plots], Path(p.publish) / model_key)
        ledger.write(on_disk)
    create_markdown_artifact(key=f"report-{_artifact_key(model_key)}", markdown=text,
                             description=f"layerwave report for {model_key}")
    if rows:
        create_table_artifact(key=f"results-{_artifact_key(model_key)}", table=[
            {k: r[k] for k in ("layers", "method", "bench", "tau_mean", "tau_ci95", "speedup_mean")} for r in rows])
    return {"path": str(folder / "report.md"), "rows": rows, "rank_correlation": correlation}


def earlier_records(ledger: Ledger, data_plan_hash: str, on_disk: list[dict], seeds) -> list[dict]:
    """The ledger's records of heads trained from these activations on an earlier machine and not
    found here."""
    here = {head_slot(r) for r in on_disk}
    return [r for r in ledger.current(data_plan_hash) if head_slot(r) not in here and r["seed"] in seeds]


def final_scores(records: list[dict], benches: list[str]) -> dict[tuple, list[dict]]:
    """The final heads' scores for every (set, bench), one per scored seed, in seed order."""
    found: dict[tuple, list[dict]] = {}
    for record in sorted(records, key=lambda r: r["seed"]):
        for bench in benches:
            if record["round"] == "final" and bench in record["scores"]:
                found.setdefault((tuple(record["layers"]), bench), []).append(
                    {**record["scores"][bench], "seed": record["seed"]})
    return found


def screening_scores(records: list[dict]) -> dict[tuple, dict[int, dict]]:
    """The screened heads' τ_offline by set and seed."""
    scores: dict[tuple, dict[int, dict]] = {}
    for record in records:
        if record["round"] == "screening":
            scores.setdefault(tuple(record["layers"]), {})[record["seed"]] = record["tau_offline"]
    return scores


def beside_the_store(spec: str, store: str) -> str:
    """A relative regen: spec that this folder cannot see, as the corpus of that name beside the store
    (where `layerwave run` writes it): a run from one folder, a report from another."""
    kind, _, path = spec.partition(":")
    if kind != "regen" or Path(path).is_absolute() or Path(path).exists():
        return spec
    return f"regen:{Workspace(store).beside('corpora') / Path(path).name}"


def seen_from_the_run(spec: str, store: str) -> str:
    """A path (or a corpus spec holding one) as the folder that holds the store sees it: a
    published report names no folder of the machine that ran it."""
    kind, colon, path = spec.partition(":") if spec.startswith(("regen:", "jsonl:")) else ("", "", spec)
    if not Path(path).is_absolute():
        return spec
    run = Path(store).absolute().parent
    seen = Path(path).relative_to(run) if Path(path).is_relative_to(run) else Path(path).name
    return f"{kind}{colon}{seen}"


def report_plots(store: str, model_key: str, folder: UPath, rows: list[dict], benches: list[str],
                 title: str, screening: list[dict]) -> list[tuple[str, str]]:
    """The report's own plots, in pipeline order, each drawn here from the store and the rows so
    that none shows other data (a manual `analyze` with another filter draws its own files):
    (file name, caption)."""
    filters = analysis_filters(store, model_key)
    analyses = {key: open_dataset(store, paths.analysis(model_key, key)).load() for key in filters}
    plots = [("entropy_vs_depth.png", "Matrix entropy of each layer's hidden states (nats; H1 solid, H2 dashed), "
                                      "one color per token filter: how much information each layer spreads; red "
                                      "dotted lines mark the EAGLE-3 default's layers."),
             (f"cka_{REFERENCE}.png", f"CKA between every pair of layers on {REFERENCE}, the token filter selection "
                                      "scored sets on (left: CKA, right: debiased CKA; bright = redundant layers; "
                                      "red squares: the EAGLE-3 default's layer pairs).")]
    plot_entropy_vs_depth(analyses, f"{title}: entropy vs depth", path=folder / plots[0][0])
    plot_cka(analyses[REFERENCE], f"{title}: layer similarity", path=folder / plots[1][0])
    if screening:
        plot_tau_by_set([screened_row(row) for row in screening], [SCREENED], f"{title}: screening",
                        path=folder / "screening.png")
        plots.append(("screening.png", "τ_offline of each screened layer set after the short budget: one dot per "
                                       "seed, the mean with its 95% interval over seeds as a bar; red is the EAGLE-3 "
                                       "default."))
    if rows:
        plot_tau_by_set(rows, benches, title, path=folder / "tau_by_set.png")
        plots.append(("tau_by_set.png", "τ of each trained layer set per benchmark: one dot per seed, the mean with "
                                        "its 95% interval over seeds as a bar; red is the EAGLE-3 default."))
    return plots


def screened_row(row: dict) -> dict:
    """A screening row in the shape of a result row, for the τ-by-set plot."""
    return {"layers": row["layers"], "method": row["method"], "bench": SCREENED, "tau_mean": row["tau_offline_mean"],
            "tau_ci95": mean_ci95(row["tau_offline_per_seed"])[1], "tau_per_seed": row["tau_offline_per_seed"]}


def _publish(folder: UPath, plots: list[str], target: Path) -> None:
    """The small files of a report (Markdown, its plots, result rows), for committing beside the code."""
    for name in ["report.md", "results.json", *plots]:
        copy(folder / name, target / name)


def _artifact_key(model_key: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() else "-" for ch in model_key.lower())
