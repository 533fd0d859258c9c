"""Mistakes a new user makes, met with one line that names the fix (issue 18), never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flows.cli import main
from flows.extract import extract
from tasks.heads.export_head import export
from tests.conftest import TINY, extract_options, saved_checkpoint
from tests.processes import error_line


def refused(capsys, argv: list[str], expected: str) -> str:
    """The command exits 2 and its last stderr line is the one-line error; Prefect's run log may
    come first (without a traceback)."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    line = error_line(err)
    assert expected in line, line
    return line


def corrupt_chunks(store: Path) -> None:
    """Flip bytes at tenths of every hidden-states shard file: the chunks they fall in, of several
    layers in every shard, no longer match their crc32c (whatever shards and layers a command reads)."""
    for shard in (p for p in (store / TINY / "activations" / "hidden_states" / "c").rglob("*") if p.is_file()):
        data = bytearray(shard.read_bytes())
        for tenth in range(1, 10):
            at = len(data) * tenth // 10
            data[at: at + 16] = bytes(255 - b for b in data[at: at + 16])
        shard.write_bytes(bytes(data))


def test_a_damaged_chunk_met_by_train_is_one_line(capsys, tmp_path, training_store):
    store = tmp_path / "damaged.zarr"
    shutil.copytree(training_store, store)
    corrupt_chunks(store)
    line = refused(capsys, ["train", "--model", TINY, "--store", str(store), "--layers", "1,2,3,4,5,6,7", "--preset",
                            "smoke", "--out", str(tmp_path / "head")], f"{TINY}: hidden_states shard ")
    assert "is damaged (its checksum does not match)" in line and f"layerwave verify --store {store} --repair" in line


def test_a_damaged_chunk_met_by_analyze_is_one_line(capsys, tmp_path, corpus):
    store = tmp_path / "damaged.zarr"
    extract(**extract_options(store, corpus, tokens=300))
    corrupt_chunks(store)
    refused(capsys, ["analyze", "--model", TINY, "--store", str(store)], f"{TINY}: hidden_states shard ")


def test_a_truncated_head_is_one_line(capsys, tmp_path, trained):
    head = export(trained[0], tmp_path / "head", "vllm", verifier=TINY)
    weights = head / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    refused(capsys, ["evaluate", "--model", TINY, "--head", str(head), "--limit", "1"], "model.safetensors is unreadable")


def test_an_empty_layer_entry_is_a_typo_not_a_shorter_set(capsys, training_store, tmp_path):
    refused(capsys, ["train", "--model", TINY, "--store", training_store, "--layers", "2,,5",
                     "--out", str(tmp_path / "head")], "'2,,5' is not a comma-separated list of layer indices")


def test_a_prompt_only_corpus_cannot_train_and_a_budget_beyond_the_corpus_is_stated(capsys, caplog, tmp_path):
    store, summary = tmp_path / "prompts.zarr", tmp_path / "summary.json"
    argv = ["extract", "--json", str(summary)]
    for name, value in extract_options(store, "mt-bench", tokens=10**6).items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    capsys.readouterr()
    assert main(argv) == 0
    stated = json.loads(summary.read_text())
    assert stated["tokens_requested"] == 10**6 > stated["n_tokens"] == stated["tokens_written"]
    # the warning reaches the console, or pytest's log capture when an earlier test set up logging
    assert "corpus mt-bench runs out at" in capsys.readouterr().err + caplog.text
    line = refused(capsys, ["train", "--model", TINY, "--store", str(store), "--layers", "2,4,6",
                            "--preset", "smoke", "--out", str(tmp_path / "head")], "no assistant reply to learn from")
    assert "more --tokens" not in line


def test_a_store_of_another_checkpoint_with_the_same_folder_name_is_refused(capsys, tmp_path, tiny, corpus):
    first, second = (saved_checkpoint(tiny, tmp_path / place / "model") for place in ("a", "b"))
    store = tmp_path / "s.zarr"
    extract(**extract_options(store, corpus, tokens=300, model=f"hf:{first}"))
    refused(capsys, ["train", "--model", f"hf:{second}", "--store", str(store), "--layers", "2,4,6",
                     "--out", str(tmp_path / "head")], f"holds activations of hf:{first}, not hf:{second}")

