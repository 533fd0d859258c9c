"""`--draft auto`: the decoder with the most expected tokens per second on this device.

Every candidate is a number of tokens per round and the seconds a round costs here. First the
head's depth: a chain of depth d emits 1 + p_1 + … + p_d tokens per round, where p_i is the
head's measured chance that draft position i is accepted (every earlier one accepted too: the
offline τ's acceptance per position), in one round of measured seconds; the best ratio gives the
depth D. Then the candidates decode the same calibration prompt, and each contributes the τ it
reaches there and its measured round time: the chain and hybrid at depth D, the tree and the
context's copy (`lookup`, and `lookup 32` copying 32 tokens every round); the target alone emits
one token per plain step. Acceptance of the copy depends on the text, so no offline profile
predicts it, and measuring every candidate on the same prompt keeps the comparison fair (the
offline profile, from the training distribution, runs above real prompts' acceptance). The
choice is the largest ratio (EAGLE-2's idea of letting acceptance shape the draft, driven here
by measured cost), so a head too weak to pay for its rounds decodes with the target alone
instead of slowing it down.
"""

from __future__ import annotations

from store.artefacts import location, read_json
from store.errors import LayerwaveError
from tasks.decode.round_profile import plain_step_seconds
from tasks.decode.spec_decode import HeadDrafter, speculative_generate
from tasks.decode.stopwatch import Stopwatch

CALIBRATION_ROUNDS = 12  # rounds timed per chain depth
# The copy also runs at this fixed length: on text that loops (Gemma-3's replies) it beats a copy
# whose length follows acceptance (benchmarks/README.md, lookup_rules.py).
LONG_COPY_TOKENS = 32
TARGET = "target"  # the candidate that decodes with the target alone


def recorded_acceptance(head_dir: str) -> list[float] | None:
    """Acceptance per draft position that training measured offline (training.json), if any."""
    path = location(head_dir) / "training.json"
    if not path.is_file():
        return None
    tau_offline = (read_json(path).get("final") or {}).get("tau_offline") or {}
    return tau_offline.get("per_position")


def expected_tokens(per_position: list[float], depth: int) -> float:
    """Tokens per round of a depth-`depth` chain: the bonus token plus each accepted position."""
    return 1.0 + sum(per_position[:depth])


def round_seconds(target, head, prompt: list[int], depth: int, eos_token_id: int | None) -> float:
    """Measured seconds per greedy chain round at `depth` on `prompt`, on the target's device."""
    return measured_candidate(lambda tokens, stopwatch: speculative_generate(
        target, head.config.layers, HeadDrafter(head), tokens, CALIBRATION_ROUNDS + 1, depth, None,
        stopwatch=stopwatch), prompt, target.device)[1]


def label(candidate: str) -> str:
    return "target alone" if candidate == TARGET else candidate


def choose(candidates: dict[str, tuple[float, float]]) -> dict:
    """The candidate with the most expected tokens per second, from (tokens per round, seconds per
    round) of each (`TARGET` among them), and a line that says why. A candidate that ran no
    round (the calibration reply ended in the prefill) has no rate; with no other, the target alone."""
    rates = {name: tokens / seconds for name, (tokens, seconds) in candidates.items() if seconds > 0}
    if TARGET not in rates or len(rates) == 1:
        return {"choice": TARGET, "expected_speedup": 1.0, "expected_tokens_per_s": rates,
                "why": f"{label(TARGET)}: the calibration prompt's reply ends before a round can be timed "
                       "(nothing to draft; a larger --max-new-tokens measures the decoders)",
                "candidates": per_round(candidates)}
    best = max(rates, key=rates.get)
    others = ", ".join(f"{label(name)} {rate:.1f}" for name, rate in sorted(rates.items(), key=lambda kv: -kv[1])
                       if name != best)
    return {"choice": best, "expected_speedup": rates[best] / rates[TARGET], "expected_tokens_per_s": rates,
            "why": f"{label(best)}: {rates[best]:.1f} tokens/s expected ({others})",
            "candidates": per_round(candidates)}


def per_round(candidates: dict[str, tuple[float, float]]) -> dict:
    """Candidates' (tokens, seconds) per round, named for the JSON record."""
    return {name: {"tokens_per_round": tokens, "seconds_per_round": seconds}
            for name, (tokens, seconds) in candidates.items()}


def chain_candidates(target, head, prompt: list[int], per_position: list[float], eos: int | None) -> dict:
    """Each chain depth the acceptance profile covers: its expected tokens per round and its
    round time on `prompt`. One untimed pass first (the first rounds pay for allocation and
    kernel selection), then the depths timed up and down again, so slow drift of the machine
    weighs on every depth alike."""
    depths = list(range(1, len(per_position) + 1))
    round_seconds(target, head, prompt, depths[-1], eos)
    seconds = {depth: 0.0 for depth in depths}
    for depth in depths + depths[::-1]:
        seconds[depth] += round_seconds(target, head, prompt, depth, eos) / 2
    return {f"chain {depth}": (expected_tokens(per_position, depth), seconds[depth]) for depth in depths}


def measured_candidate(decode, prompt: list[int], device) -> tuple[float, float]:
    """(τ, seconds per round) of `decode(prompt, stopwatch)` on `prompt`."""
    stopwatch = Stopwatch(device)
    generation = decode(prompt, stopwatch)
    return generation.tau, stopwatch.seconds["round"] / max(stopwatch.calls["round"], 1)


def auto_plan(target, head, prompt: list[int], per_position: list[float], eos: int | None, max_new_tokens: int,
              decoder_of) -> dict:
    """The head's depth D from its acceptance profile, then every candidate measured on `prompt`
    (`decoder_of(name)`: decode(prompt, stopwatch) of chain D, hybrid D, tree and lookup), then
    the choice."""
    chains = chain_candidates(target, head, prompt, per_position, eos)
    depth = max(chains, key=lambda name: chains[name][0] / chains[name][1] if chains[name][1] > 0 else 0).split()[1]
    candidates = {TARGET: (1.0, plain_step_seconds(target, [prompt], max_new_tokens, eos))}
    candidates |= {name: measured_candidate(decoder_of(name), prompt, target.device)
                   for name in (f"chain {depth}", f"hybrid {depth}", "tree", "lookup", f"lookup {LONG_COPY_TOKENS}")}
    return {**choose(candidates), "per_position": per_position, "chain_depths": per_round(chains)}


def acceptance_profile(head_dir: str, measure=None) -> tuple[list[float], str]:
    """The acceptance per position to plan with, and where it came from: training's record, else
    `measure()` (offline, on the store the head was trained on); one line when neither exists."""
    recorded = recorded_acceptance(head_dir)
    if recorded:
        return recorded, "training.json"
    if measure is not None:
        return measure(), "measured offline"
    raise LayerwaveError(f"--draft auto needs head {head_dir}'s acceptance per draft position, and its "
                         "training.json records none: pass --store with the store it was trained on (extracted from "
                         "a regen: corpus) to measure it offline, or retrain the head with this layerwave")
