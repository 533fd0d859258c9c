"""`layerwave <stage>`: run the flows in-process on Prefect's ephemeral API (no server needed)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import traceback

from store.errors import LayerwaveError, is_user_error
from tasks.names import DEFAULT_MODEL, DEFAULT_STORE
from tasks.request import add_options, check_ahead, from_args, one_line, parameters


def _extract_parser(sub) -> None:
    from tasks.extract.request import ExtractRequest

    p = sub.add_parser("extract", help="write every layer's hidden states over a corpus into the Zarr store")
    add_options(p, ExtractRequest)
    p.add_argument("--json", help="also write the run summary to this JSON file")


def _run_extract(args) -> dict:
    from tasks.extract.request import ExtractRequest

    request = from_args(ExtractRequest, args)
    check_ahead(request)  # bad input fails here, before the flow is imported and Prefect starts
    from flows.extract import extract
    _configure_logging()
    summary = extract(**parameters(request))
    print(json.dumps(summary, indent=2))
    return summary


def _analyze_parser(sub) -> None:
    from tasks.stats.request import AnalyzeRequest

    p = sub.add_parser("analyze", help="entropy and CKA of every stored layer (one out-of-core Dask pass)")
    add_options(p, AnalyzeRequest)
    p.add_argument("--json", help="write layers, tokens_kept, entropy_h1/h2, cka, cka_debiased to this file")


def _run_analyze(args) -> dict:
    from tasks.stats.request import AnalyzeRequest

    request = from_args(AnalyzeRequest, args)
    check_ahead(request)  # bad input fails here, before the flow is imported and Prefect starts
    from flows.analyze import analyze
    _configure_logging()
    result = analyze(**parameters(request))
    _print_analysis(result)
    return result


def _print_analysis(result: dict) -> None:
    print(f"{result['model']} · filter {result['filter']} · {result['tokens_kept']} tokens")
    print(f"{'layer':>5} {'H1':>7} {'H2':>7} {'H1/ln':>6} {'eff.rank':>8} {'CKA next':>8} {'dCKA next':>9}")
    cka, dcka = result["cka"], result["cka_debiased"]
    for i, layer in enumerate(result["layers"]):
        following = (f"{cka[i][i + 1]:8.3f} {dcka[i][i + 1]:9.3f}" if i + 1 < len(result["layers"]) else "")
        print(f"{layer:5d} {result['entropy_h1'][i]:7.3f} {result['entropy_h2'][i]:7.3f} "
              f"{result['normalized_entropy'][i]:6.3f} {result['effective_rank'][i]:8.1f} {following}")
    for scored in result["sets"]:
        print(f"set {scored['layers']}: H1 {scored['h1']:.3f}, H2 (closed form) {scored['h2_closed_form']:.3f}")
    print("plots: " + ", ".join(result["plots"]))


def _select_parser(sub) -> None:
    from tasks.select.request import SelectRequest, layer_range

    p = sub.add_parser("select", help="propose candidate layer sets (entropy/CKA methods and baselines)")
    add_options(p, SelectRequest)
    p.add_argument("--layers", type=one_line(layer_range), help="allowed HF indices LOW:HIGH (default 1:N-1, no "
                                                                 "embedding, no last)")
    p.add_argument("--limit", type=int, help="print only the first n candidates")
    p.add_argument("--json", help="write {\"candidates\": [...]} to this file")


def _run_select(args) -> dict:
    from tasks.select.request import SelectRequest

    _refuse_early(limit=args.limit)
    request = from_args(SelectRequest, args)
    if args.layers:
        request = dataclasses.replace(request, low=args.layers[0], high=args.layers[1])
    check_ahead(request)  # bad input fails here, before the flow is imported and Prefect starts
    from flows.selection import select
    _configure_logging()
    candidates = select(**parameters(request))
    shown = candidates[: args.limit] if args.limit else candidates
    print(f"{'layers':<18} {'H1(set)':>8} {'H2(set)':>8} {'mean H1':>8} {'mean CKA':>8}  methods")
    for c in shown:
        s = c.scores
        print(f"{str(c.layers):<18} {s['aggregate_h1']:8.3f} {s['aggregate_h2']:8.3f} {s['mean_entropy']:8.3f} "
              f"{s['mean_pairwise_cka']:8.3f}  {', '.join(c.methods)}")
    return {"candidates": [{"methods": c.methods, "layers": c.layers, **c.scores} for c in shown]}


def _train_parser(sub) -> None:
    from tasks.heads.request import TrainRequest

    p = sub.add_parser("train", help="train an EAGLE-3 draft head for one layer set from the store")
    add_options(p, TrainRequest)
    p.add_argument("--json", help="write the training summary to this file")


def _run_train(args) -> dict:
    from tasks.heads.request import TrainRequest

    request = from_args(TrainRequest, args)
    check_ahead(request)  # bad input fails here, before the flow is imported and Prefect starts
    from flows.train import train_head
    _configure_logging()
    summary = train_head(**parameters(request))
    print(f"head for layers {summary.layers} → {summary.out}: held-out accuracy per TTT step "
          + " ".join(f"{a:.3f}" for a in summary.final["accuracy"])
          + " (untrained " + " ".join(f"{a:.3f}" for a in summary.untrained["accuracy"]) + "), "
          + f"τ_offline {summary.final['tau_offline']['tau']:.3f}")
    return summary


def _evaluate_parser(sub) -> None:
    from tasks.decode.request import EvaluateRequest, OfflineEvaluateRequest

    p = sub.add_parser("evaluate", help="speculative decoding with a trained head: τ, speed-up, lossless check")
    add_options(p, EvaluateRequest)
    p.add_argument("--offline", action="store_true",
                   help="τ_offline: simulate --draft chain, lookup or hybrid rounds along the store's held-out "
                        "replies (the target's own, from a regen: corpus) instead of decoding; needs --store")
    add_options(p, OfflineEvaluateRequest)  # the options it does not share with decoding
    p.add_argument("--json", help="write tau, speedup, lossless, per_position, tokens_per_s, ... to this file")


def _run_evaluate(args) -> dict:
    if args.offline:
        return _run_evaluate_offline(args)
    from tasks.decode.request import EvaluateRequest

    request = from_args(EvaluateRequest, args)
    check_ahead(request)  # bad input fails here, before the flow is imported and Prefect starts
    from flows.evaluate import evaluate
    _configure_logging()
    result = evaluate(**parameters(request))
    if request.compare:
        print(comparison_table(result))
    else:
        print(f"{request.bench} ({request.draft}): τ {result['tau']:.2f}, speed-up {_speedup(result)} "
              f"({result['tokens_per_s']:.1f} vs {result['baseline_tokens_per_s']:.1f} tokens/s), "
              f"lossless {result['lossless']}"
              + (f", auto chose {result['auto']['why']}" if result.get("auto") else "")
              + (", acceptance per position " + " ".join(f"{p:.2f}" for p in result["per_position"])
                 if result["per_position"] else "")
              + (f"; busy machine on prompts {result['contention']['busy_prompts']}"
                 if result["contention"]["flagged"] else ""))
    return result


def _speedup(result: dict) -> str:
    """Median per-prompt speed-up and its 95% interval."""
    interval = result["speedup_ci95"]
    return f"{result['speedup']:.2f}x" + (f" ({interval[0]:.2f}–{interval[1]:.2f})" if interval else "")


def comparison_table(result: dict) -> str:
    """`evaluate --compare` as a Markdown table, the target alone first."""
    from tasks.decode.draft_auto import label as label_of

    first = next(iter(result["compare"].values()))
    lines = [f"{result['bench']}, {result['prompts']} prompts: median per-prompt speed-up over the target alone "
             "(95% bootstrap interval)", "", "| decoder | τ | tokens/s | speed-up | lossless |", "|---|---:|---:|---|---|",
             f"| target alone | 1.00 | {first['baseline_tokens_per_s']:.1f} | 1.00x | True |"]
    auto = result.get("auto") or {}
    for name, r in result["compare"].items():
        label = f"auto ({label_of(auto['choice'])})" if name == "auto" else name
        lines.append(f"| {label} | {r['tau']:.2f} | {r['tokens_per_s']:.1f} | {_speedup(r)} | {r['lossless']} |")
    busy = {name: r["contention"] for name, r in result["compare"].items() if r["contention"]["flagged"]}
    if busy:
        bound = next(iter(busy.values()))["bound"]
        lines.append(f"\nbusy machine: prompts whose cost per step, relative to the target alone on the same prompt, "
                     f"lies beyond {bound}x of the run's median: "
                     + "; ".join(f"{name} {c['busy_prompts']}" for name, c in busy.items())
                     + " (the median speed-up discounts them, the tokens/s do not)")
    return "\n".join(lines)


def _run_evaluate_offline(args) -> dict:
    if not args.store:
        raise LayerwaveError("--offline simulates decoding along a store's held-out replies; pass --store")
    from tasks.decode.request import OfflineEvaluateRequest

    request = from_args(OfflineEvaluateRequest, args)
    check_ahead(request)
    from flows.evaluate import evaluate_offline
    _configure_logging()
    result = evaluate_offline(**parameters(request))
    print(f"τ_offline ({result['draft']}) {result['tau']:.3f} (95% CI {result['tau_ci95'][0]:.3f}–{result['tau_ci95'][1]:.3f}) over "
          f"{result['rounds']} rounds in {result['replies']} held-out replies, depth {result['depth']}; acceptance "
          "per position " + " ".join(f"{p:.2f}" for p in result["per_position"]))
    return result


def _generate_parser(sub) -> None:
    from tasks.data.generate_request import GenerateRequest

    p = sub.add_parser("generate", help="the target writes its own replies to a corpus's prompts (a regen:DIR "
                                        "corpus for extract)")
    add_options(p, GenerateRequest)
    p.add_argument("--json", help="also write the run summary to this JSON file")


def _run_generate(args) -> dict:
    from tasks.data.generate_request import GenerateRequest

    request = from_args(GenerateRequest, args)
    check_ahead(request)  # bad input fails here, before the flow is imported and Prefect starts
    from flows.generate import generate
    _configure_logging()
    summary = generate(**parameters(request))
    print(json.dumps(summary, indent=2))
    return summary


def _verify_parser(sub) -> None:
    p = sub.add_parser("verify", help="check a store: checksums, NaN/inf, consistency, missing shards")
    p.add_argument("--store", default=DEFAULT_STORE, help="Zarr store directory or fsspec URL (default: %(default)s)")
    p.add_argument("--model", help="one model's group (default: every model in the store)")
    p.add_argument("--repair", action="store_true", help="un-commit damaged shards so `extract` rewrites them")


def _run_verify(args) -> dict:
    from store.verify import verify

    sound, lines = verify(args.store, args.model, args.repair)
    print("\n".join(lines))
    if not sound:
        raise LayerwaveError(f"store {args.store} is not sound (see above)")
    return {"sound": sound, "report": lines}


def _run_models(args) -> dict:
    from tasks.data.registry import add_model, registry, user_registry

    if args.action == "add":
        if not args.name or not args.source:
            raise LayerwaveError("usage: layerwave models add NAME --source hf:PATH [--description TEXT]")
        entry = add_model(args.name, args.source, args.description or "")
        from tasks.events import emit_model_added

        announced = emit_model_added(args.name)
        print(f"added {args.name} ({entry['path']}) to {user_registry()}"
              + ("; announced to Prefect (deployments with a model-added trigger will run it)" if announced else ""))
        return {"model": args.name, **entry, "event_emitted": announced}
    for model_id, entry in sorted(registry().items()):
        print(f"{model_id:20s} {entry.get('description', '')}")
    return {"models": sorted(registry())}


def _models_parser(sub) -> None:
    p = sub.add_parser("models", help="list the registered models, or add one (emits a Prefect event)")
    p.add_argument("action", nargs="?", choices=["list", "add"], default="list",
                   help="list the registry (default), or add a model")
    p.add_argument("name", nargs="?", help="for add: the id to register (names the store group)")
    p.add_argument("--source", help="for add: hf:PATH, a Hugging Face checkpoint directory")
    p.add_argument("--description", help="for add: one line shown by `layerwave models`")


def _pipeline_parser(sub) -> None:
    from tasks.pipeline_request import RunRequest

    p = sub.add_parser("run", help="the whole pipeline for one model: extract, analyze, select, train, evaluate, "
                                   "report (re-runs skip finished stages)")
    add_options(p, RunRequest)
    p.add_argument("--json", help="write the run summary to this file")
    s = sub.add_parser("sweep", help="run the pipeline for every registered model without a complete result")
    s.add_argument("--preset", default="quick", help="pipeline preset for every model (default: %(default)s)")
    s.add_argument("--store", help="Zarr store directory or fsspec URL (default: the preset's)")
    s.add_argument("--model", action="append", help="only these models (repeatable)")
    s.add_argument("--limit", type=int, help="train and evaluate at most this many candidate sets per model")
    r = sub.add_parser("report", help="regenerate a model's Markdown report from the store and evaluations")
    r.add_argument("--model", default=DEFAULT_MODEL, help="registry id or hf:PATH (default: %(default)s)")
    r.add_argument("--preset", default="quick", help="the pipeline preset that made the run (default: %(default)s)")
    r.add_argument("--store", help="Zarr store directory or fsspec URL (default: the preset's)")
    r.add_argument("--json", help="write the result rows and rank correlations to this file")


def _run_pipeline(args) -> dict:
    from tasks.pipeline_request import RunRequest

    request = from_args(RunRequest, args)
    check_ahead(request)  # bad input fails here, before the flow is imported and Prefect starts
    from flows.pipeline import pipeline
    _configure_logging()
    summary = pipeline(**parameters(request))
    print(f"report: {summary.report}")
    return summary


def _refuse_early(models: list[str] = (), preset: str | None = None, limit: int | None = None) -> None:
    """Before Prefect starts: a flow's failure would repeat the one line in its run log first."""
    from tasks.data.registry import resolve
    from tasks.pipeline_presets import pipeline_preset

    if limit is not None and limit < 1:
        raise LayerwaveError(f"--limit must be at least 1 (got {limit})")
    if preset is not None:
        pipeline_preset(preset)
    for model in models:
        resolve(model)


