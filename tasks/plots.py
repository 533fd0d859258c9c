"""PNG plots of an analysis, written beside the store (never inside it)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import xarray as xr  # noqa: E402


def reports_dir(store: str, model_key: str) -> Path:
    """`layerwave.zarr` → `layerwave.reports/<model>/`."""
    path = Path(store)
    return path.with_name(path.stem + ".reports") / model_key


def plot_entropy_vs_depth(measures: dict[str, xr.Dataset], path: Path, title: str) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4))
    for key, ds in measures.items():
        axis.plot(ds.layer, ds.entropy_h1, marker="o", ms=3, label=f"H1, {key} ({ds.attrs['tokens_kept']} tokens)")
        axis.plot(ds.layer, ds.entropy_h2, ls="--", lw=1, label=f"H2, {key}")
    axis.set(xlabel="layer (HF hidden_states index)", ylabel="matrix entropy (nats)", title=title)
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    return _save(figure, path)


def plot_cka(ds: xr.Dataset, path: Path, title: str) -> Path:
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for axis, name in zip(axes, ("cka", "cka_debiased")):
        image = axis.imshow(ds[name].values, vmin=0, vmax=1, cmap="viridis", origin="lower")
        axis.set(title=f"{name} ({ds.attrs['filter']})", xlabel="layer", ylabel="layer")
        figure.colorbar(image, ax=axis, fraction=0.046)
    figure.suptitle(title)
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
