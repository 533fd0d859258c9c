"""Bad input: one clear line on stderr, exit status 2, and the store exactly as it was."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
import zarr

from flows.cli import main
from flows.extract import extract
from store.errors import LayerwaveError
from store.lock import writer_lock
from store.read import open_activations
from tests.conftest import TINY, extract_options


def snapshot(path: Path) -> dict:
    """Every file under `path` with its content hash (or the file itself, or 'absent')."""
    if not path.exists():
        return {"absent": True}
    if path.is_file():
        return {"file": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def cli(capsys, store, corpus, **overrides) -> tuple[int, str]:
    argv = ["extract"]
    for name, value in extract_options(store, corpus, **{"tokens": 300, **overrides}).items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    capsys.readouterr()  # drop what earlier steps printed
    code = main(argv)
    return code, capsys.readouterr().err.strip()


@pytest.fixture
def finished_store(tmp_path, corpus) -> Path:
    store = tmp_path / "s.zarr"
    extract(**extract_options(store, corpus, tokens=300))
    return store


def assert_refused(capsys, store, corpus, expected: str, *, in_flow: bool = False, **overrides) -> None:
    """Refused with one error line; `in_flow` errors come after Prefect's own run log lines."""
    before = snapshot(store)
    code, err = cli(capsys, store, corpus, **overrides)
    assert code == 2
    lines = err.splitlines()
    assert (len(lines) == 1 or in_flow) and "Traceback" not in err, err
    assert lines[-1].startswith("layerwave: error: ") and expected in lines[-1], err
    assert snapshot(store) == before


@pytest.mark.parametrize("store_kind", ["new", "finished"])
def test_unknown_model(capsys, tmp_path, corpus, finished_store, store_kind):
    store = finished_store if store_kind == "finished" else tmp_path / "new.zarr"
    assert_refused(capsys, store, corpus, "unknown model 'no-such-model'; built-in models: smollm2-135m",
                   model="no-such-model")


def test_path_that_is_no_model(capsys, tmp_path, corpus, finished_store):
    (tmp_path / "not-a-model").mkdir()
    assert_refused(capsys, finished_store, corpus, "is not a Hugging Face checkpoint (no config.json)",
                   model=f"hf:{tmp_path / 'not-a-model'}")


def test_zero_tokens(capsys, finished_store, corpus):
    assert_refused(capsys, finished_store, corpus, "--tokens must be at least 1", tokens=0)


def test_empty_corpus(capsys, tmp_path, finished_store):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert_refused(capsys, finished_store, f"jsonl:{empty}", "has no usable conversations")


def test_unknown_corpus_and_bad_jsonl_line(capsys, tmp_path, finished_store):
    assert_refused(capsys, finished_store, "wikipedia", "unknown corpus 'wikipedia'")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"prompt": "fine"}) + "\n{not json\n")
    assert_refused(capsys, finished_store, f"jsonl:{broken}", "broken.jsonl:2: not valid JSON")


def test_store_path_that_is_a_file(capsys, tmp_path, corpus):
    path = tmp_path / "store.zarr"
    path.write_text("not a store")
    assert_refused(capsys, path, corpus, "is a file, not a Zarr store directory")


def test_store_of_another_schema_version(capsys, tmp_path, corpus):
    store = tmp_path / "old.zarr"
    zarr.open_group(store, mode="w", zarr_format=3).attrs["schema_version"] = 0
    assert_refused(capsys, store, corpus, "has schema_version 0 but this layerwave reads/writes 1")


def test_second_extraction_while_one_runs(capsys, finished_store, corpus):
    with writer_lock(str(finished_store), TINY):
        assert_refused(capsys, finished_store, corpus, "another extraction of tiny-random-llama is writing to",
                       tokens=400)
    with writer_lock(str(finished_store), TINY):  # the lock is free again afterwards
        with pytest.raises(LayerwaveError, match="another extraction"):
            with writer_lock(str(finished_store), TINY):
                pass


def test_other_settings_on_a_finished_store_need_overwrite(capsys, finished_store, corpus):
    assert_refused(capsys, finished_store, corpus, "pass --overwrite to replace them", tokens=400)
    replaced = extract(**extract_options(finished_store, corpus, tokens=400, overwrite=True))
    assert replaced["n_tokens"] == 400 and replaced["committed"] == replaced["n_shards"]


def _nan_model(tmp_path, tiny) -> Path:
    path = tmp_path / "nan-model"
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    state["model.layers.3.mlp.down_proj.weight"][0, 0] = float("nan")
    tiny.model.save_pretrained(path, state_dict=state)
    tiny.tokenizer.save_pretrained(path)
    return path


def test_nan_activations_found_by_the_probe_change_nothing(capsys, tmp_path, tiny, corpus):
    model = f"hf:{_nan_model(tmp_path, tiny)}"
    assert_refused(capsys, tmp_path / "new.zarr", corpus, "NaN/inf hidden states (first at layer 4)", model=model,
                   in_flow=True)


def test_nan_activations_in_a_shard_stop_the_run_and_leave_it_incomplete(tmp_path, tiny, corpus):
    model = f"hf:{_nan_model(tmp_path, tiny)}"
    store = tmp_path / "nan.zarr"
    with pytest.raises(LayerwaveError, match=r"shard 0: .*NaN/inf hidden states \(first at layer 4\)"):
        extract(**extract_options(store, corpus, model=model, tokens=300, storage_dtype="float16"))
    group = zarr.open_group(store, path="hf-nan-model/activations", mode="r", use_consolidated=False)
    assert not group["shard_committed"][:].any() and group.attrs["complete"] is False
    with pytest.raises(LayerwaveError, match="incomplete .* re-run `layerwave extract"):
        open_activations(str(store), "hf-nan-model")


def test_bad_device_dtype_and_storage_dtype(capsys, finished_store, corpus):
    assert_refused(capsys, finished_store, corpus, "unknown --dtype 'float8'", dtype="float8")
    assert_refused(capsys, finished_store, corpus, "unknown --storage-dtype 'int8'", storage_dtype="int8")
    if not torch.cuda.is_available():
        assert_refused(capsys, finished_store, corpus, "asked for CUDA but none is available", device="cuda")
    assert os.path.isdir(finished_store)