def _run_sweep(args) -> dict:
    _refuse_early(args.model or [], args.preset, args.limit)
    _configure_logging()
    from flows.sweep import sweep

    summary = sweep(preset=args.preset, store=args.store, models=args.model, limit=args.limit)
    print(f"ran: {', '.join(summary['ran']) or 'nothing (every model is complete)'}")
    return summary


def _run_report(args) -> dict:
    _refuse_early([args.model], args.preset)
    from tasks.data.registry import store_key
    from tasks.pipeline_presets import preset_store
    from tasks.report.write_report import check_reportable

    check_reportable(preset_store(args.preset, args.store), store_key(args.model), args.preset)
    _configure_logging()
    from flows.report import report
    from store.artefacts import location

    summary = report(model=args.model, preset=args.preset, store=args.store)
    print(location(summary["path"]).read_text())
    return summary


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed run's traceback; for a user error (a LayerwaveError, a damaged chunk)
    the message alone says it all, unless `--debug` asks for it. Bugs keep their traceback."""

    debug = False  # set by main() for each command, since the filter outlives one command in-process

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.debug and record.exc_info and is_user_error(record.exc_info[1]):
            record.exc_info, record.exc_text = None, None
        return True


_USER_ERROR_FILTER = _NoTracebackForUserErrors()  # one instance, so repeated setups add it once


class _QuietEngine(logging.Filter):
    """Keeps Prefect's own run chatter (a run began, its URL, it finished, a temporary server
    started) off the terminal unless `--verbose`; Prefect's run records still get every line."""

    verbose = False  # set by main() for each command
    CHATTER = ("Beginning flow run", "Beginning subflow run", "View at ", "Finished in state Completed",
               "Created task run", "Executing '", "Starting temporary server", "Stopping temporary server",
               "Created flow run")

    def filter(self, record: logging.LogRecord) -> bool:
        return self.verbose or not (record.name.startswith("prefect") and str(record.msg).startswith(self.CHATTER))


