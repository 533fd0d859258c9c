"""Training stores (`extract --layers`): only the hidden states heads read, plus every label, at a
fraction of the disk; xarray sees the real layer indices; a head trained on one equals, bit for
bit, the head trained on an all-layer store of the same tokens; and what such a store cannot
serve is refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from flows.cli import main
from flows.extract import extract
from store.verify import extract_command, verify_model
from tasks.heads.train_head import preset, train
from tests.conftest import LAYERS, TINY, extract_options
from tests.processes import error_line

LAYOUT = {"tokens_per_chunk": 256, "chunks_per_shard": 4}  # the same shards in both, so the same documents


def disk_bytes(store: Path) -> int:
    return sum(path.stat().st_size for path in (store / TINY / "activations" / "hidden_states").rglob("*")
               if path.is_file())


@pytest.fixture(scope="module")
def stores(tmp_path_factory, prefect_api) -> tuple[Path, Path]:
    """(all layers, LAYERS only) over the same 4,000 ShareGPT tokens."""
    folder = tmp_path_factory.mktemp("training-stores")
    every, some = folder / "all.zarr", folder / "some.zarr"
    extract(**extract_options(every, "sharegpt", tokens=4000, **LAYOUT))
    extract(**extract_options(some, "sharegpt", tokens=4000, layers=LAYERS, **LAYOUT))
    return every, some


def test_a_training_store_holds_the_same_states_of_fewer_layers(stores):
    every, some = (xr.open_zarr(store, group=f"{TINY}/activations") for store in stores)
    assert some.layer.values.tolist() == LAYERS and every.sizes["layer"] == 9
    assert some.attrs["extraction"]["layers"] == LAYERS and every.attrs["extraction"]["layers"] == "all"
    np.testing.assert_array_equal(some.hidden_states.values, every.hidden_states.sel(layer=LAYERS).values)
    for labels in ("token_id", "loss_mask", "entropy", "target_topk_ids", "target_topk_logprobs"):
        np.testing.assert_array_equal(some[labels].values, every[labels].values, err_msg=labels)
    assert disk_bytes(stores[1]) < 0.45 * disk_bytes(stores[0])  # 3 of 9 entries (compression varies by layer)
    assert verify_model(str(stores[1]), TINY) == ([], [])
    assert extract_command(str(stores[1]), TINY).endswith(" --layers 2,4,5")  # what `verify` says rewrites it


def test_a_head_trained_on_a_training_store_equals_the_all_layer_stores(stores, tmp_path):
    config = preset("smoke", epochs=1)
    heads = [train(str(store), TINY, [5, 2, 4], tmp_path / store.name, config, log=lambda line: None)[0]
             for store in stores]  # any order of the stored layers
    weights = [head.state_dict() for head in heads]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def refused(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    return error_line(capsys.readouterr().err)


def test_what_a_training_store_cannot_serve_is_one_line(stores, capsys, tmp_path):
    _, some = stores
    new = tmp_path / "new.zarr"
    assert refused(capsys, ["extract", "--model", TINY, "--store", str(new), "--layers", "2,40"]) == (
        f"layerwave: error: layers [40] are not in model {TINY} (it has HF indices 0..8)")
    assert "give them in increasing order" in refused(capsys, ["extract", "--model", TINY, "--store", str(new),
                                                                "--layers", "5,2"])
    assert not new.exists()
    assert refused(capsys, ["train", "--model", TINY, "--store", str(some), "--layers", "2,3,5"]) == (
        f"layerwave: error: store {some} holds only layers [2, 4, 5] of {TINY}, not [3]; read those, or extract "
        "a store with --layers 2,3,4,5")
    assert refused(capsys, ["analyze", "--model", TINY, "--store", str(some)]).endswith(
        "analysis needs every layer: extract into another --store with --layers all")
