"""EAGLE-2 tree drafting: lossless greedy output, τ = depth + 1 with an oracle hidden in a tree,
no worse than the chain, sampling that keeps the target's distribution, the CLI, bad input."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from flows.cli import main
from tasks.decode.spec_decode import HeadDrafter, aux_states, plain_generate, speculative_generate
from tasks.decode.tree_decode import DraftTree, keep_positions, verify_tree, walk_greedy, walk_sampled
from tasks.decode.tree_shape import TreeShape
from tasks.heads.export_head import export
from tests.conftest import LAYERS, TINY
from tests.test_spec_decode import prompts, untrained_like

SHAPES = (TreeShape(topk=8, tokens=32), TreeShape(topk=3, tokens=7))


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


# The untrained head's drafts are nearly all rejected: a round a token, so fewer tokens give as many rounds.
@pytest.mark.parametrize("which, depth, tokens", [("trained", 1, 24), ("untrained", 4, 12)])
def test_greedy_chain_and_tree_output_equals_the_targets_own(tiny, trained, which, depth, tokens):
    head = trained[0] if which == "trained" else untrained_like(trained[0])
    for prompt in prompts(tiny):
        base = plain_generate(tiny.model, prompt, tokens, None)
        for shape in (None, *SHAPES):  # None: chain drafting
            spec = speculative_generate(tiny.model, LAYERS, HeadDrafter(head), prompt, tokens, depth, None, tree=shape)
            assert spec.tokens == base.tokens and len(spec.tokens) == tokens
            assert spec.forwards == len(spec.accepted) and all(0 <= a <= depth for a in spec.accepted)


def test_tree_eos_and_token_budget_edges(tiny, trained):
    prompt = prompts(tiny)[1]
    reference = plain_generate(tiny.model, prompt, 30, None).tokens
    eos = reference[6]  # pretend this token ends the turn
    for depth in (1, 3, 8):
        spec = speculative_generate(tiny.model, LAYERS, HeadDrafter(trained[0]), prompt, 30, depth, eos,
                                    tree=SHAPES[0])
        assert spec.tokens == reference[: reference.index(eos) + 1] == plain_generate(tiny.model, prompt, 30, eos).tokens
        for budget in (1, 2, 5):
            short = speculative_generate(tiny.model, LAYERS, HeadDrafter(trained[0]), prompt, budget, depth, None,
                                         tree=SHAPES[1])
            assert short.tokens == reference[:budget]


class SecondGuessHead:
    """A stand-in draft head that knows the target's greedy token but, where `misleads(context)`
    says so, ranks a wrong token (the next id) above it: draft probability 0.6 for the first guess, 0.4
    for the second, next to nothing for the rest. It plugs into `HeadDrafter` unchanged; its
    "hidden state" and "cache" are the token context itself, one batch row per tree node."""

    def __init__(self, target, first_token: int, misleads=lambda context: True):
        self.target, self.first, self.misleads = target, first_token, misleads
        self.truths: dict[tuple[int, ...], int] = {}  # the target's greedy next token, by context
        self.vocab = target.config.vocab_size
        self.config = SimpleNamespace(vocab_size=self.vocab, draft_vocab_size=self.vocab)
        self.d2t = torch.zeros(self.vocab, dtype=torch.long)

    def eval(self):
        return self

    def fuse(self, aux):
        return aux

    def decode(self, hidden, input_ids, positions, past):
        context = input_ids if past is None else torch.cat([past[0], input_ids], dim=1)
        return context[:, None, :].expand(-1, input_ids.shape[1], -1), (context, context)

    def logits(self, hidden):
        rows = torch.full((hidden.shape[0], 1, self.vocab), -30.0)
        for row, context in zip(rows, hidden[:, -1]):
            context = [self.first, *context.tolist()]
            if tuple(context) not in self.truths:
                self.truths[tuple(context)] = plain_generate(self.target, context, 1, None).tokens[0]
            truth = self.truths[tuple(context)]
            wrong = (truth + 1) % self.vocab
            row[0, [wrong, truth] if self.misleads(context) else [truth, wrong]] = torch.tensor([0.6, 0.4]).log()
        return rows


def test_a_tree_finds_what_a_misled_chain_misses(tiny):
    """With the target's token always among the head's two likely guesses, a tree keeping both
    guesses at every level (2 + 4 + 8 nodes) accepts `depth` drafts every round, whether or not
    the guess ranked first is right; the chain loses wherever it is wrong (at every other position
here).
    A tree of width one is the chain, round for round. The accepted path is mostly not the first
    child, so the target's cache keeps positions that are not contiguous."""
    depth, rounds = 3, 4
    budget = 1 + rounds * (depth + 1)
    for prompt in prompts(tiny):
        head = SecondGuessHead(tiny.model, prompt[0], misleads=lambda context: len(context) % 2 == 0)

        def drafter():
            return HeadDrafter(head)

        plain = plain_generate(tiny.model, prompt, budget, None).tokens
        chain = speculative_generate(tiny.model, LAYERS, drafter(), prompt, budget, depth, None)
        narrow = speculative_generate(tiny.model, LAYERS, drafter(), prompt, budget, depth, None,
                                      tree=TreeShape(topk=1, tokens=depth))
        tree = speculative_generate(tiny.model, LAYERS, drafter(), prompt, budget, depth, None,
                                    tree=TreeShape(topk=4, tokens=14))
        assert chain.tokens == narrow.tokens == tree.tokens == plain
        assert narrow.accepted == chain.accepted
        assert tree.accepted == [depth] * rounds and tree.tau == depth + 1 > chain.tau


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # lm_head rows one by one; all at once
def test_the_greedy_walk_follows_the_targets_choices_to_its_bonus_token(dtype):
    """Root, then node 1 (token 5), then node 3 (token 2); there the target wants 6, which no
    child (node 4 drafts 7) offers: the bonus. The states make each row's argmax unambiguous."""
    tree = DraftTree(tokens=[3, 5, 1, 2, 7], parents=[-1, -1, 1, 1, 3], depths=[1, 1, 2, 2, 3])
    lm_head = torch.nn.Linear(8, 8, bias=False).to(dtype)
    torch.nn.init.eye_(lm_head.weight)
    wanted = [5, 0, 2, 0, 6, 0]  # the target's choice after the root and after each node
    hidden = 10 * torch.nn.functional.one_hot(torch.tensor(wanted), 8).to(dtype)
    assert walk_greedy(tree, lm_head, hidden) == ([1, 3], 6)