_QUIET_ENGINE = _QuietEngine()


def _configure_logging() -> None:
    from prefect.logging.configuration import setup_logging

    setup_logging()
    for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_USER_ERROR_FILTER)
            if isinstance(handler, logging.StreamHandler):  # the terminal, not Prefect's API log handler
                handler.addFilter(_QUIET_ENGINE)
    if not _QUIET_ENGINE.verbose:  # transformers' loading bars and advice
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()


class _OneLineParser(argparse.ArgumentParser):
    """argparse's own refusals (a non-number, an unknown option, a missing one) as one line too."""

    def error(self, message: str):
        self.exit(2, f"layerwave: error: {self.prog}: {message}; see `{self.prog} --help`\n")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    parser = _OneLineParser(prog="layerwave", description=__doc__)
    debug_help = "show the full traceback of any error (user errors print one line without it)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    verbose_help = "show Prefect's run chatter and transformers' progress bars (quiet by default)"
    parser.add_argument("--verbose", action="store_true", help=verbose_help)
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _extract_parser(sub)
    _analyze_parser(sub)
    _select_parser(sub)
    _train_parser(sub)
    _evaluate_parser(sub)
    _verify_parser(sub)
    _models_parser(sub)
    _pipeline_parser(sub)
    for command in sub.choices.values():  # --debug also after the command; SUPPRESS keeps the main one
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help (0) or a refused command line (2, one line printed)
        return int(done.code or 0)
    debug = _NoTracebackForUserErrors.debug = vars(args).pop("debug")  # runners see only their own options
    _QuietEngine.verbose = vars(args).pop("verbose")
    runners = {"generate": _run_generate, "extract": _run_extract, "analyze": _run_analyze, "select": _run_select,
               "train": _run_train, "evaluate": _run_evaluate, "verify": _run_verify, "models": _run_models, "run": _run_pipeline,
               "sweep": _run_sweep, "report": _run_report}
    try:
        from store.verify import store_reads

        with store_reads(getattr(args, "store", None)):
            summary = runners[args.command](args)
    except LayerwaveError as err:
        if debug:
            traceback.print_exc()
        print(f"layerwave: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if EMBEDDED_SERVER_TIMEOUT not in str(err):
            raise
        if debug:
            traceback.print_exc()
        print(f"layerwave: error: {_embedded_server_advice()}", file=sys.stderr)
        return 1
    if getattr(args, "json", None):
        with open(args.json, "w") as handle:
            json.dump(_json_safe(summary), handle, indent=2)
    return 0


EMBEDDED_SERVER_TIMEOUT = "Timed out while attempting to connect to ephemeral Prefect API server"


def _embedded_server_advice() -> str:
    from flows import EPHEMERAL_STARTUP_TIMEOUT

    return (f"Prefect's embedded API server did not start within {os.environ.get(EPHEMERAL_STARTUP_TIMEOUT)} s "
            f"(a busy machine?); re-run with a larger {EPHEMERAL_STARTUP_TIMEOUT}, or start a server "
            "(`prefect server start`) and set PREFECT_API_URL=http://127.0.0.1:4200/api")


def _json_safe(value):
    """NaN (e.g. an undefined debiased CKA) becomes null, so the file is strict JSON; records become objects."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json_safe(dataclasses.asdict(value))
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
