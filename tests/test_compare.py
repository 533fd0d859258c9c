"""Decoders side by side: prompt lookup, chain, tree and auto against the target alone; the round
profile; the cost-aware depth."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from flows.cli import main
from tasks.decode.decoders import drafted
from tasks.decode.draft_auto import choose, expected_tokens
from tasks.decode.round_profile import OVERHEAD, profile_rounds
from tasks.decode.side_by_side import Decoder, contention, median_ci95, side_by_side, summarize
from tasks.decode.spec_decode import Generation, accept_greedy, accept_greedy_lazily, plain_generate
from tasks.decode.target_choices import all_rows_at_once
from tasks.decode.tree_shape import TreeShape
from tasks.heads.export_head import load_exported
from tests.conftest import TINY
from tests.test_spec_decode import prompts


def test_prompt_lookup_is_the_targets_output_in_fewer_forwards(tiny):
    """A prompt that repeats itself: Hugging Face prompt lookup copies the repeat, so it emits
    the target's greedy tokens with fewer target forwards than tokens."""
    prompt = prompts(tiny)[0]
    plain = plain_generate(tiny.model, prompt, 24, None)
    repeated = prompt + plain.tokens + prompt
    plain = plain_generate(tiny.model, repeated, 24, None)
    lookup = plain_generate(tiny.model, repeated, 24, None, prompt_lookup=6)
    assert lookup.tokens == plain.tokens and len(plain.tokens) == 24
    assert plain.forwards == 23 and plain.tau == 1.0
    assert lookup.forwards < 23 and lookup.tau == 23 / lookup.forwards > 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # row by row; all rows in one product
def test_lazy_logits_accept_what_the_full_logits_accept(tiny, dtype):
    """Greedy acceptance from the final hidden states, the lm_head's rows computed only where
    cheap, equals acceptance from all rows: whichever draft is first wrong, and when every draft is
    right."""
    hidden = torch.randn(5, tiny.model.config.hidden_size, dtype=dtype)
    lm_head = copy.deepcopy(tiny.model.get_output_embeddings()).to(dtype)
    assert all_rows_at_once(hidden) == (dtype == torch.bfloat16)
    choices = lm_head(hidden).argmax(-1).tolist()
    for drafts in (choices[:4], [choices[0] + 1, *choices[1:4]], [*choices[:2], choices[2] + 1, choices[3]], []):
        assert accept_greedy_lazily(lm_head, hidden[: len(drafts) + 1], drafts) == \
            accept_greedy(lm_head(hidden[: len(drafts) + 1]), drafts)


def test_side_by_side_alternates_the_order_and_reports_the_median_ratio():
    calls = []

    def timed(name, seconds_per_prompt, tokens=lambda n: [1, 2, 3, 4]):
        def decode(prompt):
            calls.append((name, prompt[0]))
            return Generation(tokens=tokens(prompt[0]), forwards=3 if name == "target" else 2,
                              seconds=seconds_per_prompt[prompt[0]])
        return Decoder(name, decode)

    base = timed("target", [1.0, 1.0, 4.0])  # prompt 2: the machine was busy for the baseline only
    fast = timed("fast", [0.5, 0.25, 1.0], tokens=lambda n: [1, 2, 3, 4] if n != 1 else [1, 2, 3, 5])
    rows = side_by_side(base, [fast], [[0], [1], [2]])["fast"]
    assert calls == [("target", 0), ("fast", 0), ("fast", 1), ("target", 1), ("target", 2), ("fast", 2)]
    summary = summarize(rows, depth=None)
    assert summary["speedup"] == 4.0 and summary["speedup_ci95"][0] <= 4.0 <= summary["speedup_ci95"][1]
    assert summary["tau"] == 9 / 6 and summary["lossless"] is False and summary["mismatched_prompts"] == [1]
    assert median_ci95(np.array([2.0])) == (2.0, None)


def test_repeat_times_every_prompt_again_and_keeps_each_sides_median():
    seconds = {"target": iter([1.0, 9.0, 1.2, 2.0, 2.0, 2.0]), "fast": iter([0.5, 0.6, 8.0, 1.0, 1.0, 1.0])}
    calls = []

    def timed(name):
        def decode(prompt):
            calls.append(name)
            return Generation(tokens=[1, 2, 3], forwards=2, seconds=next(seconds[name]))
        return Decoder(name, decode)

    rows = side_by_side(timed("target"), [timed("fast")], [[0], [1]], repeat=3)["fast"]
    assert calls == ["target", "fast", "fast", "target"] * 3  # the order alternates at every timing
    assert [(r["seconds"], r["baseline_seconds"], r["timings"]) for r in rows] == [(0.6, 1.2, 3), (1.0, 2.0, 3)]
    assert summarize(rows, depth=None)["speedup"] == 2.0  # the busy 9 s and 8 s runs moved nothing


def test_auto_picks_the_depth_with_the_most_expected_tokens_per_second():
    assert expected_tokens([0.5, 0.25, 0.1], 2) == 1.75
    def chains(per_position, seconds):
        return {"target": (1.0, 1.0)} | {f"chain {d}": (expected_tokens(per_position, d), s)
                                         for d, s in seconds.items()}
    strong = choose(chains([0.5, 0.25], {1: 1.2, 2: 1.5}))  # 1.25 and 1.17 tokens per step
    assert strong["choice"] == "chain 1" and strong["expected_speedup"] == pytest.approx(1.5 / 1.2)
    weak = choose(chains([0.05, 0.01], {1: 1.3, 2: 1.5}))  # no depth pays for its round
    assert weak["choice"] == "target" and weak["expected_speedup"] == 1.0


