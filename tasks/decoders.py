"""The ways to decode a prompt that an evaluation compares, each a `Decoder` over one prompt.

`target` is Hugging Face `generate` alone, the baseline of every speed-up; `prompt-lookup` is
Hugging Face's own head-free speculative decoding, what a user already has; `chain`, `tree`
and `auto` are layerwave's head: a fixed-depth chain, an EAGLE-2 tree, and the chain depth (or
the target alone) that the head's acceptance and this device's measured round cost favour.
"""

from __future__ import annotations

import torch

from tasks.draft_auto import choose_depth, round_seconds
from tasks.round_profile import plain_step_seconds
from tasks.side_by_side import Decoder
from tasks.spec_decode import HeadDrafter, plain_generate, speculative_generate
from tasks.tree_decode import TreeShape

DRAFTS = ("chain", "tree", "auto")
COMPARED = ("prompt-lookup", "chain", "tree", "auto")  # --compare: each beside the target alone
PROMPT_LOOKUP_TOKENS = 10  # draft tokens per lookup (the value Hugging Face's documentation uses)


def baseline(target, max_new_tokens: int, eos: int | None, temperature: float) -> Decoder:
    return Decoder("target", lambda prompt: plain_generate(target, prompt, max_new_tokens, eos, temperature))


def auto_plan(target, head, prompt: list[int], per_position: list[float], eos: int | None,
              max_new_tokens: int) -> dict:
    """Measure this device's round cost at every depth the acceptance profile covers and the plain
    step on `prompt`, then choose (tasks/draft_auto.py). One untimed pass first (the first rounds
    pay for allocation and kernel selection), then the depths timed up and down again, so slow
    drift of the machine weighs on every depth alike."""
    depths = list(range(1, len(per_position) + 1))
    round_seconds(target, head, prompt, depths[-1], eos)
    seconds = {depth: 0.0 for depth in depths}
    for depth in depths + depths[::-1]:
        seconds[depth] += round_seconds(target, head, prompt, depth, eos) / 2
    return choose_depth(per_position, seconds, plain_step_seconds(target, [prompt], max_new_tokens, eos))


def decoder(name: str, target, head, *, max_new_tokens: int, depth: int, eos: int | None, temperature: float,
            generator: torch.Generator, tree: TreeShape, auto_depth: int | None = None) -> Decoder:
    """One named decoder; `auto_depth` is the depth an `auto_plan` chose (0: the target alone)."""
    def chain(chain_depth: int, shape: TreeShape | None = None):
        return lambda prompt: speculative_generate(target, head.config.layers, HeadDrafter(head), prompt,
                                                   max_new_tokens, chain_depth, eos, temperature, generator, shape)

    if name == "prompt-lookup":
        return Decoder(name, lambda prompt: plain_generate(target, prompt, max_new_tokens, eos, temperature,
                                                           prompt_lookup=PROMPT_LOOKUP_TOKENS))
    if name == "chain":
        return Decoder(name, chain(depth))
    if name == "tree":
        return Decoder(name, chain(depth, tree))
    if name == "auto":
        return Decoder(name, chain(auto_depth) if auto_depth else baseline(target, max_new_tokens, eos,
                                                                            temperature).decode)
    raise ValueError(f"unknown decoder {name!r}")


def depth_of(name: str, depth: int, auto_depth: int | None) -> int | None:
    """Draft positions whose acceptance a decoder's summary reports."""
    return {"chain": depth, "tree": depth, "auto": auto_depth or None}.get(name)
