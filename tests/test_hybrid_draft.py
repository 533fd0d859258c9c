"""Drafting from the context's own n-grams, alone (`lookup`) and beside the head (`hybrid`):
the lookup index, the two-branch tree, greedy output equal to the target's on text that repeats
and text that does not, sampling that keeps the target's distribution, `auto` choosing on
recorded timings, the CLI and its refusals."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from flows.cli import main
from tasks.decode.context_lookup import ContextLookup
from tasks.decode.draft_auto import choose
from tasks.decode.lossless import TieCheck, first_divergence
from tasks.decode.spec_decode import (HybridDrafter, LookupDrafter, accept_sampled, plain_generate,
                                      speculative_generate)
from tasks.decode.tree_decode import DraftTree
from tasks.heads.export_head import export
from tests.conftest import LAYERS, TINY
from tests.test_spec_decode import prompts, untrained_like
from tests.test_tree_decode import chi_square


def test_lookup_continues_the_longest_suffix_at_its_most_recent_occurrence():
    lookup = ContextLookup([1, 2, 3, 9, 2, 3, 7, 8, 5, 1, 2, 3], min_ngram=2, max_ngram=3, max_tokens=8,
                           first_tokens=3)
    assert lookup.propose() == [9, 2, 3]  # "1 2 3" (3 tokens) beats the more recent "2 3"
    lookup.extend([4])
    assert lookup.propose() == []  # "3 4" and "2 3 4" never occurred
    lookup.extend([2, 3])
    assert lookup.propose() == [4, 2, 3]  # "4 2 3" occurred just before: a loop of period 3


def test_a_copys_length_is_twice_what_the_last_one_got_accepted_between_its_bounds():
    lookup = ContextLookup([7, 4, 2, 3, 4, 2, 3], max_tokens=8, first_tokens=3)
    assert lookup.propose() == [4, 2, 3]
    lookup.extend([4, 2, 3, 4])  # the copy accepted whole, and the target's own next token
    assert lookup.length == 8  # twice 3 + 1, at most max_tokens
    assert lookup.propose() == [2, 3, 4, 2, 3, 4, 2, 3]  # the copy runs on into its own drafts
    lookup.extend([2, 9])  # one copied token accepted
    assert lookup.length == 4
    lookup.extend([5])  # no copy proposed: the length stays
    assert lookup.length == 4 and lookup.propose() == []
    fixed = ContextLookup([1, 2, 1, 2], max_tokens=5, first_tokens=5)
    assert fixed.propose() == [1, 2, 1, 2, 1]
    fixed.extend([6])
    assert fixed.length == 5


def test_the_index_built_token_by_token_equals_one_built_at_once():
    tokens = torch.randint(0, 6, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    whole, grown = ContextLookup(tokens), ContextLookup(tokens[:1])
    for token in tokens[1:]:
        grown.extend([token])
    assert grown.follows == whole.follows and grown.propose() == whole.propose() != []


def test_two_chains_share_their_common_prefix_in_one_tree():
    tree = DraftTree.from_chains([[5, 6, 7], [5, 6, 9, 10], []])
    assert tree.tokens == [5, 6, 7, 9, 10] and tree.parents == [-1, 0, 1, 1, 3] and tree.depths == [1, 2, 3, 3, 4]
    assert DraftTree.from_chains([[], []]).tokens == []
    assert DraftTree.from_chains([[4], [3]]).children(-1) == [0, 1]


def looping_prompt(tiny) -> list[int]:
    """A prompt whose last stretch repeats, so lookup matches from the first round."""
    base = prompts(tiny)[0]
    return base + base[-6:] * 3


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_greedy_lookup_and_hybrid_output_equals_the_targets_own(tiny, trained, which):
    head = trained[0] if which == "trained" else untrained_like(trained[0])
    drafted = 0
    for prompt in [*prompts(tiny), looping_prompt(tiny)]:
        base = plain_generate(tiny.model, prompt, 32, None)
        copier = LookupDrafter(prompt[0], tiny.model.config.vocab_size)
        lookup = speculative_generate(tiny.model, [], copier, prompt, 32, 6, None)
        for depth in (1, 4) if which == "trained" else (4,):
            hybrid = speculative_generate(tiny.model, LAYERS, HybridDrafter(head, prompt[0]), prompt, 32, depth, None)
            assert hybrid.tokens == base.tokens and len(hybrid.tokens) == 32
            assert hybrid.forwards == len(hybrid.accepted)
        assert lookup.tokens == base.tokens
        drafted += sum(lookup.accepted)
    assert drafted > 0  # the context's n-grams were accepted somewhere


def test_hybrid_keeps_eos_and_budget_edges(tiny, trained):
    prompt = looping_prompt(tiny)
    reference = plain_generate(tiny.model, prompt, 30, None).tokens
    eos = reference[6]
    spec = speculative_generate(tiny.model, LAYERS, HybridDrafter(trained[0], prompt[0]), prompt, 30, 3, eos)
    assert spec.tokens == reference[: reference.index(eos) + 1]
    for budget in (1, 2, 5):
        short = speculative_generate(tiny.model, LAYERS, HybridDrafter(trained[0], prompt[0]), prompt, budget, 3, None)
        assert short.tokens == reference[:budget]


def test_a_copied_draft_keeps_the_targets_distribution_when_sampling():
    """A lookup draft is one token with certainty (q one-hot): accepted with probability p(d),
    else the token comes from p with d removed; together exactly p (chi-square, df = 4)."""
    p = torch.tensor([[0.3, 0.1, 0.4, 0.1, 0.1], [0.2] * 5])
    generator, trials, counts = torch.Generator().manual_seed(3), 20000, torch.zeros(5)
    for _ in range(trials):
        counts[accept_sampled(p, [torch.eye(5)[2]], [2], generator)[0]] += 1
    assert chi_square(counts, p[0] * trials) < 18.47, counts


def test_sampled_hybrid_runs_and_is_reproducible(tiny, trained):
    prompt = looping_prompt(tiny)
    runs = [speculative_generate(tiny.model, LAYERS, HybridDrafter(trained[0], prompt[0]), prompt, 20, 3, None,
                                 temperature=0.8, generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 20


RECORDED = {  # (tokens per round, seconds per round), as a CPU measured them
    "target": (1.0, 0.070),
    "chain 1": (1.22, 0.090), "chain 2": (1.27, 0.097),
    "tree": (1.57, 0.138), "lookup": (1.43, 0.081), "hybrid": (1.85, 0.100),
}


def test_auto_chooses_the_most_tokens_per_second_and_says_why():
    plan = choose(RECORDED)
    assert plan["choice"] == "hybrid" and plan["expected_speedup"] == pytest.approx(18.5 * 0.070)
    assert "hybrid" in plan["why"] and "hybrid: 18.5 tokens/s" in plan["why"] and "target alone 14.3" in plan["why"]
    slow = {name: (tau, seconds * (3 if name != "target" else 1)) for name, (tau, seconds) in RECORDED.items()}
    assert choose(slow)["choice"] == "target"
    unmeasured = {**RECORDED, "hybrid": (1.0, 0.0), "tree": (1.0, 0.0)}  # no round ran: no rate, not a crash
    assert choose(unmeasured)["choice"] == "lookup"
    ended = {name: (tokens, 0.0) for name, (tokens, _) in RECORDED.items()}  # the reply ended in the prefill
    assert choose(ended)["choice"] == "target" and "ends before a round can be timed" in choose(ended)["why"]


def test_evaluate_cli_with_lookup_and_hybrid(trained, tmp_path, capsys):
    head_dir = export(trained[0], tmp_path / "head", "vllm", verifier=TINY)
    out = tmp_path / "eval.json"
    common = ["evaluate", "--model", TINY, "--bench", "mt-bench", "--limit", "2", "--max-new-tokens", "12"]
    assert main([*common, "--head", str(head_dir), "--draft", "hybrid", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["lossless"] is True and result["draft"] == "hybrid" and 1.0 <= result["tau"]
    assert main([*common, "--draft", "lookup", "--json", str(out)]) == 0  # no head needed
    assert json.loads(out.read_text())["lossless"] is True

    def refused(argv, expected):
        capsys.readouterr()
        assert main([*common, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("layerwave: error:") and expected in err, err
    refused(["--draft", "hybrid"], "--draft hybrid drafts with a head: pass --head DIR, or use --draft lookup")
    refused(["--draft", "chain"], "--draft chain drafts with a head: pass --head DIR, or use --draft lookup")
    refused(["--head", str(head_dir), "--draft", "ngram"], "unknown --draft 'ngram'")


@torch.no_grad()
def test_a_mismatch_is_lossless_only_where_it_begins_at_a_tie_of_the_targets_rounding(tiny):
    """Leaving the target's greedy text for its runner-up where the two are within bfloat16's
    rounding is a tie; for a token far below, or in float32 (ties within 0.001), it is not."""
    prompt = prompts(tiny)[0]
    expected = plain_generate(tiny.model, prompt, 16, None).tokens
    half = copy.deepcopy(tiny.model).to(torch.bfloat16)
    logits = tiny.model(input_ids=torch.tensor([prompt + expected])).logits[0, len(prompt) - 1:-1].float()
    top = logits.topk(2, dim=-1)
    at = int((top.values[:, 0] - top.values[:, 1]).argmin())  # the closest call of the greedy text
    runner_up = expected[:at] + [int(top.indices[at, 1])]
    worst = expected[:at] + [int(logits[at].argmin())]
    assert float(top.values[at, 0] - top.values[at, 1]) < 0.5
    at_tie_half, at_tie_full = TieCheck(half), TieCheck(tiny.model)
    assert at_tie_half(prompt, expected, runner_up) and not at_tie_half(prompt, expected, worst)
    assert not at_tie_full(prompt, expected, worst) and not at_tie_half(prompt, expected, expected)
    assert first_divergence(expected, expected[:5]) == 5 and not at_tie_half(prompt, expected, expected[:5])
