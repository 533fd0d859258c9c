"""Speculative decoding: lossless greedy output, τ = depth + 1 with an oracle draft, edges, bad input."""

from __future__ import annotations

import json

import torch

from flows.cli import main
from tasks.decode.spec_decode import HeadDrafter, accept_sampled, plain_generate, speculative_generate
from tasks.heads.draft_head import DraftHead
from tasks.heads.export_head import export
from tests.conftest import LAYERS, TINY

LENGTHS = (5, 23, 61)  # prompts of different lengths


def prompts(tiny) -> list[list[int]]:
    rng = torch.Generator().manual_seed(0)
    return [torch.randint(100, 40000, (n,), generator=rng).tolist() for n in LENGTHS]


def untrained_like(head: DraftHead) -> DraftHead:
    torch.manual_seed(1)
    fresh = DraftHead(head.config)
    fresh.load_state_dict({k: v for k, v in head.state_dict().items() if k in ("embed_tokens.weight", "d2t", "t2d")},
                          strict=False)
    return fresh


class OracleDrafter:
    """Proposes the target's own greedy continuation: every draft is accepted."""

    drafts_trees = False

    def __init__(self, target, prompt):
        self.target, self.context = target, list(prompt[:1])

    def observe(self, aux, next_tokens):
        self.context += next_tokens.tolist()

    def propose(self, depth, temperature=0.0, generator=None):
        return plain_generate(self.target, self.context, depth, None).tokens, []


def kept_tokens_per_forward(generation) -> float:
    """Tokens after the prefill's per verification forward; with no round at all, the target's own 1."""
    return (len(generation.tokens) - 1) / generation.forwards if generation.forwards else 1.0


def test_eos_and_token_budget_edges(tiny, trained):
    head = trained[0]
    prompt = prompts(tiny)[1]
    reference = plain_generate(tiny.model, prompt, 30, None).tokens
    eos = reference[6]  # pretend this token ends the turn
    stop_at = reference.index(eos)
    for depth in (1, 3, 8):
        spec = speculative_generate(tiny.model, LAYERS, HeadDrafter(head), prompt, 30, depth, eos)
        assert spec.tokens == reference[: stop_at + 1] == plain_generate(tiny.model, prompt, 30, eos).tokens
        assert spec.tau == kept_tokens_per_forward(spec)  # nothing past EOS counts
        for budget in (1, 2, 5):
            short = speculative_generate(tiny.model, LAYERS, HeadDrafter(head), prompt, budget, depth, None)
            assert short.tokens == reference[:budget]
            assert short.tau == kept_tokens_per_forward(short)  # nothing past the budget counts


def test_an_oracle_draft_gives_tau_depth_plus_one(tiny):
    depth, rounds = 3, 5
    prompt = prompts(tiny)[0]
    spec = speculative_generate(tiny.model, LAYERS, OracleDrafter(tiny.model, prompt), prompt,
                                1 + rounds * (depth + 1), depth, None)
    assert spec.accepted == [depth] * rounds
    assert spec.tau == depth + 1


def test_evaluate_cli_reports_tau_speedup_and_lossless(trained, tmp_path, tiny, capsys):
    head_dir = export(trained[0], tmp_path / "head", "vllm", verifier=TINY)
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--model", TINY, "--head", str(head_dir), "--bench", "mt-bench", "--limit", "2",
                 "--max-new-tokens", "12", "--depth", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"tau", "speedup", "lossless", "per_position", "tokens_per_s", "baseline_tokens_per_s"} <= result.keys()
    assert result["lossless"] is True and result["prompts"] == 2 and len(result["per_position"]) == 3
    assert result["device"] == "cpu"  # auto, on a machine without CUDA
    assert 1.0 <= result["tau"] <= 4.0

    def refused(argv, expected):
        capsys.readouterr()
        assert main(["evaluate", "--model", TINY, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err
    refused(["--head", str(head_dir), "--max-new-tokens", "0"], "--max-new-tokens must be at least 1")
    refused(["--head", str(head_dir), "--max-new-tokens", "5000"], "exceeds the model's context of 2048")
    refused(["--head", str(tmp_path)], "has no config.json")
    refused(["--head", str(head_dir), "--depth", "0"], "--depth must be at least 1")
    refused(["--head", str(head_dir), "--bench", "wiki"], "unknown --bench 'wiki'")
    refused(["--head", str(head_dir), "--device", "tpu"], "unknown --device 'tpu'; use auto, cpu or cuda")
    other = json.loads((head_dir / "config.json").read_text())
    other["layerwave"]["draft_config"]["layers"] = [2, 4, 12]
    other["eagle_aux_hidden_state_layer_ids"] = [2, 4, 12]
    (head_dir / "config.json").write_text(json.dumps(other))
    refused(["--head", str(head_dir)], "reads layers [2, 4, 12]; tiny-random-llama has HF indices 0..8")


def test_rejection_sampling_preserves_the_target_distribution():
    """Chi-square on a 5-token vocabulary: the first emitted token follows p, whatever q drafts."""
    p = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05], [0.1, 0.1, 0.2, 0.3, 0.3], [0.2] * 5])
    q = [torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4]), torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1])]
    generator = torch.Generator().manual_seed(1234)
    trials, counts, accepted_first = 20000, torch.zeros(5), 0
    for _ in range(trials):
        drafts = [int(torch.multinomial(q[0], 1, generator=generator)), int(torch.multinomial(q[1], 1, generator=generator))]
        emitted = accept_sampled(p, q, drafts, generator)
        counts[emitted[0]] += 1
        accepted_first += emitted[0] == drafts[0] and len(emitted) > 1
    expected = p[0] * trials
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 18.47, (chi_square, counts)  # df = 4, p = 0.001
    assert 0 < accepted_first < trials  # both branches exercised


def test_sampling_decoding_runs_and_is_reproducible(tiny, trained):
    prompt = prompts(tiny)[2]
    runs = [speculative_generate(tiny.model, LAYERS, HeadDrafter(trained[0]), prompt, 20, 3, None, temperature=0.8,
                                 generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 20
