"""Storage dtypes: bfloat16 kept bit-exactly by its codec and read back as float32 by a plain
xarray in a fresh process, float16 overflow refused, never an inf."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from flows.extract import extract
from store.bfloat16_codec import from_bfloat16_bits, to_bfloat16_bits
from store.dtypes import choose_storage_dtype, decode, encode
from store.errors import LayerwaveError
from store.read import open_activations
from tests.conftest import TINY, extract_options


def test_bfloat16_model_is_stored_losslessly_and_read_as_floats_by_plain_xarray(tmp_path, corpus, tiny):
    store = tmp_path / "bf16.zarr"
    summary = extract(**extract_options(store, corpus, tokens=400, dtype="bfloat16", batch_tokens=1))
    assert summary["storage_dtype"] == "bfloat16"
    meta = json.loads((store / TINY / "activations" / "hidden_states" / "zarr.json").read_text())
    assert meta["data_type"] == "float32" and '"layerwave.bfloat16"' in json.dumps(meta["codecs"])
    ds = open_activations(str(store), TINY)
    first = np.flatnonzero(ds.doc.values == 0)
    model = tiny.model.to(torch.bfloat16)
    try:
        ids = torch.from_numpy(ds.token_id.values[first].astype(np.int64))[None]
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    finally:
        tiny.model.to(torch.float32)
    direct = torch.stack(out.hidden_states)[:, 0].float().numpy()
    np.testing.assert_array_equal(ds.hidden_states.isel(token=first).values, direct)
    saved = tmp_path / "plain.npy"  # a user's own process, which never imports layerwave
    subprocess.run([sys.executable, "-c", "import numpy, xarray\n"
                    f"ds = xarray.open_zarr({str(store)!r}, group='{TINY}/activations')\n"
                    f"numpy.save({str(saved)!r}, ds.hidden_states.isel(token={first.tolist()!r}).values)"],
                   check=True, cwd=tmp_path)
    plain = np.load(saved)
    assert plain.dtype == np.float32
    np.testing.assert_array_equal(plain, direct)


def test_bfloat16_rounds_as_torch_and_old_stores_raw_bits_still_decode():
    values = torch.randn(10000) * torch.logspace(-3, 5, 10000)
    bits = to_bfloat16_bits(values.numpy())
    np.testing.assert_array_equal(bits, values.bfloat16().view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(from_bfloat16_bits(bits), values.bfloat16().float().numpy())
    np.testing.assert_array_equal(decode(bits), values.bfloat16().float().numpy())  # a store written as uint16


def test_float16_overflow_and_nonfinite_values_are_refused():
    with pytest.raises(LayerwaveError, match="beyond float16's range"):
        encode(torch.tensor([1.0, 7e4]), "float16")
    with pytest.raises(LayerwaveError, match="NaN/inf hidden states; try --dtype float32"):
        encode(torch.tensor([1.0, float("inf")]), "bfloat16")


def test_auto_storage_dtype_keeps_headroom():
    assert choose_storage_dtype("auto", torch.float32, 1000.0) == "float16"
    assert choose_storage_dtype("auto", torch.float32, 30000.0) == "bfloat16"
    assert choose_storage_dtype("auto", torch.bfloat16, 1.0) == "bfloat16"
    assert choose_storage_dtype("float32", torch.float32, 1e9) == "float32"
