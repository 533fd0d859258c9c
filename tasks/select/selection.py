"""Candidate layer sets: informative (entropy) and non-redundant (CKA), beside the baselines.

Pure numpy on the small analysis arrays; the only expensive call, the exact α=1 entropy of a
concatenated set, is passed in (it reads covariance blocks from the store).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Callable

import numpy as np

from store.errors import LayerwaveError
from tasks.names import EAGLE3_DEFAULT, RANDOM_PREFIX
from tasks.select.layer_ids import eagle3_default
from tasks.stats.measures import h2_closed_form

METHODS = ("entropy-topk", "aggregate-entropy", "cka-mrmr", "cka-logdet")
BASELINES = (EAGLE3_DEFAULT, "even", "last-k", "random")
EXHAUSTIVE_LIMIT = 200_000  # subsets scored exhaustively; beyond this, beam search
SHORTLIST = 16  # best closed-form H2 sets re-ranked by exact H1


@dataclass(frozen=True)
class Constraints:
    """k layers from `low..high` (HF indices, inclusive) at least `min_gap` apart."""

    k: int = 3
    low: int = 1
    high: int | None = None  # default N - 1: excludes the post-norm last state
    min_gap: int = 1

    def allowed(self, n_layers: int) -> list[int]:
        if self.min_gap < 1:
            raise LayerwaveError(f"--min-gap must be at least 1 (got {self.min_gap}): layers of a set differ")
        high = n_layers - 2 if self.high is None else self.high
        if not 0 <= self.low <= high < n_layers:
            raise LayerwaveError(f"allowed layers {self.low}..{high} are not within the store's 0..{n_layers - 1}")
        layers = list(range(self.low, high + 1))
        span = (self.k - 1) * self.min_gap + 1
        if self.k < 1 or span > len(layers):
            raise LayerwaveError(f"k={self.k} layers at least {self.min_gap} apart do not fit in layers "
                                 f"{self.low}..{high} ({len(layers)} allowed); lower --k or --min-gap")
        return layers

    def valid(self, layers) -> bool:
        return all(b - a >= self.min_gap for a, b in zip(layers, layers[1:]))


@dataclass
class LayerScores:
    """Per-layer measures of one token filter (from `<model>/analysis/<filter>`)."""

    h1: np.ndarray
    h2: np.ndarray
    normalized: np.ndarray
    cka: np.ndarray

    @classmethod
    def from_dataset(cls, ds) -> "LayerScores":
        return cls(ds.entropy_h1.values, ds.entropy_h2.values, ds.normalized_entropy.values, ds.cka.values)


@dataclass
class Candidate:
    layers: list[int]
    methods: list[str] = field(default_factory=list)
    scores: dict = field(default_factory=dict)


def h2_sets(scores: LayerScores, subsets: np.ndarray) -> np.ndarray:
    return h2_closed_form(scores.cka, scores.h2, subsets)


def feasible_subsets(c: Constraints, n_layers: int) -> np.ndarray | None:
    """All valid k-subsets, or None when there are too many to enumerate."""
    allowed = c.allowed(n_layers)
    count = np.prod([len(allowed) - i for i in range(c.k)]) / np.prod(range(1, c.k + 1))
    if count > EXHAUSTIVE_LIMIT:
        return None
    subsets = [s for s in combinations(allowed, c.k) if c.valid(s)]
    return np.asarray(subsets, dtype=np.int64).reshape(-1, c.k)


def _greedy(c: Constraints, n_layers: int, gain: Callable[[list[int], int], float]) -> list[int]:
    chosen: list[int] = []
    allowed = c.allowed(n_layers)
    while len(chosen) < c.k:
        options = [layer for layer in allowed if layer not in chosen and c.valid(sorted(chosen + [layer]))]
        if not options:
            raise LayerwaveError(f"no valid set of {c.k} layers with --min-gap {c.min_gap}; lower it")
        chosen.append(max(options, key=lambda layer: (gain(chosen, layer), -layer)))
    return sorted(chosen)


def entropy_topk(scores: LayerScores, c: Constraints, n_layers: int) -> list[int]:
    """The k most informative single layers (highest H1), respecting the gap."""
    return _greedy(c, n_layers, lambda chosen, layer: scores.h1[layer])


def cka_mrmr(scores: LayerScores, c: Constraints, n_layers: int) -> list[int]:
    """Max relevance (normalised entropy) minus mean CKA to the layers already chosen."""
    def gain(chosen, layer):
        redundancy = np.mean([scores.cka[layer, other] for other in chosen]) if chosen else 0.0
        return scores.normalized[layer] - redundancy
    return _greedy(c, n_layers, gain)


def cka_logdet(scores: LayerScores, c: Constraints, n_layers: int) -> list[int]:
    """DPP MAP: max log det of CKA weighted by entropy quality, diag(q) CKA diag(q)."""
    kernel = scores.cka * np.outer(scores.normalized, scores.normalized)
    subsets = feasible_subsets(c, n_layers)
    if subsets is not None:
        _, logdet = np.linalg.slogdet(kernel[subsets[:, :, None], subsets[:, None, :]])
        return subsets[int(np.argmax(logdet))].tolist()
    return _greedy(c, n_layers, lambda chosen, layer: np.linalg.slogdet(
        kernel[np.ix_(chosen + [layer], chosen + [layer])])[1])


def aggregate_entropy(scores: LayerScores, c: Constraints, n_layers: int,
                      exact_h1: Callable[[list[int]], float]) -> list[int]:
    """Highest entropy of the concatenation: closed-form H2 over all sets (beam search when too
    many), then the best few re-ranked by exact H1."""
    subsets = feasible_subsets(c, n_layers)
    if subsets is None:
        subsets = _beam(scores, c, n_layers)
    h2 = h2_sets(scores, subsets)
    shortlist = subsets[np.argsort(-h2, kind="stable")[:SHORTLIST]]
    return max((s.tolist() for s in shortlist), key=exact_h1)


def _beam(scores: LayerScores, c: Constraints, n_layers: int, width: int = 32) -> np.ndarray:
    beams = [[layer] for layer in c.allowed(n_layers)]
    for _ in range(c.k - 1):
        grown = {tuple(sorted(b + [layer])) for b in beams for layer in c.allowed(n_layers)
                 if layer not in b and c.valid(sorted(b + [layer]))}
        if not grown:
            raise LayerwaveError(f"no valid set of {c.k} layers with --min-gap {c.min_gap}; lower it")
        grown_array = np.asarray(sorted(grown), dtype=np.int64)
        best = np.argsort(-h2_sets(scores, grown_array), kind="stable")[:width]
        beams = [grown_array[i].tolist() for i in best]
    return np.asarray(beams, dtype=np.int64)


def even(c: Constraints, n_layers: int) -> list[int]:
    """Evenly spaced over the allowed range, ends included."""
    allowed = c.allowed(n_layers)
    return sorted({allowed[int(round(i))] for i in np.linspace(0, len(allowed) - 1, c.k)})


def last_k(c: Constraints, n_layers: int) -> list[int]:
    allowed = c.allowed(n_layers)
    return allowed[len(allowed) - 1 - (c.k - 1) * c.min_gap:: c.min_gap][: c.k]


def random_sets(c: Constraints, n_layers: int, seed: int, count: int) -> list[list[int]]:
    """`count` distinct seeded random valid sets."""
    rng = np.random.default_rng(seed)
    allowed, found = c.allowed(n_layers), []
    for _ in range(1000 * max(count, 1)):
        if len(found) == count:
            break
        pick = sorted(rng.choice(allowed, size=c.k, replace=False).tolist())
        if c.valid(pick) and pick not in found:
            found.append(pick)
    return found


def score(scores: LayerScores, layers: list[int], exact_h1: Callable[[list[int]], float]) -> dict:
    index = np.asarray(layers)
    pairs = [scores.cka[a, b] for a, b in combinations(layers, 2)]
    return {"aggregate_h1": float(exact_h1(layers)),
            "aggregate_h2": float(h2_sets(scores, index[None])[0]),
            "mean_entropy": float(scores.h1[index].mean()),
            "mean_pairwise_cka": float(np.mean(pairs)) if pairs else 0.0}


def check_methods(methods) -> None:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise LayerwaveError(f"unknown selection method(s) {unknown}; choose from {', '.join(METHODS)}")


def propose(by_filter: dict[str, LayerScores], reference: str, c: Constraints, methods, exact_h1, seed: int = 0,
            n_random: int = 3) -> list[Candidate]:
    """Every method on every filter's measures, plus the baselines; one entry per distinct set,
    scored on the `reference` filter (so sets from different filters compare on equal terms)."""
    check_methods(methods)
    n_layers = len(by_filter[reference].h1)
    c.allowed(n_layers)
    named: list[tuple[str, list[int]]] = []
    for key, scores in by_filter.items():
        suffix = "" if key == reference else f"@{key}"
        runners = {"entropy-topk": lambda: entropy_topk(scores, c, n_layers),
                   "aggregate-entropy": lambda: aggregate_entropy(scores, c, n_layers, lambda s: exact_h1(key, s)),
                   "cka-mrmr": lambda: cka_mrmr(scores, c, n_layers), "cka-logdet": lambda: cka_logdet(scores, c, n_layers)}
        named += [(method + suffix, runners[method]()) for method in methods]
    default = eagle3_default(n_layers - 1)
    if default and c.k == 3:
        named.append((EAGLE3_DEFAULT, default))
    named += [("even", even(c, n_layers)), ("last-k", last_k(c, n_layers))]
    named += [(f"{RANDOM_PREFIX}{i}", layers) for i, layers in enumerate(random_sets(c, n_layers, seed, n_random))]
    merged: dict[tuple, Candidate] = {}
    for name, layers in named:
        merged.setdefault(tuple(layers), Candidate(list(layers))).methods.append(name)
    for candidate in merged.values():
        candidate.scores = score(by_filter[reference], candidate.layers, lambda s: exact_h1(reference, s))
    return sorted(merged.values(), key=lambda cand: -cand.scores["aggregate_h1"])
