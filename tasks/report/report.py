"""The per-model report: candidate sets with their scores, τ and speed-up per set and benchmark
with spread across seeds, and how well each selection score predicts τ.

Everything is read back from disk (selection in the store, evaluation JSON beside each head), so
`layerwave report` regenerates the same report without re-running anything.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tasks.names import EAGLE3_DEFAULT
from tasks.select.selection import Candidate

SCORES = ("aggregate_h1", "aggregate_h2", "mean_entropy", "mean_pairwise_cka")
# Two-sided 95% Student t quantiles for 1..30 degrees of freedom (no SciPy dependency).
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: float) -> float:
    """Two-sided 95% Student t quantile, degrees of freedom rounded down (normal past the table)."""
    whole = max(1, math.floor(df))
    return T95[whole - 1] if whole <= len(T95) else 1.96


def mean_ci95(values: list[float]) -> tuple[float, float | None]:
    """Mean and half-width of its 95% t interval (None for a single value: no spread to show)."""
    n = len(values)
    mean = float(np.mean(values))
    if n < 2:
        return mean, None
    return mean, float(t95(n - 1) * np.std(values, ddof=1) / math.sqrt(n))


def paired_difference_ci95(a: dict[int, float], b: dict[int, float]) -> tuple[float | None, float | None]:
    """Mean τ difference over the seeds both sets share, and the half-width of its paired 95% t
    interval. A seed fixes the head's initial weights, the held-out split and the batch order for
    every set alike, so comparing within a seed removes what the seed does to all sets."""
    differences = [a[seed] - b[seed] for seed in sorted(set(a) & set(b))]
    return mean_ci95(differences) if differences else (None, None)


def spearman(x: list[float], y: list[float]) -> float | None:
    """Rank correlation (average ranks for ties); None when fewer than 3 pairs or a constant side."""
    if len(x) < 3:
        return None
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def result_rows(candidates: list[Candidate], evaluations: dict[tuple, list[dict]], benches: list[str]) -> list[dict]:
    """One row per (set, bench) with at least one evaluated seed; `evaluations[(layers, bench)]`
    holds one evaluation result per seed."""
    rows = []
    for candidate in candidates:
        for bench in benches:
            runs = evaluations.get((tuple(candidate.layers), bench), [])
            if not runs:
                continue
            tau, tau_ci = mean_ci95([r["tau"] for r in runs])
            timed = [r["speedup"] for r in runs if r.get("speedup") is not None]  # replayed τ has no speed-up
            speedup, speedup_ci = mean_ci95(timed) if timed else (None, None)
            rows.append({"layers": candidate.layers, "method": ",".join(candidate.methods), "bench": bench,
                         "tau_mean": tau, "tau_ci95": tau_ci, "speedup_mean": speedup, "speedup_ci95": speedup_ci,
                         "seeds": [r["seed"] for r in runs], "tau_per_seed": [r["tau"] for r in runs],
                         "lossless": None if all(r.get("lossless") is None for r in runs)  # replayed: not decoded
                         else all(r.get("lossless") is not False for r in runs),
                         "busy_seeds": [r["seed"] for r in runs if (r.get("contention") or {}).get("flagged")],
                         **{name: candidate.scores[name] for name in SCORES}})
    return rows


def spearman_p(x: list[float], y: list[float], permutations: int = 20000, seed: int = 0) -> float | None:
    """Two-sided permutation p-value of a Spearman correlation: the share of seeded random
    pairings at least as strong. With a dozen sets only |ρ| near 0.6 or more reaches p < 0.05."""
    rho = spearman(x, y)
    if rho is None:
        return None
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    rng = np.random.default_rng(seed)
    shuffled = rng.permuted(np.tile(ry, (permutations, 1)), axis=1)
    centred = shuffled - shuffled.mean(1, keepdims=True)
    rhos = (centred @ (rx - rx.mean())) / (np.linalg.norm(centred, axis=1) * np.linalg.norm(rx - rx.mean()))
    return float((np.sum(np.abs(rhos) >= abs(rho) - 1e-12) + 1) / (permutations + 1))


def correlations(rows: list[dict], benches: list[str], predictors=SCORES) -> dict[str, dict[str, dict[str, float | None]]]:
    """Spearman correlation of each predictor (selection scores, and the screening τ_offline when
    the study screened) with mean τ across sets, per benchmark, with its permutation p-value."""
    out = {}
    for bench in benches:
        here = [r for r in rows if r["bench"] == bench and all(r.get(name) is not None for name in predictors)]
        taus = [r["tau_mean"] for r in here]
        out[bench] = {name: {"rho": spearman([r[name] for r in here], taus),
                             "p": spearman_p([r[name] for r in here], taus)} for name in predictors}
    return out


def per_seed(row: dict) -> dict[int, float]:
    """τ by seed, so that two sets are compared on the seeds they share."""
    return dict(zip(row["seeds"], row["tau_per_seed"]))


def is_default(row: dict) -> bool:
    """The EAGLE-3 default set (a row's `method` lists every method that proposed its set)."""
    return EAGLE3_DEFAULT in row["method"].split(",")


def verdict(rows: list[dict], bench: str) -> str:
    """Every set against the EAGLE-3 default, at the strength the data supports: a set is better
    or worse only when the paired 95% interval of its τ difference from the default excludes 0."""
    here = [r for r in rows if r["bench"] == bench]
    default = next((r for r in here if is_default(r)), None)
    if not here or default is None:
        return f"{bench}: no evaluated EAGLE-3 default to compare with."
    others = [r for r in here if r is not default]
    better, worse, within, uncompared = [], [], 0, 0
    for r in others:
        difference, half = paired_difference_ci95(per_seed(r), per_seed(default))
        if half is None:
            uncompared += 1  # fewer than two seeds in common with the default
            continue
        label = f"{r['layers']} ({r['method']}, {difference:+.3f} ± {half:.3f})"
        if difference - half > 0:
            better.append(label)
        elif difference + half < 0:
            worse.append(label)
        else:
            within += 1
    compared = len(others) - uncompared
    if not compared:
        top = max(r["tau_mean"] for r in here)
        leaders = [r for r in here if r["tau_mean"] == top]
        if len(leaders) > 1:
            among = ", the EAGLE-3 default among them" if any(r is default for r in leaders) else ""
            return (f"{bench}: {len(leaders)} of {len(here)} sets tie at the highest mean τ ({top:.3f}){among}, "
                    "from one seed per set: no interval, no conclusion.")
        leader = "the EAGLE-3 default" if leaders[0] is default else f"{leaders[0]['layers']} ({leaders[0]['method']})"
        return (f"{bench}: {leader} has the highest mean τ ({top:.3f}) of {len(here)} sets, "
                "from one seed per set: no interval, no conclusion.")
    pending = f" Not compared yet (under two seeds in common): {uncompared}." if uncompared else ""
    return (f"{bench}: default {default['layers']} τ {default['tau_mean']:.3f} ± {default['tau_ci95']:.3f}. "
            f"Better than the default beyond noise (paired-by-seed 95% interval of the difference above 0): "
            f"{'; '.join(better) or 'none'}. Worse: {'; '.join(worse) or 'none'}. Within noise: {within} of "
            f"{compared}.{pending} With {compared} comparisons at 95%, about {0.05 * compared:.1f} would cross "
            "by chance alone.")


def screening_markdown(screening: list[dict]) -> list[str]:
    """The screening round: every set's mean τ_offline over its seeds, finalists marked."""
    if not screening:
        return []
    lines = ["## Screening (short budget, τ_offline along each head's held-out replies)", "",
             "| layers | methods | τ_offline (mean over seeds) | per seed | rounds | finalist |",
             "|---|---|---:|---|---:|---|"]
    lines += [f"| {r['layers']} | {r['method']} | {r['tau_offline_mean']:.3f} | "
              + ", ".join(f"{t:.3f}" for t in r["tau_offline_per_seed"])
              + f" | {r['rounds']} | {'yes' if r['finalist'] else ''} |" for r in screening]
    return lines + [""]


def definitions(replayed: bool, depth: int) -> list[str]:
    """What τ and the speed-up are, in the report itself."""
    lines = ["## What the numbers mean", "",
             f"- **τ** (tau): tokens the target emits per verification forward when the head drafts a chain of "
             f"{depth} tokens per round and the target keeps the longest correct prefix plus one token of its own "
             "(greedy, so the output is exactly the target's). 1.0 means no draft is ever accepted; "
             f"{depth + 1} is the most a round can give.",
             "- **τ_offline**: the same rounds simulated along stored replies of the target, without running it."]
    if replayed:
        lines.append("- Here τ is replayed along the target's own greedy replies to each benchmark's prompts, "
                     "generated once (tasks/decode/replay.py): the τ real greedy decoding measures, for every head "
                     "and prompt. No speed-up is measured (n/a).")
    else:
        lines.append("- **speed-up**: time of the target decoding alone (plain Hugging Face greedy `generate`, "
                     "same prompts, back to back, order alternating) over the time of speculative decoding; "
                     "below 1 it is slower. On a CPU a round costs 1.4–1.5 plain steps, so τ must exceed that "
                     "before it pays (README, 'Decoding speed on a CPU').")
    return lines + [""]


def markdown(title: str, facts: dict, plots: list[tuple[str, str]], candidates: list[Candidate], rows: list[dict],
             correlation: dict, benches: list[str], screening: list[dict] | None = None,
             replayed: bool = False) -> str:
    lines = [f"# {title}", ""]
    lines += [f"- {name}: {value}" for name, value in facts.items() if value is not None] + [""]
    lines += definitions(replayed, facts.get("draft depth", 4))
    for number, (name, caption) in enumerate(plots, 1):
        lines += [f"![{Path(name).stem}]({name})", "", f"*Figure {number}. {caption}*", ""]
    lines += ["## Candidate layer sets (HF hidden_states indices)", "",
              "| layers | methods | " + " | ".join(SCORES) + " |", "|---|---|" + "---:|" * len(SCORES)]
    lines += [f"| {c.layers} | {', '.join(c.methods)} | " + " | ".join(f"{c.scores[s]:.3f}" for s in SCORES) + " |"
              for c in candidates]
    lines += [""] + screening_markdown(screening or [])
    one_seed = rows and max(len(r["seeds"]) for r in rows) < 2
    lines += ["", "## Speculative decoding per set (mean over seeds, ± 95% t interval)", ""]
    if one_seed:
        lines += ["One seed per set: no interval across seeds, so no difference between sets is tested.", ""]
    lines += ["| layers | methods | bench | τ | speed-up | seeds | lossless | timed on a busy machine |",
              "|---|---|---|---:|---:|---:|---|---|"]
    lines += [f"| {r['layers']} | {r['method']} | {r['bench']} | {_pm(r['tau_mean'], r['tau_ci95'])} | "
              f"{_pm(r['speedup_mean'], r['speedup_ci95'])} | {len(r['seeds'])} | "
              f"{'n/a' if r['lossless'] is None else r['lossless']} | "
              + (f"seeds {r['busy_seeds']}" if r.get("busy_seeds") else "no") + " |"
              for r in sorted(rows, key=lambda r: (r["bench"], -r["tau_mean"]))]
    predictors = list(next(iter(correlation.values()), {}))
    lines += ["", "## How well each selection score predicts τ (Spearman ρ across sets, permutation p)", "",
              "| bench | " + " | ".join(predictors) + " |", "|---|" + "---:|" * len(predictors)]
    lines += [f"| {bench} | " + " | ".join("n/a" if v["rho"] is None else f"{v['rho']:+.2f} (p {v['p']:.2f})"
                                          for v in correlation[bench].values()) + " |" for bench in benches]
    lines += ["", "## Conclusion", ""] + [f"- {verdict(rows, bench)}" for bench in benches]
    return "\n".join(lines) + "\n"


def _pm(mean: float | None, ci: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.3f}" if ci is None else f"{mean:.3f} ± {ci:.3f}"
