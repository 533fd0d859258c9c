"""Head strength against training compute: one long run of the `quick` recipe on one training
store, measured each time its token-passes double.

    python benchmarks/scaling_curve.py --store STORE [--model smollm2-135m] [--first 400000]
                                       [--points 7] [--out benchmarks/out/scaling_curve.json]

STORE is a training store of the EAGLE-3 default layers, of the target's own replies (as for
benchmarks/recipe.py). The run's learning-rate schedule and its one-step TTT warmup span the whole
run, so an earlier point is a snapshot of the long run, not a head trained to that budget alone
(its learning rate has not decayed, and before the last quarter only the first draft trains).
The head checkpoints at every point and every tenth of the run, and each point is written (JSON
and PNG) as it is reached: a killed run, or one stopped with --until, resumes where it was.

At each point, on the store's held-out replies: accuracy over every reply position per TTT
step, τ_offline of the head's chain (depth 4) and of hybrid drafting (the chain and the context's
copy verified as one tree), each with its 95% interval, and the shuffled-layer diagnostic. Beside
the curve, on the same replies: the feature-free baseline, and the context's copy alone
(`--draft lookup`, no head).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

from recipe import HOLDOUT, open_rows
from tasks.decode.context_lookup import LOOKUP_TOKENS
from tasks.heads.layer_use import LayerUse
from tasks.heads.offline_tau import offline_tau, simulate_documents, summarize_rounds
from tasks.heads.train_data import StoreBatches
from tasks.heads.train_head import held_out_metrics, preset, stored_target, train

DEPTH = 4


def point_steps(total: int, points: int) -> list[int]:
    """Steps of each point: the run's end, and each earlier point half the next."""
    return [max(1, round(total / 2 ** (points - 1 - k))) for k in range(points)]


def measure(head, data: StoreBatches, config, eos: int | None, record: dict) -> dict:
    """A point's columns: the run's own final evaluation at its end, else a fresh one."""
    metrics = record["final"] if record["finished"] else held_out_metrics(head, data, config, eos,
                                                                             LayerUse(head, config.seed))
    return {"accuracy": metrics["accuracy"], "coverage": metrics["coverage"][0],
            "layer_use": metrics["layer_use"], "tau_offline": metrics["tau_offline"],
            "tau_offline_hybrid": offline_tau(head, data, DEPTH, eos, drafts="hybrid")}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    passes = [p["token_passes"] for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(passes, [p["accuracy"][0] for p in points], "o-", label="head, first draft")
    left.axhline(result["bigram_accuracy"], color="grey", ls="--", label="feature-free baseline")
    left.set(xscale="log", xlabel="training token-passes", ylabel="held-out accuracy, all reply positions")
    for key, label in (("tau_offline", f"head chain, depth {DEPTH}"), ("tau_offline_hybrid", "hybrid")):
        right.errorbar(passes, [p[key]["tau"] for p in points], fmt="o-", label=label, capsize=3,
                       yerr=[[p[key]["tau"] - p[key]["tau_ci95"][0] for p in points],
                             [p[key]["tau_ci95"][1] - p[key]["tau"] for p in points]])
    right.axhline(result["lookup"]["tau"], color="grey", ls="--", label="context's copy alone (lookup)")
    right.set(xscale="log", xlabel="training token-passes", ylabel="τ_offline on the held-out replies")
    for axis in (left, right):
        axis.legend(fontsize=8)
    fig.suptitle(f"{result['model']} {result['layers']}: {result['store_tokens']:,} stored tokens")
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
    args = parser.parse_args()
    key, layers, out, work, result = open_rows(args)
    passes_per_step = result["token_passes_per_epoch"] / result["windows_per_epoch"]
    epochs = math.ceil(args.first * 2 ** (args.points - 1) / result["token_passes_per_epoch"])
    config = replace(preset("quick"), precision="bfloat16", holdout=HOLDOUT, chain_depth=DEPTH, epochs=epochs,
                     eval_every=10**9)
    steps = point_steps(epochs * result["windows_per_epoch"], args.points)
    data = StoreBatches(args.store, key, layers, seq_len=config.seq_len, batch_size=config.batch_size,
                        seed=config.seed, holdout=config.holdout)
    eos = stored_target(data).tokenizer.eos_token_id
    if "lookup" not in result:
        documents = (d for _, shard_documents in data.heldout_shards() for d in shard_documents)
        result["lookup"] = summarize_rounds(simulate_documents(None, documents, DEPTH, eos, drafts="lookup"),
                                            LOOKUP_TOKENS)
    result.update(config=asdict(config), epochs=epochs, point_steps=steps)
    result.setdefault("points", [])
    print(f"{args.model} {layers}: {epochs} epochs of {result['token_passes_per_epoch']:,} token-passes, points at "
          f"steps {steps}; feature-free baseline {result['bigram_accuracy']:.3f}, context's copy alone τ "
          f"{result['lookup']['tau']:.3f}", flush=True)
    for index, stop in enumerate(steps[:args.until]):
        if index < len(result["points"]):
            continue
        started = time.perf_counter()
        head, record = train(args.store, key, layers, work, config, stop_after=stop)
        trained = time.perf_counter() - started
        point = {"steps": stop, "token_passes": round(stop * passes_per_step), "training_seconds": trained,
                 **measure(head, data, config, eos, record)}
        point["seconds"] = (result["points"][-1]["seconds"] if result["points"] else 0.0) + time.perf_counter() - started
        result["points"].append(point)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        plot(result, out.with_suffix(".png"))
        chain, hybrid = point["tau_offline"], point["tau_offline_hybrid"]
        print(f"point {index + 1}/{args.points}: {point['token_passes']:,} token-passes, accuracy "
              + " / ".join(f"{a:.3f}" for a in point["accuracy"])
              + f", τ_offline chain {chain['tau']:.3f} [{chain['tau_ci95'][0]:.3f}, {chain['tau_ci95'][1]:.3f}], "
              f"hybrid {hybrid['tau']:.3f} [{hybrid['tau_ci95'][0]:.3f}, {hybrid['tau_ci95'][1]:.3f}], "
              f"{point['seconds'] / 3600:.2f} h so far", flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