def test_the_profile_accounts_for_the_whole_round(tiny, regen):
    head = load_exported(Path(regen[2]))
    for name in ("chain", "tree", "hybrid"):
        decode = drafted(name, tiny.model, head, max_new_tokens=16, depth=3, eos=None, temperature=0.0,
                         generator=None, tree=TreeShape(topk=2, tokens=6))
        profile = profile_rounds(tiny.model, name, decode, prompts(tiny)[:2], 16, None)
        parts = {row["part"]: row["ms_per_round"] for row in profile["parts"]}
        assert profile["rounds"] > 0 and profile["plain_step_ms"] > 0
        assert sum(parts.values()) == pytest.approx(profile["round_ms"])
        assert parts[OVERHEAD] >= 0 and "observe" in parts
        assert {"chain": {"draft step 1", "draft step 3", "verify: target layers"},
                "tree": {"draft tree", "verify: target layers"},
                "hybrid": {"draft step 3", "lookup", "verify: target layers"}}[name] <= parts.keys()


def test_evaluate_compare_runs_every_decoder_losslessly(regen, tmp_path, capsys):
    store, _, head = regen
    out = tmp_path / "compare.json"
    assert main(["evaluate", "--model", TINY, "--head", head, "--bench", "mt-bench", "--limit", "2",
                 "--max-new-tokens", "12", "--depth", "3", "--compare", "--precision", "float32",  # exact identity
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["compare"]) == ["prompt-lookup", "lookup", "chain", "tree", "hybrid", "auto"]
    assert result["lossless"] is True and all(r["lossless"] for r in result["compare"].values())
    assert result["auto"]["source"] == "training.json" and result["auto"]["choice"] in (
        "target", "lookup", "lookup 32", "tree", *(f"{kind} {d}" for kind in ("chain", "hybrid") for d in range(1, 5)))
    assert set(result["auto"]["candidates"]) >= {"target", "lookup", "lookup 32", "tree"}
    for r in result["compare"].values():
        assert r["prompts"] == 2 and r["tau"] >= 1.0 and r["speedup"] > 0
    table = capsys.readouterr().out
    assert "| target alone | 1.00 |" in table and "| prompt-lookup |" in table and "| auto (" in table


def test_auto_without_an_acceptance_profile_is_one_line(trained, tmp_path, capsys):
    from tasks.heads.export_head import export

    bare = export(trained[0], tmp_path / "bare", "vllm", verifier=TINY)  # no training.json
    capsys.readouterr()
    assert main(["evaluate", "--model", TINY, "--head", str(bare), "--draft", "auto", "--limit", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "acceptance per draft position" in err and "--store" in err, err


# Per-prompt (τ, seconds, plain seconds) of real runs, 5 MT-Bench prompts × 64 tokens each: the
# quick start's first evaluation, with `pip install` running beside prompt 2's speculative
# decoding, and its second, on the otherwise idle machine (commit d7ba458, SmolLM2-135M).
BUSY_RUN = [(1.17, 6.66, 5.01), (1.12, 13.33, 4.58), (1.26, 6.16, 5.48), (1.26, 5.91, 5.16), (1.26, 5.52, 4.36)]
IDLE_RUN = [(1.09, 6.18, 4.60), (1.15, 5.94, 4.28), (1.24, 6.08, 4.32), (1.17, 7.24, 4.67), (1.15, 6.07, 4.68)]


def rows_of(timings, tokens: int = 64) -> list[dict]:
    return [{"prompt": i, "tokens": tokens, "forwards": round((tokens - 1) / tau), "seconds": seconds,
             "baseline_tokens": tokens, "baseline_seconds": plain} for i, (tau, seconds, plain) in enumerate(timings)]


def test_the_contention_guard_flags_the_prompts_a_cpu_hog_slowed_in_a_recorded_run():
    recorded = json.loads((Path(__file__).parent / "data" / "contention_hog.json").read_text())
    assert contention(recorded["idle"]) == {"bound": 1.5, "busy_prompts": [], "flagged": False}
    assert contention(recorded["hogged"]) == {"bound": 1.5, "busy_prompts": [1, 2], "flagged": True}
    slowed = [r["baseline_seconds"] for r in recorded["hogged"] if r["prompt"] in (1, 2)]
    assert min(slowed) > 2 * max(r["baseline_seconds"] for r in recorded["idle"])  # the hogs hit those baselines


def test_the_contention_guard_flags_the_prompt_timed_beside_other_work():
    assert contention(rows_of(BUSY_RUN)) == {"bound": 1.5, "busy_prompts": [1], "flagged": True}
    assert contention(rows_of(IDLE_RUN)) == {"bound": 1.5, "busy_prompts": [], "flagged": False}
    baseline_hit = [(tau, seconds, plain * (3 if i == 4 else 1)) for i, (tau, seconds, plain) in enumerate(IDLE_RUN)]
    assert contention(rows_of(baseline_hit))["busy_prompts"] == [4]
