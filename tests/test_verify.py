"""`layerwave verify`: a sound store passes; a flipped byte or an interrupted run is named, with
the commands that repair it; the repaired store equals a clean one."""

from __future__ import annotations

import shlex
import shutil

import xarray as xr
import zarr

from flows.cli import main
from flows.extract import extract
from tests.conftest import TINY, extract_options
from tests.test_resume import assert_identical_stores


def run_verify(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["verify", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_verify_finds_a_flipped_byte_and_repair_restores_the_store(tmp_path, corpus, capsys):
    clean, damaged = tmp_path / "clean.zarr", tmp_path / "damaged.zarr"
    options = extract_options(clean, corpus, tokens=600)
    extract(**options)
    shutil.copytree(clean, damaged)
    code, out = run_verify(capsys, "--store", str(clean))
    assert code == 0 and f"{TINY}: sound" in out

    shard_file = damaged / TINY / "activations" / "hidden_states" / "c" / "0" / "1" / "0"
    data = bytearray(shard_file.read_bytes())
    data[len(data) // 3] ^= 0xFF
    shard_file.write_bytes(bytes(data))
    code, out = run_verify(capsys, "--store", str(damaged))
    assert code == 2
    assert "hidden_states shard 1 (tokens 256..511) is unreadable" in out and "--repair" in out
    assert out.strip().splitlines()[-1].startswith("layerwave: error: store")

    code, out = run_verify(capsys, "--store", str(damaged), "--model", TINY, "--repair")
    assert code == 2 and "shards [1] marked for rewriting" in out
    group = zarr.open_group(damaged, path=f"{TINY}/activations", mode="r")
    assert group["shard_committed"][:].tolist() == [True, False, True] and group.attrs["complete"] is False
    assert xr.open_zarr(damaged, group=f"{TINY}/activations").attrs["complete"] is False  # consolidated too
    resumed = extract(**extract_options(damaged, corpus, tokens=600))
    assert resumed["tokens_written"] == 256
    assert run_verify(capsys, "--store", str(damaged))[0] == 0
    assert_identical_stores(str(clean), str(damaged), f"{TINY}/activations")


def test_verify_lists_uncommitted_shards_with_the_command_that_finishes_them(tmp_path, corpus, capsys):
    store = tmp_path / "partial.zarr"
    extract(**extract_options(store, corpus, tokens=600))
    group = zarr.open_group(store, path=f"{TINY}/activations", mode="r+")
    group.attrs["complete"] = False  # killed between the last shard's commit and the final write
    code, out = run_verify(capsys, "--store", str(store))
    assert code == 2 and "every shard is committed but the store was not finalized" in out
    assert f"layerwave extract --model {TINY} --corpus {corpus} --tokens 600" in out
    group["shard_committed"][2] = False
    code, out = run_verify(capsys, "--store", str(store))
    assert code == 2 and "shards [2] are not committed" in out
    assert f"layerwave extract --model {TINY} --corpus {corpus} --tokens 600" in out


def test_verify_finds_damage_in_the_per_token_arrays(tmp_path, corpus, capsys):
    """token_id, doc, position and loss_mask carry a checksum like the hidden states: a flipped
    byte in them is reported, not read as other token ids."""
    store = tmp_path / "tokens.zarr"
    extract(**extract_options(store, corpus, tokens=600))
    chunk = store / TINY / "activations" / "token_id" / "c" / "1"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    code, out = run_verify(capsys, "--store", str(store))
    assert code == 2 and "token_id is unreadable" in out and "--overwrite" in out


def test_the_printed_resume_command_matches_a_run_that_used_default_chunking(tmp_path, corpus):
    from store.verify import extract_command

    store = tmp_path / "defaults.zarr"
    options = extract_options(store, corpus, tokens=300)
    del options["tokens_per_chunk"], options["chunks_per_shard"]
    first = extract(**options)
    command = shlex.split(extract_command(str(store), TINY))[1:]
    assert main(command) == 0  # the explicit chunking it prints is the same plan: nothing to redo
    again = zarr.open_group(store, path=f"{TINY}/activations", mode="r").attrs["plan_hash"]
    assert again == first["plan_hash"]
