"""Stored values equal a direct Hugging Face forward, and the layer convention is pinned."""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from store.read import open_activations
from tasks.data.corpus import load_corpus
from tasks.data.render import render
from tests.conftest import TINY


def _direct_forward(model, ids: np.ndarray):
    with torch.inference_mode():
        out = model(input_ids=torch.from_numpy(ids.astype(np.int64))[None], output_hidden_states=True)
    return out


def _documents(ds):
    """Each document's token positions (padding, doc −1, is none)."""
    doc = ds.doc.values
    return [np.flatnonzero(doc == d) for d in np.unique(doc) if d >= 0]


def test_hidden_states_entropy_and_labels_equal_a_direct_forward(extracted, tiny):
    store, summary = extracted
    ds = open_activations(store, TINY)
    assert summary["committed"] == summary["n_shards"] > 1
    documents = _documents(ds)
    for tokens in documents[:: max(1, len(documents) // 5)]:
        ids = ds.token_id.values[tokens]
        out = _direct_forward(tiny.model, ids)
        assert len(out.hidden_states) == ds.sizes["layer"] == tiny.num_layers + 1
        stored = ds.hidden_states.isel(token=tokens).values.astype(np.float32)
        direct = torch.stack(out.hidden_states)[:, 0].numpy()
        np.testing.assert_allclose(stored, direct, rtol=4e-3, atol=4e-3)  # float16 storage
        logprobs = torch.log_softmax(out.logits[0].float(), -1)
        entropy = -(logprobs.exp() * logprobs).sum(-1).numpy()
        np.testing.assert_allclose(ds.entropy.values[tokens], entropy, rtol=1e-4, atol=1e-4)
        top = logprobs.topk(ds.sizes["topk"], -1)
        np.testing.assert_array_equal(ds.target_topk_ids.values[tokens][:, 0], top.indices[:, 0].numpy())
        np.testing.assert_allclose(ds.target_topk_logprobs.values[tokens], top.values.numpy(), atol=1e-4)


def test_loss_mask_and_tokens_equal_rendering_the_source_conversations(extracted, tiny, corpus):
    store, _ = extracted
    ds = open_activations(store, TINY)
    conversations = load_corpus(corpus)
    for number, tokens in enumerate(_documents(ds)):
        ids, mask = render(tiny.tokenizer, conversations[int(ds.source_record.values[number])])
        n = len(tokens)
        np.testing.assert_array_equal(ds.token_id.values[tokens], ids[:n])
        np.testing.assert_array_equal(ds.loss_mask.values[tokens], mask[:n])
        np.testing.assert_array_equal(ds.position.values[tokens], np.arange(n))
    assert ds.loss_mask.values.any() and not ds.loss_mask.values.all()


def test_layer_index_convention_is_hf_output_hidden_states(extracted, tiny):
    """layer 0 = embedding output; layer N = after the final norm (lm_head of it gives the logits)."""
    store, _ = extracted
    ds = open_activations(store, TINY)
    n = tiny.num_layers
    np.testing.assert_array_equal(ds.layer.values, np.arange(n + 1))
    tokens = _documents(ds)[0]
    ids = torch.from_numpy(ds.token_id.values[tokens].astype(np.int64))
    with torch.inference_mode():
        embedding = tiny.model.model.embed_tokens(ids).numpy()
        last = torch.from_numpy(ds.hidden_states.sel(layer=n).values[tokens].astype(np.float32))
        top1 = tiny.model.lm_head(last).argmax(-1).numpy()
    np.testing.assert_allclose(ds.hidden_states.sel(layer=0).values[tokens], embedding, atol=1e-3)
    agreement = (top1 == ds.target_topk_ids.values[tokens][:, 0]).mean()
    assert agreement > 0.95  # float16 rounding of layer N may flip a near-tie
    assert "layer 0 = embedding output" in ds.attrs["layer_convention"]


def test_xarray_sees_the_schema_through_consolidated_metadata(extracted):
    store, summary = extracted
    ds = xr.open_zarr(store, group=f"{TINY}/activations")  # plain xarray, consolidated metadata
    assert ds.hidden_states.dims == ("layer", "token", "hidden")
    assert ds.attrs["complete"] is True and ds.attrs["schema_version"] == 1
    assert ds.sizes["token"] == summary["n_tokens"] == 1500
    for name in ("token_id", "doc", "position", "entropy", "loss_mask"):
        assert ds[name].dims == ("token",)
    assert ds.target_topk_ids.dims == ("token", "topk")
    assert bool(ds.shard_committed.all())
    selected = ds.hidden_states.sel(layer=[2, 4, 5]).where(ds.entropy > 1.0)
    assert selected.sizes == {"layer": 3, "token": 1500, "hidden": 64}
    chunks = ds.hidden_states.encoding["chunks"]
    assert chunks == (1, 64, 64) and ds.hidden_states.encoding["shards"] == (9, 256, 64)
