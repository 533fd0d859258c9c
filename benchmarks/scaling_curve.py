"""Head strength against training compute: one long run of the `quick` recipe on one training
store, measured each time its token-passes double.

    python benchmarks/scaling_curve.py --store STORE [--model smollm2-135m] [--first 400000]
                                       [--points 7] [--out benchmarks/out/scaling_curve.json]
                                       [--beside EARLIER.json ...] [--device cpu] [--batch-size 1] [--lr 1e-3]

STORE is a training store of the EAGLE-3 default layers, of the target's own replies (as for
benchmarks/recipe.py). The run's learning-rate schedule and its one-step TTT warmup span the whole
run, so an earlier point is a snapshot of the long run, not a head trained to that budget alone
(its learning rate has not decayed, and before the last quarter only the first draft trains).
The head checkpoints at every point and every tenth of the run, and each point is written (JSON
and PNG) as it is reached: a killed run, or one stopped with --until, resumes where it was. Each
point's head is exported into --work as `point-K` (vLLM format, with a training.json holding that
point's held-out evaluation), for real decoding: `layerwave evaluate --head WORK/point-K --store
STORE` or benchmarks/evaluate.py.

At each point, on the store's held-out replies: accuracy over every reply position per TTT
step, τ_offline of the head's chain (depth 4) and of hybrid drafting (the chain and the context's
copy verified as one tree), each with its 95% interval, and the shuffled-layer diagnostic. Beside
the curve, on the same replies: the feature-free baseline, and the context's copy alone
(`--draft lookup`, no head). And on the study's fixed evaluation set, the target's own greedy replies
to the MT-Bench prompts (`layerwave run --preset study`'s replay store, built beside STORE on the
first run): the chain's and hybrid's replayed τ at each point, and the copy's alone beside them.
`--beside` draws earlier curves (other stores, other data sizes) on the same axes. On a GPU,
`--device cuda` with a larger `--batch-size` and `--lr` trains the same recipe at GPU scale
(benchmarks/gpu_check.sh); the evaluation stays on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from recipe import HOLDOUT, open_rows
from flows.study import replay_replies
from store.artefacts import write_json
from tasks.data import load_model
from tasks.decode.context_lookup import LOOKUP_TOKENS
from tasks.decode.replay import replay_data, replay_tau
from tasks.heads.export_head import export
from tasks.heads.layer_use import LayerUse
from tasks.heads.offline_tau import offline_tau, simulate_documents, summarize_rounds
from tasks.heads.train_data import StoreBatches
from tasks.heads.train_head import held_out_metrics, preset, stored_target, train
from tasks.pipeline_presets import pipeline_preset

DEPTH = 4
BENCH, EVALUATION = "mt-bench", pipeline_preset("study")  # the study's replayed prompts and reply length


def point_steps(total: int, points: int) -> list[int]:
    """Steps of each point: the run's end, and each earlier point half the next."""
    return [max(1, round(total / 2 ** (points - 1 - k))) for k in range(points)]


def measure(head, data: StoreBatches, config, eos: int | None, record: dict, store: str, key: str) -> tuple[dict, dict]:
    """A point's held-out evaluation (the run's own at its end, else a fresh one), and its columns:
    that evaluation, then τ replayed along the target's replies to the benchmark."""
    metrics = record["final"] if record["finished"] else held_out_metrics(head, data, config, eos,
                                                                             LayerUse(head, config.seed))
    replayed = {f"replay_{drafts}": replay_tau(head, store, key, BENCH, DEPTH, eos, EVALUATION.max_new_tokens, drafts)
                for drafts in ("chain", "hybrid")}
    return metrics, {"accuracy": metrics["accuracy"], "coverage": metrics["coverage"][0],
                     "layer_use": metrics["layer_use"], "tau_offline": metrics["tau_offline"],
                     "tau_offline_hybrid": offline_tau(head, data, DEPTH, eos, drafts="hybrid"), **replayed}


def copy_tau(data: StoreBatches, eos: int | None, **replies) -> dict:
    """τ of the context's copy alone (no head) along the held-out documents of `data`."""
    documents = (d for _, shard_documents in data.heldout_shards() for d in shard_documents)
    return summarize_rounds(simulate_documents(None, documents, DEPTH, eos, drafts="lookup", **replies), LOOKUP_TOKENS)


