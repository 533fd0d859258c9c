"""Bad input: one clear line on stderr, exit status 2, and the store exactly as it was."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import torch
import zarr
from transformers import LlamaConfig, LlamaForCausalLM

import flows.cli as cli_module
from flows.cli import main
from flows.extract import extract
from store.errors import LayerwaveError, store_writes
from store.lock import writer_lock
from store.read import open_activations
from tasks.heads.export_head import export
from tests.conftest import TINY, extract_options
from tests.processes import cli_argv, error_line, run


def snapshot(path: Path) -> dict:
    """Every file under `path` with its content hash (or the file itself, or 'absent')."""
    if not path.exists():
        return {"absent": True}
    if path.is_file():
        return {"file": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def cli(capsys, store, corpus, *flags, **overrides) -> tuple[int, str]:
    argv = ["extract", *flags]
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
    assert_refused(capsys, store, corpus, "unknown model 'no-such-model'; registered models: gemma3-270m, smollm2-135m",
                   model="no-such-model")


def test_path_that_is_no_model(capsys, tmp_path, corpus, finished_store):
    (tmp_path / "not-a-model").mkdir()
    assert_refused(capsys, finished_store, corpus, "is not a Hugging Face checkpoint (no config.json)",
                   model=f"hf:{tmp_path / 'not-a-model'}")


def test_zero_tokens(capsys, finished_store, corpus):
    assert_refused(capsys, finished_store, corpus, "--tokens must be at least 1", tokens=0)


def test_a_budget_that_holds_no_whole_document_and_a_topk_beyond_the_vocabulary(capsys, tmp_path, corpus):
    """Both are found before the template is written: no store is left behind."""
    store = tmp_path / "new.zarr"
    assert_refused(capsys, store, corpus, "--tokens 5 holds no whole document", tokens=5, in_flow=True)
    assert_refused(capsys, store, corpus, "--topk 60000 is more than", topk=60000, in_flow=True)
    assert not store.exists()


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
    with pytest.raises(LayerwaveError, match=f"incomplete .* finish them with `layerwave extract --model {model} "
                                             f"--corpus {corpus} --tokens 300 "):
        open_activations(str(store), "hf-nan-model")


def test_bad_device_dtype_and_storage_dtype(capsys, finished_store, corpus):
    assert_refused(capsys, finished_store, corpus, "unknown --dtype 'float8'", dtype="float8")
    assert_refused(capsys, finished_store, corpus, "unknown --storage-dtype 'int8'", storage_dtype="int8")
    if not torch.cuda.is_available():
        assert_refused(capsys, finished_store, corpus, "asked for CUDA but none is available", device="cuda")
    assert os.path.isdir(finished_store)


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, tiny, corpus, prefect_api):
    """A user error inside a flow, in a real process (all of stderr, Prefect's log included): one
    line and no traceback; with --debug, Prefect's log keeps the task's traceback and the CLI
    prints its own, and the last line is still the one-line error."""
    argv = cli_argv("extract", extract_options(tmp_path / "new.zarr", corpus, tokens=300,
                                               model=f"hf:{_nan_model(tmp_path, tiny)}"))
    plain, debug = run(argv, prefect_api), run([*argv, "--debug"], prefect_api)
    assert plain.returncode == debug.returncode == 2
    assert "NaN/inf hidden states" in error_line(plain.stderr)
    assert debug.stderr.count("Traceback (most recent call last)") >= 2, debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == error_line(plain.stderr)


def test_debug_before_the_command(capsys, tmp_path):
    capsys.readouterr()
    assert main(["--debug", "verify", "--store", str(tmp_path / "none.zarr")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == f"layerwave: error: no store at {tmp_path / 'none.zarr'}; " \
                                                        "pass the --store (and --model) an extraction wrote"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES])
def test_every_refused_write_becomes_one_clear_error(code):
    """The kinds of refusal test_faults cannot cause here (a full disk, a quota, a read-only
    mount) take the same path as the ones it causes (EFBIG, EACCES); the OSError stays the cause."""
    with pytest.raises(LayerwaveError) as raised:
        with store_writes("s.zarr"):
            raise OSError(code, os.strerror(code))
    assert str(raised.value) == (f"writing to store s.zarr failed: {os.strerror(code)} ({errno.errorcode[code]}); "
                                 "free space on its disk or make it writable, then re-run the same command to "
                                 "resume (committed shards are kept)")
    assert isinstance(raised.value.__cause__, OSError)
    with pytest.raises(FileNotFoundError):  # not a refusal: a bug or a race, keeps its traceback
        with store_writes("s.zarr"):
            raise FileNotFoundError(errno.ENOENT, "gone")


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Anything but a LayerwaveError is a bug: main lets it through (Python prints the traceback)
    and the Prefect log filter keeps it, with or without --debug."""
    def bug(args):
        raise RuntimeError("a bug")
    monkeypatch.setattr(cli_module, "_run_models", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["models"])
    for debug, error, keeps in [(False, RuntimeError("bug"), True), (True, RuntimeError("bug"), True),
                                (False, LayerwaveError("user"), False), (True, LayerwaveError("user"), True)]:
        monkeypatch.setattr(cli_module._NoTracebackForUserErrors, "debug", debug)
        record = logging.LogRecord("prefect", logging.ERROR, __file__, 1, "failed", None, (type(error), error, None))
        assert cli_module._USER_ERROR_FILTER.filter(record) and bool(record.exc_info) is keeps, (debug, error)


def test_a_head_for_another_model_is_refused(capsys, tmp_path, tiny, trained):
    """A head trained on the tiny model (width 64) against a narrower model with the same vocabulary."""
    config = tiny.model.config.to_dict() | {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                            "head_dim": 8}
    narrow = tmp_path / "narrow-model"
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(narrow)
    tiny.tokenizer.save_pretrained(narrow)
    head = export(trained[0], tmp_path / "head", "vllm", verifier=TINY)
    capsys.readouterr()
    assert main(["evaluate", "--model", f"hf:{narrow}", "--head", str(head), "--limit", "1"]) == 2
    vocab = tiny.model.config.vocab_size  # (transformers' weight-loading bar may come before the error)
    assert error_line(capsys.readouterr().err) == (f"layerwave: error: head {head} was trained for a model of "
                                                   f"width 64 and vocabulary {vocab}; hf:{narrow} has 32 and {vocab}")
