"""The ways to decode a prompt that an evaluation compares, each a `Decoder` over one prompt.

`target` is Hugging Face `generate` alone, the baseline of every speed-up; `prompt-lookup` is
Hugging Face's own head-free speculative decoding, what a user already has; `chain`, `tree`
and `auto` are layerwave's head: a fixed-depth chain, an EAGLE-2 tree, and the chain depth (or
the target alone) that the head's acceptance and this device's measured round cost favour.
"""

from __future__ import annotations

import torch

from tasks.decode.side_by_side import Decoder
from tasks.decode.spec_decode import HeadDrafter, plain_generate, speculative_generate
from tasks.decode.tree_shape import TreeShape

COMPARED = ("prompt-lookup", "chain", "tree", "auto")  # --compare: each beside the target alone
PROMPT_LOOKUP_TOKENS = 10  # draft tokens per lookup (the value Hugging Face's documentation uses)


def baseline(target, max_new_tokens: int, eos: int | None, temperature: float) -> Decoder:
    return Decoder("target", lambda prompt: plain_generate(target, prompt, max_new_tokens, eos, temperature))


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
