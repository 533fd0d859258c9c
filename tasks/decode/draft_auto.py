"""`--draft auto`: the chain depth that maximises expected tokens per second on this device.

A chain of depth d emits 1 + p_1 + … + p_d tokens per round on average, where p_i is the head's
measured chance that draft position i is accepted (every earlier one accepted too: the offline
τ's acceptance per position), and costs one round of measured seconds. Depth 0 is the target
decoding alone, at one token per plain step. The best depth is the largest expected rate
(EAGLE-2's idea of letting acceptance shape the draft, driven here by measured cost), so a head
too weak to pay for its rounds decodes with the target alone instead of slowing it down.
"""

from __future__ import annotations

from store.artefacts import location, read_json
from store.errors import LayerwaveError
from tasks.decode.round_profile import plain_step_seconds
from tasks.decode.spec_decode import HeadDrafter, speculative_generate
from tasks.decode.stopwatch import Stopwatch

CALIBRATION_ROUNDS = 12  # rounds timed per depth


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
    stopwatch = Stopwatch(target.device)
    speculative_generate(target, head.config.layers, HeadDrafter(head), prompt, CALIBRATION_ROUNDS + 1, depth, None,
                         stopwatch=stopwatch)
    return stopwatch.seconds["round"] / max(stopwatch.calls["round"], 1)


def choose_depth(per_position: list[float], seconds_per_round: dict[int, float], plain_step: float) -> dict:
    """The depth (0: the target alone) with the largest expected tokens per second."""
    rates = {0: 1.0 / plain_step} | {d: expected_tokens(per_position, d) / s for d, s in seconds_per_round.items()}
    best = max(rates, key=rates.get)
    return {"depth": best, "expected_tokens_per_s": {str(d): r for d, r in rates.items()},
            "expected_speedup": rates[best] * plain_step, "per_position": per_position,
            "round_seconds": {str(d): s for d, s in seconds_per_round.items()}, "plain_step_seconds": plain_step}


def auto_plan(target, head, prompt: list[int], per_position: list[float], eos: int | None,
              max_new_tokens: int) -> dict:
    """Measure this device's round cost at every depth the acceptance profile covers and the plain
    step on `prompt`, then choose. One untimed pass first (the first rounds
    pay for allocation and kernel selection), then the depths timed up and down again, so slow
    drift of the machine weighs on every depth alike."""
    depths = list(range(1, len(per_position) + 1))
    round_seconds(target, head, prompt, depths[-1], eos)
    seconds = {depth: 0.0 for depth in depths}
    for depth in depths + depths[::-1]:
        seconds[depth] += round_seconds(target, head, prompt, depth, eos) / 2
    return choose_depth(per_position, seconds, plain_step_seconds(target, [prompt], max_new_tokens, eos))


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
