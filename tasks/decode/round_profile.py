"""Where a decoding round's time goes, in milliseconds and in plain decoding steps.

A round pays off only when τ exceeds its cost counted in plain steps (one token of Hugging Face
`generate` decoding alone), so the profile states every part in that unit. The plain step is
measured on the same prompts in the same run: generate's seconds from its first new token to its
last, per token between (the prefill left out).
"""

from __future__ import annotations

import time

import torch
from transformers.generation.streamers import BaseStreamer

from tasks.decode.spec_decode import plain_generate
from tasks.decode.stopwatch import Stopwatch, device_sync

OVERHEAD = "tensor and Python overhead"  # round time that no timed part accounts for


class _TokenClock(BaseStreamer):
    """When `generate` hands out each token (the first call carries the prompt)."""

    def __init__(self, device: torch.device):
        self.times: list[float] = []
        self._sync = device_sync(device)

    def put(self, value) -> None:
        self._sync()
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def plain_step_seconds(target, prompts: list[list[int]], max_new_tokens: int, eos_token_id: int | None) -> float:
    """Seconds per token of Hugging Face greedy `generate` after the prefill, over `prompts`: the
    time from its first new token to its last, timed as it hands them out, per token between. The
    quicker of two runs per prompt, so a busy moment lengthens no step; never negative, where a
    difference of two timed runs could be."""
    seconds = tokens = 0.0
    for prompt in prompts:
        steps = []
        for _ in range(2):
            clock = _TokenClock(target.device)
            plain_generate(target, prompt, max_new_tokens, eos_token_id, streamer=clock)
            if len(clock.times) > 2:  # the prompt, the prefill's token, then at least one step
                steps.append((clock.times[-1] - clock.times[1], len(clock.times) - 2))
        if steps:
            best = min(steps, key=lambda step: step[0] / step[1])
            seconds, tokens = seconds + best[0], tokens + best[1]
    return seconds / max(tokens, 1)


def profile_rounds(target, draft: str, decode, prompts: list[list[int]], max_new_tokens: int,
                   eos_token_id: int | None, plain_step: float | None = None) -> dict:
    """Per-part time of the rounds of `decode(prompt, stopwatch)` (a greedy drafting decoder, named
    `draft`: tasks/decode/decoders.py) over `prompts`, against the plain step (measured on the
    same prompts unless a profile of other rounds measured it already)."""
    step = plain_step or plain_step_seconds(target, prompts, max_new_tokens, eos_token_id)
    stopwatch = Stopwatch(target.device)
    for prompt in prompts:
        decode(prompt, stopwatch)
    rounds = max(stopwatch.calls["round"], 1)
    parts = {name: seconds for name, seconds in stopwatch.seconds.items() if name != "round"}
    parts[OVERHEAD] = stopwatch.seconds["round"] - sum(parts.values())
    per_round = stopwatch.seconds["round"] / rounds
    return {"draft": draft, "rounds": rounds,
            "plain_step_ms": 1000 * step, "round_ms": 1000 * per_round, "round_plain_steps": per_round / step,
            "parts": [{"part": name, "ms_per_round": 1000 * seconds / rounds, "plain_steps": seconds / rounds / step}
                      for name, seconds in parts.items()]}


def profile_table(profile: dict) -> str:
    """The profile as aligned text lines."""
    lines = [f"{profile['draft']}: one round {profile['round_ms']:.1f} ms = "
             f"{profile['round_plain_steps']:.2f} plain steps of {profile['plain_step_ms']:.1f} ms "
             f"({profile['rounds']} rounds)"]
    lines += [f"  {row['part']:<28} {row['ms_per_round']:7.2f} ms  {row['plain_steps']:5.2f} steps"
              for row in profile["parts"]]
    return "\n".join(lines)
