"""Storage dtypes: bfloat16 kept bit-exactly as uint16, float16 overflow refused, never an inf."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flows.extract import extract
from store.dtypes import choose_storage_dtype, decode, encode
from store.errors import LayerwaveError
from store.read import open_activations
from tests.conftest import TINY, extract_options


def test_bfloat16_model_is_stored_losslessly(tmp_path, corpus, tiny):
    store = tmp_path / "bf16.zarr"
    summary = extract(**extract_options(store, corpus, tokens=400, dtype="bfloat16", batch_tokens=1))
    assert summary["storage_dtype"] == "bfloat16"
    raw = open_activations(str(store), TINY, decode_bf16=False)
    assert raw.hidden_states.dtype == np.uint16 and raw.hidden_states.attrs["storage_dtype"] == "bfloat16"
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


def test_float16_overflow_and_nonfinite_values_are_refused():
    with pytest.raises(LayerwaveError, match="beyond float16's range"):
        encode(torch.tensor([1.0, 7e4]), "float16")
    with pytest.raises(LayerwaveError, match="NaN/inf hidden states; try --dtype float32"):
        encode(torch.tensor([1.0, float("inf")]), "bfloat16")
    values = torch.tensor([1e5, -3.5, 0.0])
    np.testing.assert_array_equal(decode(encode(values, "bfloat16"), "bfloat16"), values.bfloat16().float().numpy())


def test_auto_storage_dtype_keeps_headroom():
    assert choose_storage_dtype("auto", torch.float32, 1000.0) == "float16"
    assert choose_storage_dtype("auto", torch.float32, 30000.0) == "bfloat16"
    assert choose_storage_dtype("auto", torch.bfloat16, 1.0) == "bfloat16"
    assert choose_storage_dtype("float32", torch.float32, 1e9) == "float32"
