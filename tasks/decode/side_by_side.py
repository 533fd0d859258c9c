"""Decoders run side by side on the same prompts, each against the target decoding alone.

Each prompt's baseline and every decoder run back to back, in an order that alternates from one
prompt to the next, so a moment when another job loads the machine slows both sides of that
prompt's ratio alike. The speed-up is the median of the per-prompt ratios, with a bootstrap 95%
interval over prompts: one disturbed prompt moves neither much.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tasks.decode.spec_decode import Generation
from tasks.progress import rate_eta


@dataclass(frozen=True)
class Decoder:
    name: str
    decode: Callable[[list[int]], Generation]


def side_by_side(baseline: Decoder, decoders: list[Decoder], prompts: list[list[int]],
                 progress: Callable[[str], None] = lambda line: None, repeat: int = 1,
                 tie: Callable[[list[int], list[int], list[int]], bool] | None = None) -> dict[str, list[dict]]:
    """Per decoder, one row per prompt: its generation beside the baseline's on that prompt.
    With `repeat` > 1 every prompt's runs are timed that many times (the order alternating each
    time) and each side keeps its median time, so one disturbed run moves nothing. `tie(prompt,
    baseline tokens, tokens)` says whether an output that differs begins to at a tie of the
    target's rounding (tasks/decode/lossless.py)."""
    rows: dict[str, list[dict]] = {decoder.name: [] for decoder in decoders}
    started = time.perf_counter()
    for number, prompt in enumerate(prompts):
        timings = []
        for time_number in range(repeat):
            forward = (number + time_number) % 2 == 0
            order = [baseline, *decoders] if forward else [*decoders, baseline]
            timings.append({decoder.name: decoder.decode(prompt) for decoder in order})
        runs = timings[0]  # greedy: every repetition generates the same tokens (sampled: the first is kept)
        seconds = {name: float(np.median([t[name].seconds for t in timings])) for name in runs}
        base = runs[baseline.name]
        for decoder in decoders:
            run = runs[decoder.name]
            rows[decoder.name].append({
                "prompt": number, "tokens": len(run.tokens), "forwards": run.forwards, "tau": run.tau,
                "accepted": run.accepted, "seconds": seconds[decoder.name], "baseline_tokens": len(base.tokens),
                "baseline_seconds": seconds[baseline.name], "matches_baseline": run.tokens == base.tokens,
                "tie": run.tokens != base.tokens and tie is not None and tie(prompt, base.tokens, run.tokens),
                "timings": repeat})
        progress(f"prompt {number + 1}/{len(prompts)}: " + ", ".join(
            f"{name} {len(run.tokens) / seconds[name]:.1f} tok/s" for name, run in runs.items())
            + rate_eta(number + 1, len(prompts), time.perf_counter() - started))
    return rows


CONTENTION_BOUND = 1.5  # a prompt whose relative step cost is this far from the run's median ran beside other work


def contention(rows: list[dict], bound: float = CONTENTION_BOUND) -> dict:
    """Prompts timed while something else loaded the machine. Per prompt, the decoder's time per
    target forward (prefill counted as one) over the baseline's time per token, both measured back
    to back on that prompt, so prompt length and context cancel: a round's cost in plain steps.
    A prompt where it lies beyond `bound` times the run's median, or below the median over
    `bound`, had one side slowed by other work (`pip install` beside one prompt: 2.1x). Prompt
    lookup drafts a varying number of tokens per forward, so its cost varies more by itself."""
    cost = np.array([(r["seconds"] / (r["forwards"] + 1)) / (r["baseline_seconds"] / max(r["baseline_tokens"], 1))
                     for r in rows])
    median = np.median(cost)
    busy = [r["prompt"] for r, c in zip(rows, cost) if c > bound * median or c < median / bound]
    return {"bound": bound, "busy_prompts": busy, "flagged": bool(busy)}


def speedup_ratios(rows: list[dict]) -> np.ndarray:
    """Per prompt: the baseline's seconds per token over the decoder's."""
    return np.array([(r["baseline_seconds"] / max(r["baseline_tokens"], 1)) / (r["seconds"] / max(r["tokens"], 1))
                     for r in rows])


def median_ci95(values: np.ndarray, seed: int = 0, resamples: int = 2000) -> tuple[float, list[float] | None]:
    """Median and its bootstrap 95% interval (None from a single value)."""
    if len(values) < 2:
        return float(np.median(values)), None
    picks = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    medians = np.median(values[picks], axis=1)
    return float(np.median(values)), [float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))]


def summarize(rows: list[dict], depth: int | None, sampled: bool = False) -> dict:
    """τ (tokens per target forward after the prefill), acceptance per draft position, tokens/s of
    both sides, the median per-prompt speed-up with its interval, prompts timed on a busy
    machine (`contention`), and losslessness (an output that leaves the target's at a tie of its
    rounding is lossless, and its prompt listed in `tied_prompts`). Sampled
    outputs differ from a sampled baseline by chance, so `lossless` (token-for-token identity) is
    only defined, and checked, for greedy decoding."""
    rounds = [a for row in rows for a in row["accepted"]]
    tokens, baseline_tokens = sum(r["tokens"] for r in rows), sum(r["baseline_tokens"] for r in rows)
    forwards = sum(r["forwards"] for r in rows)
    speedup, interval = median_ci95(speedup_ratios(rows))
    mismatches = [r["prompt"] for r in rows if not r["matches_baseline"] and not r.get("tie")]
    ties = [r["prompt"] for r in rows if r.get("tie")]
    return {"tau": sum(r["tokens"] - 1 for r in rows) / max(forwards, 1),
            "per_position": [float(np.mean([a > i for a in rounds])) if rounds else 0.0 for i in range(depth or 0)],
            "tokens_per_s": tokens / sum(r["seconds"] for r in rows),
            "baseline_tokens_per_s": baseline_tokens / sum(r["baseline_seconds"] for r in rows),
            "speedup": speedup, "speedup_ci95": interval,
            "lossless": None if sampled else not mismatches, "mismatched_prompts": [] if sampled else mismatches,
            "tied_prompts": [] if sampled else ties,
            "prompts": len(rows), "tokens": tokens, "depth": depth, "contention": contention(rows), "rows": rows}
