"""The ways to decode a prompt that an evaluation compares, each a `Decoder` over one prompt.

`target` is Hugging Face `generate` alone, the baseline of every speed-up; `prompt-lookup` is
Hugging Face's own head-free speculative decoding, what a user already has. The rest run
layerwave's loop (tasks/decode/spec_decode.py): `lookup` copies from the context without a head,
`chain` and `tree` draft with the head (a fixed-depth chain, an EAGLE-2 tree), `hybrid` verifies
the head's chain and the context's copy together, and `auto` is whichever of these (or the target
alone) the measured acceptance and this device's round cost favour (tasks/decode/draft_auto.py).
"""

from __future__ import annotations

import torch

from tasks.decode.context_lookup import FIRST_COPY_TOKENS, LOOKUP_TOKENS
from tasks.decode.draft_auto import TARGET
from tasks.decode.side_by_side import Decoder
from tasks.decode.spec_decode import HeadDrafter, HybridDrafter, LookupDrafter, plain_generate, speculative_generate
from tasks.decode.stopwatch import NO_STOPWATCH
from tasks.decode.target_choices import wide_products_cheap
from tasks.decode.tree_shape import TreeShape

COMPARED = ("prompt-lookup", "lookup", "chain", "tree", "hybrid", "auto")  # --compare: each beside the target
HEADLESS = ("lookup",)  # decoders that need no head
PROMPT_LOOKUP_TOKENS = 10  # draft tokens per lookup (the value Hugging Face's documentation uses)


def baseline(target, max_new_tokens: int, eos: int | None, temperature: float) -> Decoder:
    return Decoder("target", lambda prompt: plain_generate(target, prompt, max_new_tokens, eos, temperature))


def drafted(name: str, target, head, *, max_new_tokens: int, depth: int, eos: int | None, temperature: float,
            generator: torch.Generator, tree: TreeShape):
    """decode(prompt, stopwatch) of one of layerwave's drafting decoders: lookup, chain, tree,
    hybrid, or `chain D` / `hybrid D` (at head depth D) / `lookup N` (copies of N tokens) as
    `auto` names them."""
    kind, _, size = name.partition(" ")
    draft_depth = int(size) if size else LOOKUP_TOKENS if kind == "lookup" else depth
    min_ngram = copy_min_ngram(target)
    first = draft_depth if size else FIRST_COPY_TOKENS  # `lookup N`: copies of N tokens

    def decode(prompt: list[int], stopwatch=NO_STOPWATCH):
        if kind == "lookup":
            drafter, layers = LookupDrafter(prompt[0], target.config.vocab_size, draft_depth, min_ngram, first), []
        else:
            drafter = (HybridDrafter(head, prompt[0], stopwatch, min_ngram) if kind == "hybrid"
                       else HeadDrafter(head, stopwatch))
            layers = head.config.layers
        return speculative_generate(target, layers, drafter, prompt, max_new_tokens, draft_depth, eos, temperature,
                                    generator, tree if kind == "tree" else None, stopwatch)
    return decode


def copy_min_ngram(target) -> int:
    """The shortest suffix the context's copy matches: a single token where a wider verify forward
    costs little (CUDA; bfloat16 on a CPU that has it: 17 tokens 1.2 plain steps), so that its
    more frequent, less certain copies pay; two where each verified token costs (float32 on a
    CPU: 5 tokens 1.6 plain steps). Replayed on SmolLM2, the single-token match raised τ by 8%
    and cost more than it brought in float32 (benchmarks/README.md, lookup_rules.py)."""
    return 1 if wide_products_cheap(target.dtype, target.device) else 2


def decoder(name: str, target, head, *, auto_choice: str | None = None, **options) -> Decoder:
    """One named decoder; `auto_choice` is the candidate an `auto_plan` chose."""
    if name == "prompt-lookup":
        return Decoder(name, lambda prompt: plain_generate(target, prompt, options["max_new_tokens"], options["eos"],
                                                           options["temperature"], prompt_lookup=PROMPT_LOOKUP_TOKENS))
    if name == "auto":
        if auto_choice == TARGET:
            return Decoder(name, baseline(target, options["max_new_tokens"], options["eos"],
                                          options["temperature"]).decode)
        return Decoder(name, drafted(auto_choice, target, head, **options))
    return Decoder(name, drafted(name, target, head, **options))


def depth_of(name: str, depth: int, auto_choice: str | None) -> int | None:
    """Draft positions whose acceptance a decoder's summary reports (a head's chain or tree)."""
    kind, _, at_depth = (auto_choice if name == "auto" and auto_choice else name).partition(" ")
    return (int(at_depth) if at_depth else depth) if kind in ("chain", "tree") else None
