"""Reading a model's activations as an xarray Dataset (lazy, dask-backed)."""

from __future__ import annotations

import warnings

import dask.array as da
import xarray as xr
import zarr

from store import paths, schema
from store.access import check_schema, open_dataset, open_group
from store.dtypes import decode
from store.errors import LayerwaveError
from store.verify import extract_command


def open_activations(store: str, model_key: str, *, allow_incomplete: bool = False) -> xr.Dataset:
    """`<model>/activations` as a Dataset with dims (layer, token, hidden), float32 for every
    storage dtype.

    Plain `xr.open_zarr(store, group=f"{model}/activations")` gives the same values (bfloat16 is
    decoded by its codec); this adds the checks, and decodes the raw uint16 bits of stores
    written before that codec.
    """
    check_schema(store)
    group_path = paths.activations(model_key)
    try:
        open_group(store, group_path)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):
        raise LayerwaveError(
            f"no activations for {model_key} in {store}; run `layerwave extract --model {model_key} --store {store}`"
        ) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = open_dataset(store, group_path)
    if not ds.attrs.get("complete") and not allow_incomplete:
        command = (extract_command(store, model_key) if "plan_hash" in ds.attrs else
                   f"layerwave extract --model {model_key} --store {store} with the options that started it")
        raise LayerwaveError(f"activations for {model_key} in {store} are incomplete (an extraction was "
                             f"interrupted); finish them with `{command}`")
    hidden = ds[schema.HIDDEN_STATES]
    if hidden.dtype == "uint16":
        ds[schema.HIDDEN_STATES] = hidden.copy(data=da.map_blocks(decode, hidden.data, dtype="float32"))
    return ds
