"""Every Python block of the README runs, as written, against a store made by the quick start's
own stages (bfloat16 storage, as SmolLM2's), and its hidden states are real float32 values equal
to what `store.read.open_activations` gives."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from flows.analyze import analyze
from flows.extract import extract
from store.read import open_activations
from tests.conftest import TINY, extract_options

README = (Path(__file__).parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def for_the_tiny_model(block: str) -> str:
    """The README speaks of SmolLM2 (N = 30); the tiny model has N = 8, whose default is [2, 4, 5]."""
    return block.replace("smollm2-135m", TINY).replace("[2, 15, 27]", "[2, 4, 5]")


@pytest.fixture(scope="module")
def quick_start_store(tmp_path_factory, corpus, prefect_api) -> Path:
    store = tmp_path_factory.mktemp("readme") / "layerwave.zarr"
    extract(**extract_options(store, corpus, tokens=1200, dtype="bfloat16"))
    analyze(model=TINY, store=str(store), entropy_quantile=0.5, drop_first_token=True, memory_gb=1.0)
    return store


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2 and all("layerwave.zarr" in block for block in BLOCKS)


def test_every_readme_python_block_runs_and_gives_real_values(quick_start_store, monkeypatch, capsys):
    monkeypatch.chdir(quick_start_store.parent)
    namespace: dict = {}
    for number, block in enumerate(BLOCKS):
        exec(compile(for_the_tiny_model(block), f"README.md python block {number}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "[[" in printed  # the states' values, not an error
    ds = namespace["ds"]
    assert ds.hidden_states.dtype == np.float32 and ds.hidden_states.attrs["storage_dtype"] == "bfloat16"
    assert ds.hidden_states.chunks is not None  # lazy, Dask-backed
    checked = open_activations(str(quick_start_store), TINY).hidden_states.values
    np.testing.assert_array_equal(ds.hidden_states.values, checked)
    assert np.isfinite(checked).all() and np.abs(checked).max() < 1e3  # numbers, not raw bit patterns
    assert set(namespace["a"].data_vars) >= {"entropy_h1", "cka"}