def test_the_tree_walk_samples_exactly_the_targets_distribution():
    """Chi-square on a 5-token vocabulary: root children 3 then 0 (0 has child 2), whatever is
    drafted the first emitted token follows p(root) and the second, after 0, follows p(0)."""
    p = torch.tensor([[0.4, 0.1, 0.1, 0.3, 0.1], [0.2, 0.1, 0.5, 0.1, 0.1], [0.2] * 5, [0.1, 0.6, 0.1, 0.1, 0.1]])
    tree = DraftTree(tokens=[3, 0, 2], parents=[-1, -1, 1], depths=[1, 1, 2])  # rows: root, 3, 0, 0→2
    generator = torch.Generator().manual_seed(1234)
    first, second, trials = torch.zeros(5), torch.zeros(5), 20000
    for _ in range(trials):
        path, bonus = walk_sampled(tree, p[[0, 1, 2, 3]], generator)
        emitted = [tree.tokens[node] for node in path] + [bonus]
        first[emitted[0]] += 1
        if emitted[0] == 0:
            second[emitted[1]] += 1
    assert chi_square(first, p[0] * trials) < 18.47, first  # df = 4, p = 0.001
    assert chi_square(second, p[2] * second.sum()) < 18.47, second


@torch.no_grad()
def test_tree_sampling_on_the_tiny_model_keeps_the_targets_next_token_distribution(tiny):
    """Per context: draft a tree (the target's token is the second child of the root), verify
    it once, then sample many walks of that verification; the first emitted token must follow the
    target's own next-token distribution from a plain forward (top tokens binned, the rest pooled)."""
    temperature, trials = 0.02, 1500  # peaked, so drafted children are often accepted
    accepted = 0
    for number, prompt in enumerate(prompts(tiny)[:2]):
        out = tiny.model(input_ids=torch.tensor([prompt[:-1]]), output_hidden_states=True, use_cache=True)
        drafter = HeadDrafter(SecondGuessHead(tiny.model, prompt[0]))
        drafter.observe(aux_states(out.hidden_states, LAYERS), torch.tensor(prompt[1:]))
        tree = drafter.propose_tree(2, TreeShape(topk=4, tokens=6))
        verified = verify_tree(tiny.model, out.cache, tree, prompt[-1])
        probs = torch.softmax(verified.logits[0].float() / temperature, -1)
        target = torch.softmax(tiny.model(input_ids=torch.tensor([prompt])).logits[0, -1].float() / temperature, -1)
        bins = target.topk(5).indices.tolist()
        generator = torch.Generator().manual_seed(number)
        counts = torch.zeros(6)
        for _ in range(trials):
            path, bonus = walk_sampled(tree, probs, generator)
            token = tree.tokens[path[0]] if path else bonus
            counts[bins.index(token) if token in bins else 5] += 1
            accepted += bool(path)
        expected = torch.cat([target[bins], 1 - target[bins].sum(dim=0, keepdim=True)]) * trials
        assert chi_square(counts, expected) < 20.52, (counts, expected)  # df = 5, p = 0.001
    assert 0 < accepted < 2 * trials  # both the accepting and the residual branch ran


