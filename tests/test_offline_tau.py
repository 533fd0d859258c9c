"""τ_offline: chain rounds simulated along stored greedy replies equal real greedy decoding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main
from tasks.decode.context_lookup import LOOKUP_TOKENS
from tasks.decode.spec_decode import HeadDrafter, HybridDrafter, LookupDrafter, speculative_generate
from tasks.heads.export_head import load_exported
from tasks.heads.offline_tau import (DRAFTS, Reply, replies_in, simulate_documents, simulate_rounds,
                                     whole_first_reply)
from tasks.heads.train_data import StoreBatches
from tests.conftest import GENERATION, LAYERS, TINY

DEPTH = 4


@pytest.mark.parametrize("drafts", DRAFTS)
def test_simulated_rounds_equal_real_decoding_round_by_round(regen, tiny, drafts):
    """Every held-out first reply: the simulation's tokens per round are real decoding's, exactly,
    for the head's chain, the context's copy and the two as hybrid drafting's tree (a simulation
    that advanced by the accepted count alone, or misaligned drafts, fails here)."""
    store, _, head_dir = regen
    head = load_exported(Path(head_dir))
    data = StoreBatches(store, TINY, LAYERS, seq_len=1, batch_size=1, seed=0, holdout=0.05)
    eos, budget = tiny.tokenizer.eos_token_id, GENERATION["max_new_tokens"]
    documents = [d for _, shard_documents in data.heldout_shards() for d in shard_documents]
    simulated = simulate_documents(head, documents, DEPTH, eos, budget, first_turn_only=True, drafts=drafts)
    compared, multi_token_rounds = 0, 0
    for (_, token_id, _, loss_mask), rounds in zip((d for d in documents if whole_first_reply(d[1], d[3], eos, budget)),
                                                  simulated, strict=True):
        (reply,) = whole_first_reply(token_id, loss_mask, eos, budget)
        prompt = token_id[: reply.start].tolist()
        drafter = {"chain": lambda: HeadDrafter(head), "lookup": lambda: LookupDrafter(prompt[0], tiny.model.config.vocab_size),
                   "hybrid": lambda: HybridDrafter(head, prompt[0])}[drafts]()
        real = speculative_generate(tiny.model, [] if drafts == "lookup" else LAYERS, drafter, prompt, budget,
                                    LOOKUP_TOKENS if drafts == "lookup" else DEPTH, eos)
        assert real.tokens == token_id[reply.start: reply.stop].tolist()
        assert [a + 1 for a in real.accepted] == rounds
        compared += 1
        multi_token_rounds += sum(g > 1 for g in rounds)
    assert compared >= 3 and multi_token_rounds > 0


def test_lookup_copies_the_continuation_of_the_latest_match():
    """Hand-checked: after "5 6 7 … 5 6" the copy is "7 8 2 5", the continuation last time."""
    token_id = np.array([1, 5, 6, 7, 8, 2, 5, 6, 7, 9])
    # the first round (last token 5) finds no earlier "2 5"; the second (last token 6) copies 7 8 …:
    # 7 is right, 8 is not (9)
    assert simulate_rounds([], Reply(6, 10), copied_from=token_id) == [1, 2]
    head = np.ones((2, len(token_id)), dtype=bool)  # a head branch whose drafts are all right
    assert simulate_rounds([head], Reply(6, 10), copied_from=token_id) == [3]  # the longer branch counts


def test_offline_and_heldout_evaluations_agree_through_the_cli(regen, tmp_path):
    store, _, head = regen
    common = ["--model", TINY, "--head", head, "--store", store, "--max-new-tokens", str(GENERATION["max_new_tokens"]),
              "--depth", str(DEPTH)]
    offline, real = tmp_path / "offline.json", tmp_path / "real.json"
    assert main(["evaluate", "--offline", "--first-turn-only", "--limit", "3", *common, "--json", str(offline)]) == 0
    assert main(["evaluate", "--bench", "heldout", "--limit", "3", *common, "--json", str(real)]) == 0
    offline, real = json.loads(offline.read_text()), json.loads(real.read_text())
    assert real["lossless"] is True and offline["replies"] == real["prompts"] == 3
    assert offline["tau"] == pytest.approx(real["tau"], abs=1e-12)
    assert offline["per_position"] == pytest.approx(real["per_position"], abs=1e-12)
    assert offline["tau_ci95"][0] <= offline["tau"] <= offline["tau_ci95"][1]
    copied = tmp_path / "lookup.json"
    assert main(["evaluate", "--offline", "--first-turn-only", "--limit", "3", "--draft", "lookup", *common,
                 "--json", str(copied)]) == 0
    copied = json.loads(copied.read_text())
    assert copied["draft"] == "lookup" and copied["depth"] == LOOKUP_TOKENS and copied["replies"] == 3


def test_training_records_tau_offline_at_each_evaluation(regen):
    record = json.loads((Path(regen[2]) / "training.json").read_text())
    for point in [record["untrained"], *record["history"]]:
        assert point["tau_offline"]["rounds"] > 0 and 1.0 <= point["tau_offline"]["tau"] <= DEPTH + 1
    assert record["final"]["tau_offline"]["tau"] > record["untrained"]["tau_offline"]["tau"]


def test_rounds_stop_at_the_reply_end_and_count_the_bonus():
    matches = np.ones((3, 20), dtype=bool)
    assert simulate_rounds(matches, Reply(2, 12)) == [4, 4, 1]  # 9 tokens after the first, all accepted
    matches[0, 5] = False  # the round whose newest pair is at 5 (last token 6) accepts nothing
    assert simulate_rounds(matches, Reply(2, 12)) == [4, 1, 4]
    token_id = np.array([7, 7, 5, 5, 2, 9, 8, 5, 5, 5])
    mask = np.array([0, 0, 1, 1, 1, 1, 0, 1, 1, 1], dtype=bool)
    assert replies_in(token_id, mask, eos=2, max_new_tokens=None) == [Reply(2, 5), Reply(7, 10)]
    assert replies_in(token_id, mask, eos=2, max_new_tokens=2) == [Reply(2, 4), Reply(7, 9)]
    assert replies_in(token_id, mask, eos=2, max_new_tokens=5, whole_only=True) == [Reply(2, 5)]  # 2nd is cut


def test_offline_bad_input_is_one_line(regen, trained, tmp_path, capsys):
    store, _, head = regen
    from tasks.heads.export_head import export

    other = export(trained[0], tmp_path / "other", "vllm", verifier=TINY)
    (other / "training.json").write_text(json.dumps({"model": "smollm2-135m", "config": {"seed": 0, "holdout": 0.05}}))

    def refused(argv, expected):
        capsys.readouterr()
        assert main(["evaluate", "--model", TINY, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err
    refused(["--offline", "--head", head], "--offline simulates decoding along a store's held-out replies; pass --store")
    refused(["--offline", "--head", str(other), "--store", store], "was trained on smollm2-135m's activations")
    refused(["--offline", "--head", head, "--store", store, "--depth", "0"], "--depth must be at least 1")
    refused(["--offline", "--head", head, "--store", store, "--draft", "tree"],
            "--offline simulates --draft chain, lookup or hybrid (got 'tree')")
    refused(["--offline", "--store", store], "--offline replays the head's own held-out replies: pass --head DIR")
    refused(["--bench", "heldout", "--head", head], "--bench heldout replays a store's held-out documents")
