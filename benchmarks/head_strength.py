"""What makes a draft head strong: an ablation table and a data-scaling curve on SmolLM2-135M.

    python benchmarks/head_strength.py --regen DIR [--work DIR] [--table-tokens 37500] [--epochs 2]
        [--long-epochs 8] [--scale-tokens 2343,9375,37500] [--prompts 40] [--max-new-tokens 128]
        [--out benchmarks/out/head_strength.json]

Table: the EAGLE-3 default layers [2, 15, 27], the `quick` training preset, the same number of
stored tokens and epochs for every row. Rows: {ShareGPT replies, the target's own regenerated
replies (`--regen`, from `layerwave generate`)} × {random lm_head, warm-started (lm_head at a
tenth of the learning rate)}, the warm start frozen, and the regenerated random-init row again at
`--long-epochs`. Columns: held-out accuracy per TTT step (on the row's own corpus) and τ_offline
on the same held-out regenerated replies for every row.

Validation: real decoding of held-out regenerated prompts (`--bench heldout`) beside τ_offline of
exactly those replies, for three heads.

Scaling: the regenerated random-init recipe at each `--scale-tokens` store size (each 4× the
last) and both training budgets: τ_offline on each store's own held-out replies, with its
bootstrap 95% interval (PNG + JSON).

Real MT-Bench decoding (τ, speed-up against the target alone in the same run) for the new recipe
at `--long-epochs` and the old one (ShareGPT replies, `--epochs`): about 11 minutes each here.

Every step's result is saved as it finishes and skipped on a re-run, so a killed run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.evaluate import evaluate, evaluate_offline  # noqa: E402
from flows.extract import extract  # noqa: E402
from flows.train import train_head  # noqa: E402

MODEL, LAYERS, PRESET = "smollm2-135m", [2, 15, 27], "quick"
RECIPES = {  # name: (corpus, train_head options); the `quick` preset (batch 1, lr 1e-3, TTT 3) otherwise
    "sharegpt/random": ("sharegpt", {}),
    "sharegpt/warm-lr0.1": ("sharegpt", {"warm_start": True, "lm_head_lr_scale": 0.1}),
    "regen/random": ("regen", {}),
    "regen/warm-lr0.1": ("regen", {"warm_start": True, "lm_head_lr_scale": 0.1}),
    "regen/warm-frozen": ("regen", {"warm_start": True, "freeze_lm_head": True}),
}
REAL = (("regen/random", 8), ("sharegpt/random", 2))  # (row, epochs) decoded for real: new recipe, old corpus
VALIDATED = (("regen/random", 2), ("regen/random", 8), ("regen/warm-frozen", 2))  # real vs offline, same replies


class Results:
    """The JSON file of finished steps: read at start, rewritten after every step."""

    def __init__(self, path: Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.is_file() else {}

    def step(self, key: str, compute):
        if key not in self.data:
            began = time.perf_counter()
            value = compute()
            self.data[key] = {"seconds": round(time.perf_counter() - began, 1), **value}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.data, indent=2) + "\n")
            print(f"[{time.strftime('%H:%M:%S')}] {key}: done in {self.data[key]['seconds']} s", flush=True)
        return self.data[key]


def store_for(work: Path, corpus: str, tokens: int, regen: str) -> str:
    store = str(work / f"{corpus}-{tokens}.zarr")
    extract(model=MODEL, corpus=f"regen:{regen}" if corpus == "regen" else "sharegpt", tokens=tokens, store=store)
    return store


def trained(work: Path, store: str, name: str, recipe: dict, epochs: int) -> tuple[str, dict]:
    head = str(work / "heads" / f"{Path(store).stem}-{name.replace('/', '-')}-e{epochs}")
    summary = train_head(model=MODEL, store=store, layers=LAYERS, out=head, preset_name=PRESET, epochs=epochs,
                         **recipe)
    return head, {"accuracy": summary.final["accuracy"], "training_tau_offline": summary.final["tau_offline"],
                  "tokens_per_s": summary.tokens_per_s, "steps": summary.steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regen", required=True, help="a complete `layerwave generate` output directory")
    parser.add_argument("--work", default="benchmarks/work", help="stores and heads (large; git-ignored)")
    parser.add_argument("--table-tokens", type=int, default=37500)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--long-epochs", type=int, default=8, help="the second training budget")
    parser.add_argument("--scale-tokens", default="2343,9375,37500")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--validate-prompts", type=int, default=4)
    parser.add_argument("--out", default="benchmarks/out/head_strength.json")
    args = parser.parse_args()
    work, results = Path(args.work), Results(Path(args.out))
    stores = {corpus: store_for(work, corpus, args.table_tokens, args.regen) for corpus in ("sharegpt", "regen")}
    regen_store = stores["regen"]

    def offline(head: str) -> dict:
        # every row on the same held-out regenerated replies (seed 0's split of the regen store)
        return evaluate_offline(model=MODEL, head=head, store=regen_store, depth=4)

    heads = {}
    for name, (corpus, recipe) in RECIPES.items():
        for epochs in (args.epochs, args.long_epochs) if name == "regen/random" else (args.epochs,):
            def train_row(name=name, corpus=corpus, recipe=recipe, epochs=epochs):
                head, summary = trained(work, stores[corpus], name, recipe, epochs)
                return {"head": head, "epochs": epochs, **summary, "tau_offline": offline(head)}
            heads[name, epochs] = results.step(f"table/{name}/e{epochs}", train_row)["head"]
    for name, epochs in VALIDATED:
        results.step(f"validate/{name}/e{epochs}",
                     lambda key=(name, epochs): _validate(heads[key], regen_store, args.validate_prompts))
    for tokens in (int(t) for t in args.scale_tokens.split(",")):
        store = store_for(work, "regen", tokens, args.regen)
        for epochs in (args.epochs, args.long_epochs):
            def scale_point(store=store, epochs=epochs, tokens=tokens):
                head, summary = trained(work, store, "regen/random", RECIPES["regen/random"][1], epochs)
                return {"head": head, "store_tokens": tokens, "epochs": epochs, **summary,
                        "tau_offline": evaluate_offline(model=MODEL, head=head, store=store, depth=4)}
            results.step(f"scale/{tokens}/e{epochs}", scale_point)
    for name, epochs in REAL:
        results.step(f"table/{name}/e{epochs}/mt-bench", lambda key=(name, epochs): _real(
            heads[key], "mt-bench", args.prompts, args.max_new_tokens, regen_store))
    _plot(results.data, Path(args.out).with_suffix(".png"))


def _real(head: str, bench: str, prompts: int, max_new_tokens: int, store: str) -> dict:
    result = evaluate(model=MODEL, head=head, bench=bench, limit=prompts, max_new_tokens=max_new_tokens, depth=4,
                      store=store)
    return {k: result[k] for k in ("tau", "speedup", "tokens_per_s", "baseline_tokens_per_s", "per_position",
                                   "lossless", "prompts", "tokens")}


def _validate(head: str, store: str, prompts: int) -> dict:
    """Real decoding of held-out regenerated prompts beside τ_offline of exactly those replies."""
    real = evaluate(model=MODEL, head=head, bench="heldout", limit=prompts, max_new_tokens=256, depth=4, store=store)
    simulated = evaluate_offline(model=MODEL, head=head, store=store, depth=4, max_new_tokens=256,
                                 first_turn_only=True)
    return {"real_tau": real["tau"], "real_per_position": real["per_position"], "real_prompts": real["prompts"],
            "offline_tau": simulated["tau"], "offline_per_position": simulated["per_position"], "offline_replies": simulated["replies"],
            "lossless": real["lossless"]}


def _plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [v for k, v in data.items() if k.startswith("scale/")]
    if not points:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for epochs in sorted({p["epochs"] for p in points}):
        row = sorted((p for p in points if p["epochs"] == epochs), key=lambda p: p["store_tokens"])
        x = [p["store_tokens"] for p in row]
        tau = [p["tau_offline"]["tau"] for p in row]
        low, high = zip(*(p["tau_offline"]["tau_ci95"] for p in row))
        ax.errorbar(x, tau, yerr=[[t - lo for t, lo in zip(tau, low)], [hi - t for t, hi in zip(tau, high)]],
                    fmt="o-", capsize=3, label=f"{epochs} epoch(s)")
    ax.set_xscale("log")
    ax.set_xlabel("stored tokens of regenerated conversations (log scale)")
    ax.set_ylabel("τ_offline, held-out replies (tokens per round)")
    ax.set_title("SmolLM2-135M, layers [2, 15, 27], quick preset (batch 1), chain depth 4", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
