"""The study's two rounds: screen every candidate set cheaply, then train the finalists fully.

Screening trains each set × seed at a short budget and scores it by τ_offline along its held-out
replies (recorded in its training.json). The finalists are the best `count` sets by mean
screening τ, plus the EAGLE-3 default and the best random control, so the final comparison
always holds the baseline to beat and a set chosen by chance.
"""

from __future__ import annotations

import numpy as np

from tasks.names import EAGLE3_DEFAULT, RANDOM_PREFIX
from tasks.select.selection import Candidate


def screening_tau(final: dict) -> dict:
    """The screening score of one trained head from its final training record (`final` of its
    training.json, as `layerwave train` returns it): τ_offline at the end of its training."""
    tau = final["tau_offline"]
    return {"tau": tau["tau"], "rounds": tau["rounds"], "tau_ci95": tau["tau_ci95"]}


def screening_rows(candidates: list[Candidate], scores: dict[tuple, dict[int, dict]]) -> list[dict]:
    """One row per screened set, best mean τ_offline first; `scores[layers][seed]` as screening_tau."""
    rows = []
    for candidate in candidates:
        by_seed = scores.get(tuple(candidate.layers), {})
        if not by_seed:
            continue
        taus = [by_seed[seed]["tau"] for seed in sorted(by_seed)]
        rows.append({"layers": candidate.layers, "method": ",".join(candidate.methods),
                     "tau_offline_mean": float(np.mean(taus)), "tau_offline_per_seed": taus,
                     "seeds": sorted(by_seed), "rounds": sum(s["rounds"] for s in by_seed.values())})
    return sorted(rows, key=lambda row: (-row["tau_offline_mean"], row["layers"]))  # ties: one order everywhere


def finalists(candidates: list[Candidate], ranked: list[dict], count: int) -> list[Candidate]:
    """The top `count` screened sets, then the EAGLE-3 default and the best random set if they
    are not among them; candidates in that order."""
    by_layers = {tuple(c.layers): c for c in candidates}
    chosen = [tuple(row["layers"]) for row in ranked[:count]]
    for wanted in (EAGLE3_DEFAULT, RANDOM_PREFIX):
        best = next((tuple(row["layers"]) for row in ranked
                     if any(m.startswith(wanted) for m in row["method"].split(","))), None)
        if best is not None and best not in chosen:
            chosen.append(best)
    return [by_layers[layers] for layers in chosen]


def with_finalists(candidates: list[Candidate], ranked: list[dict], count: int) -> list[dict]:
    """The screening rows, each marked whether its set went on to the finals (`finalists`)."""
    chosen = {tuple(c.layers) for c in finalists(candidates, ranked, count)}
    return [{**row, "finalist": tuple(row["layers"]) in chosen} for row in ranked]