def plot(result: dict, path: Path, beside: list[dict] = ()) -> None:
    """The curve, and each of `beside` (earlier curves, other data sizes) fainter on the same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, *taus) = plt.subplots(1, 3, figsize=(15, 4))
    for curve in [result, *beside]:
        points, style = curve["points"], {} if curve is result else {"alpha": 0.45, "ls": ":"}
        passes, size = [p["token_passes"] for p in points], f" ({curve['store_tokens'] / 1e6:.2f}M stored tokens)"
        left.plot(passes, [p["accuracy"][0] for p in points], marker="o", color="C0", label="head, first draft" + size,
                  **style)
        for axis, (chain, hybrid) in zip(taus, (("tau_offline", "tau_offline_hybrid"),
                                                ("replay_chain", "replay_hybrid"))):
            for key, label, color in ((chain, f"head chain, depth {DEPTH}", "C0"), (hybrid, "hybrid", "C1")):
                axis.errorbar(passes, [p[key]["tau"] for p in points], marker="o", color=color, label=label + size,
                              capsize=3,
                              yerr=[[p[key]["tau"] - p[key]["tau_ci95"][0] for p in points],
                                    [p[key]["tau_ci95"][1] - p[key]["tau"] for p in points]], **style)
    left.axhline(result["bigram_accuracy"], color="grey", ls="--", label="feature-free baseline")
    left.set(xscale="log", xlabel="training token-passes", ylabel="held-out accuracy, all reply positions")
    for axis, (copy, where) in zip(taus, (("lookup", "τ_offline on the held-out replies"),
                                          ("replay_lookup", f"τ replayed on {BENCH} (the target's replies)"))):
        axis.axhline(result[copy]["tau"], color="grey", ls="--", label="context's copy alone (lookup)")
        axis.set(xscale="log", xlabel="training token-passes", ylabel=where)
    for axis in (left, *taus):
        axis.legend(fontsize=7)
    fig.suptitle(f"{result['model']} {result['layers']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--first", type=int, default=400_000, help="token-passes of the first point")
    parser.add_argument("--points", type=int, default=7, help="points, each twice the last's token-passes")
    parser.add_argument("--until", type=int, default=None, help="stop after this many points (resume later)")
    parser.add_argument("--work", default=None, help="where the head goes (default: beside --out)")
    parser.add_argument("--out", default="benchmarks/out/scaling_curve.json")
    parser.add_argument("--beside", nargs="*", default=[], help="earlier curves' JSON, drawn on the same axes")
    parser.add_argument("--device", default="cpu", help="where the head trains: cpu or cuda[:N]")
    parser.add_argument("--batch-size", type=int, default=1, help="windows per step (quick: 1, a CPU's choice)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: quick's)")
    args = parser.parse_args()
    key, layers, out, work, result = open_rows(args)
    beside = [json.loads(Path(path).read_text()) for path in args.beside]
    epochs = math.ceil(args.first * 2 ** (args.points - 1) / result["token_passes_per_epoch"])
    config = replace(preset("quick", lr=args.lr, batch_size=args.batch_size), precision="bfloat16",
                     holdout=HOLDOUT, chain_depth=DEPTH, epochs=epochs, eval_every=10**9)
    data = StoreBatches(args.store, key, layers, seq_len=config.seq_len, batch_size=config.batch_size,
                        seed=config.seed, holdout=config.holdout)
    steps_per_epoch = len(data.plan(0))
    passes_per_step = result["token_passes_per_epoch"] / steps_per_epoch
    steps = point_steps(epochs * steps_per_epoch, args.points)
    eos = stored_target(data).tokenizer.eos_token_id
    if "lookup" not in result:
        result["lookup"] = copy_tau(data, eos)
    if "replay_lookup" not in result:
        replay_replies(args.model, args.store, key, BENCH, EVALUATION.prompts, EVALUATION.max_new_tokens,
                       EVALUATION.max_length, EVALUATION.generate_max_prompt_tokens)
        result["replay_lookup"] = copy_tau(replay_data(args.store, key, BENCH, layers), eos,
                                           max_new_tokens=EVALUATION.max_new_tokens, first_turn_only=True)
    result.update(config=asdict(config), epochs=epochs, point_steps=steps, device=args.device)
    result.setdefault("points", [])
    if result["points"]:
        plot(result, out.with_suffix(".png"), beside)  # the curves beside may be new
    print(f"{args.model} {layers}: {epochs} epochs of {result['token_passes_per_epoch']:,} token-passes, points at "
          f"steps {steps}; feature-free baseline {result['bigram_accuracy']:.3f}, context's copy alone τ "
          f"{result['lookup']['tau']:.3f} (held out), {result['replay_lookup']['tau']:.3f} ({BENCH})", flush=True)
    for index, stop in enumerate(steps[:args.until]):
        if index < len(result["points"]):
            continue
        started = time.perf_counter()
        head, record = train(args.store, key, layers, work, config, stop_after=stop,
                             device=torch.device(args.device))
        trained = time.perf_counter() - started
        metrics, columns = measure(head, data, config, eos, record, args.store, key)
        point = {"steps": stop, "token_passes": round(stop * passes_per_step), "training_seconds": trained, **columns}
        export_point(head, {**record, "final": metrics}, work / f"point-{index + 1}", args.model, config)
        point["seconds"] = (result["points"][-1]["seconds"] if result["points"] else 0.0) + time.perf_counter() - started
        result["points"].append(point)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        plot(result, out.with_suffix(".png"), beside)
        taus = ", ".join(f"{name} {point[k]['tau']:.3f} [{point[k]['tau_ci95'][0]:.3f}, {point[k]['tau_ci95'][1]:.3f}]"
                         for name, k in (("τ_offline chain", "tau_offline"), ("hybrid", "tau_offline_hybrid"),
                                         (f"{BENCH} chain", "replay_chain"), ("hybrid", "replay_hybrid")))
        print(f"point {index + 1}/{args.points}: {point['token_passes']:,} token-passes, accuracy "
              + " / ".join(f"{a:.3f}" for a in point["accuracy"])
              + f", {taus}, {point['seconds'] / 3600:.2f} h so far", flush=True)
    print(f"wrote {out}; the points' heads are in {work}")


def export_point(head, record: dict, out: Path, model: str, config) -> None:
    """A point's head as `layerwave train` writes one (its training.json's `final` is the point's
    evaluation, which `--draft auto` reads), so that real decoding can confirm its replayed τ;
    training.json goes last, as the mark of a whole export."""
    target = load_model.verifier(model)
    export(head, out, "vllm", target["name_or_path"], speculative_tokens=config.ttt_steps,
           architectures=target["architectures"], num_layers=load_model.num_hidden_layers(model))
    write_json(out / "training.json", record)


if __name__ == "__main__":
    main()