def test_keep_positions_selects_cache_rows(tiny):
    with torch.no_grad():
        cache = tiny.model(input_ids=torch.tensor([prompts(tiny)[0]]), use_cache=True).cache
    before = cache.layers[0].keys.clone()
    keep_positions(cache, torch.tensor([0, 2, 4]))
    assert cache.get_seq_length() == 3 and torch.equal(cache.layers[0].keys, before[:, :, [0, 2, 4]])


def test_tree_sampling_runs_and_is_reproducible(tiny, trained):
    prompt = prompts(tiny)[2]
    runs = [speculative_generate(tiny.model, LAYERS, HeadDrafter(trained[0]), prompt, 20, 3, None, temperature=0.8,
                                 generator=torch.Generator().manual_seed(7), tree=TreeShape()) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 20


def test_evaluate_cli_with_a_tree(trained, tmp_path, capsys):
    head_dir = export(trained[0], tmp_path / "head", "vllm", verifier=TINY)
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--model", TINY, "--head", str(head_dir), "--bench", "mt-bench", "--limit", "2",
                 "--max-new-tokens", "12", "--depth", "3", "--draft", "tree", "--tree-topk", "4",
                 "--tree-tokens", "10", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"tau", "speedup", "lossless", "per_position", "tokens_per_s"} <= result.keys()
    assert result["lossless"] is True and result["prompts"] == 2 and len(result["per_position"]) == 3
    assert (result["draft"], result["tree_topk"], result["tree_tokens"]) == ("tree", 4, 10)
    assert 1.0 <= result["tau"] <= 4.0

    def refused(argv, expected):
        capsys.readouterr()
        assert main(["evaluate", "--model", TINY, "--head", str(head_dir), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("layerwave: error:") and expected in err, err
    refused(["--draft", "foo"], "unknown --draft 'foo'; use chain, tree, lookup, hybrid or auto")
    refused(["--draft", "tree", "--tree-tokens", "0"], "--tree-tokens must be at least 1")
    refused(["--draft", "tree", "--tree-topk", "0"], "--tree-topk must be between 1 and")


def test_greedy_decoding_of_a_sliding_window_target_past_its_window():
    """Gemma-3's sliding-window layers: a tiny random one whose window (6) the prompt and reply
    outgrow; chain and tree rounds (accepted nodes not contiguous) must still give the target's own
    greedy text, so the cache keeps every position and a tree's mask hides what lies past the window."""
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=6,
                              layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=128)
    target = Gemma3ForCausalLM(config).eval()
    depth, budget = 3, 20
    prompt = torch.randint(0, 512, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    head = SecondGuessHead(target, prompt[0], misleads=lambda context: len(context) % 2 == 0)
    plain = plain_generate(target, prompt, budget, None).tokens
    chain = speculative_generate(target, [1, 2, 3], HeadDrafter(head), prompt, budget, depth, None)
    tree = speculative_generate(target, [1, 2, 3], HeadDrafter(head), prompt, budget, depth, None,
                                tree=TreeShape(topk=4, tokens=14))
    assert chain.tokens == tree.tokens == plain
    assert max(tree.accepted) == depth and tree.tau > chain.tau
