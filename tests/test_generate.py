"""`layerwave generate`: the target's own replies, sharded, exact tokens, resumable after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from transformers import StoppingCriteriaList

from flows.cli import main
from flows.generate import generate
from store.errors import LayerwaveError
from store.read import open_activations
from tasks.data.corpus import load_corpus
from tasks.data.continuous_batching import generate_continuous
from tasks.data.generate import Heartbeat, generate_batch
from tasks.data.regen_corpus import GeneratedConversation, committed_shards, read_generated, repeated_share
from tasks.decode.spec_decode import plain_generate
from tests.conftest import GENERATION, TINY, saved_checkpoint
from tests.processes import cli_argv, start, wait_until

SMALL = dict(GENERATION, tokens=300, max_new_tokens=12, batch_size=4, shard_size=4)


def test_replies_are_the_targets_own_greedy_tokens(regen, tiny):
    store, corpus, _ = regen
    conversations, records, manifest = read_generated(Path(corpus[6:]))
    assert manifest["complete"] and manifest["tokens"] >= GENERATION["tokens"]
    assert manifest["model"]["key"] == TINY and manifest["source"]["spec"] == "sharegpt"
    assert len(set(records)) == len(records) == len(conversations)
    source = load_corpus("sharegpt")
    first = conversations[0]
    asked = next(m for m in source[records[0]] if m["role"] == "user")
    assert first[0] == asked  # the source's own first user turn
    reply_start = first.loss_mask.index(1)
    prompt, reply = first.token_ids[:reply_start], first.token_ids[reply_start:]
    assert plain_generate(tiny.model, prompt, GENERATION["max_new_tokens"], tiny.tokenizer.eos_token_id).tokens[
        : len(reply)] == reply  # unbatched greedy decoding writes the same reply
    ds = open_activations(store, TINY)
    assert ds.attrs["corpus"]["spec"] == corpus
    stored = ds.token_id.values[ds.doc.values == 0].tolist()
    assert stored == conversations[int(ds.source_record.values[0])].token_ids[: len(stored)]  # tokens kept as written


def test_generation_killed_resumes_to_an_identical_corpus(tmp_path, prefect_api):
    clean = tmp_path / "clean"
    generate(out=str(clean), **SMALL)
    killed = tmp_path / "killed"
    process = start(cli_argv("generate", {**SMALL, "out": killed}), prefect_api)
    wait_until(lambda: len(committed_shards(killed)) >= 2, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    landed = len(committed_shards(killed))
    summary = generate(out=str(killed), **SMALL)
    assert landed < summary["shards"], "the run finished before the kill"
    assert 0 < summary["generated_now"] < summary["tokens"]
    assert sorted(os.listdir(clean)) == sorted(os.listdir(killed))  # no temporary file left behind
    for name in os.listdir(clean):
        assert (clean / name).read_bytes() == (killed / name).read_bytes(), name
    again = generate(out=str(killed), **SMALL)
    assert again["generated_now"] == 0


def test_bad_generation_requests_are_one_line(tmp_path, tiny, prefect_api, capsys):
    def refused(argv, expected):
        capsys.readouterr()
        assert main(["generate", "--model", TINY, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err
    out = ["--out", str(tmp_path / "g")]
    refused([*out, "--max-new-tokens", "0"], "--max-new-tokens must be at least 1 (got 0)")
    refused([*out, "--tokens", "0"], "--tokens must be at least 1")
    refused([*out, "--temperature", "-1"], "--temperature must be >= 0")
    binary = tmp_path / "corpus.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    refused([*out, "--source", f"jsonl:{binary}"], f"corpus file {binary} is not UTF-8 text")
    refused([*out, "--source", f"jsonl:{tmp_path}"], f"corpus file {tmp_path} is a directory")
    refused(["--out", str(binary)], "is a file")
    assert not (tmp_path / "g").exists()

    plain = saved_checkpoint(tiny, tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "plain" / "tokenizer_config.json").write_text(json.dumps(config))
    for template in (tmp_path / "plain").glob("chat_template.*"):
        template.unlink()
    refused(["--model", f"hf:{plain}", "--out", str(tmp_path / "p"), "--tokens", "300"], "has no chat template")

    small = regen_spec(tmp_path, SMALL)
    capsys.readouterr()
    assert main(["extract", "--model", f"hf:{plain}", "--corpus", small, "--store", str(tmp_path / "s.zarr"),
                 "--tokens", "100"]) == 2
    assert "holds tiny-random-llama's own replies" in capsys.readouterr().err
    refused(["--out", small[6:], "--max-new-tokens", "5"], "holds a corpus generated with other settings")
    manifest = Path(small[6:]) / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "complete": False}))
    capsys.readouterr()
    assert main(["extract", "--model", TINY, "--corpus", small, "--store", str(tmp_path / "t.zarr")]) == 2
    assert f"corpus {small} is incomplete" in capsys.readouterr().err
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "complete": True}))
    shard = Path(small[6:]) / "shard-00001.jsonl"
    shard.write_bytes(shard.read_bytes()[:100])
    assert main(["extract", "--model", TINY, "--corpus", small, "--store", str(tmp_path / "t.zarr")]) == 2
    assert f"corpus {small} has a damaged shard, shard-00001.jsonl" in capsys.readouterr().err
    shard.unlink()
    assert main(["extract", "--model", TINY, "--corpus", small, "--store", str(tmp_path / "t.zarr")]) == 2
    assert "holds 1 of its" in capsys.readouterr().err


def test_a_corpus_whose_source_changed_since_is_not_extended_from_the_new_one(tmp_path, prefect_api):
    """The same arguments over an edited prompt file would add shards of other prompts to the
    shards already written: refused, and --overwrite starts anew."""
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"Old prompt number {i}"}) + "\n" for i in range(8)))
    options = dict(SMALL, source=f"jsonl:{source}", tokens=20, out=str(tmp_path / "g"))
    generate(**options)
    before = read_generated(tmp_path / "g")[2]["source"]
    source.write_text("".join(json.dumps({"prompt": f"New prompt number {i}"}) + "\n" for i in range(12)))
    with pytest.raises(LayerwaveError, match="generated with these settings from another source corpus"):
        generate(**{**options, "tokens": 300})
    assert read_generated(tmp_path / "g")[2]["source"] == before
    generate(**{**options, "tokens": 300, "overwrite": True})
    conversations, _, manifest = read_generated(tmp_path / "g")
    assert manifest["source"]["conversations"] == 12
    assert all(conversation[0]["content"].startswith("New") for conversation in conversations)


def regen_spec(tmp_path, options) -> str:
    return generate(out=str(tmp_path / "small"), **options)["corpus"]


def test_continuous_batching_gives_the_replies_of_one_prompt_at_a_time(tiny):
    """Prompts of 3 to 60 tokens through 2 slots: replies end at different steps (the end token is one
    the model writes early in one reply), their slots take the next prompts, the last one runs alone.
    Every reply equals the prompt decoded alone, and so does the padded batch's."""
    prompts = [[(7 * n + 3 * i) % 200 + 1 for i in range(length)] for n, length in enumerate((3, 60, 17, 41, 5))]
    eos = plain_generate(tiny.model, prompts[1], 12, -1).tokens[4]
    alone = [plain_generate(tiny.model, prompt, 12, eos).tokens for prompt in prompts]
    assert len({len(reply) for reply in alone}) > 1
    ended = []
    assert generate_continuous(tiny.model, prompts, 12, eos, 0.0, 2, done=lambda i, reply: ended.append(i)) == alone
    assert sorted(ended) == list(range(len(prompts)))
    assert generate_batch(tiny.model, prompts, 12, eos, eos, 0.0) == alone


def test_a_batch_beats_while_it_generates_and_is_never_stopped_by_it(tiny):
    beats = []
    ids = torch.tensor([[1, 2, 3]])
    out = tiny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                              do_sample=False, stopping_criteria=StoppingCriteriaList([Heartbeat(beats.append, 0.0)]))
    assert out.shape[1] == 3 + 6 and beats == [1, 2, 3, 4, 5, 6]


def test_repeated_share_counts_reply_tokens_that_close_an_earlier_four_gram():
    """Prompt 1 2 3 4, reply 1 2 3 4 5: only the reply's 4 closes a 4-gram (1 2 3 4) seen before."""
    looped = GeneratedConversation([], [1, 2, 3, 4, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 1, 1, 1, 1])
    fresh = GeneratedConversation([], [7, 8, 9, 10, 11, 12], [0, 0, 0, 1, 1, 1])
    assert repeated_share([looped]) == 1 / 5 and repeated_share([looped, fresh]) == 1 / 8
