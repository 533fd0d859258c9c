"""PNG plots of an analysis, written beside the store (never inside it), locally or in an object store.

A figure is drawn only when what it shows changed: each PNG carries a key of its inputs (and of this
module's code), and a file that already has that key is kept. A study rewrites its report after
every head, and its entropy and CKA figures stay the same for the whole run (drawing and encoding
one costs about half a second of CPU).
"""

from __future__ import annotations

import functools
import hashlib
import json
from itertools import cycle
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import xarray as xr  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from store.artefacts import location, write_figure  # noqa: E402
from tasks.report.report import is_default  # noqa: E402
from tasks.select.layer_ids import eagle3_default  # noqa: E402

FILTER_COLORS = ("tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:gray")
KEY_FIELD = "layerwave-key"  # the PNG text field that holds a figure's key
CODE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def drawn_on_change(draw):
    """`draw(*inputs) -> figure` as `plot(*inputs, path=...) -> path`, which writes the figure
    unless `path` already shows these inputs."""
    @functools.wraps(draw)
    def plot(*inputs, path):
        key = hashlib.sha256(json.dumps([CODE, draw.__name__, inputs], default=_plain).encode()).hexdigest()
        if not _drawn_with(path, key):
            figure = draw(*inputs)
            figure.tight_layout()
            write_figure(figure, path, {KEY_FIELD: key})
            plt.close(figure)
        return path
    return plot


def _plain(value):
    """The JSON form of a figure's inputs beyond plain values."""
    if isinstance(value, xr.Dataset):
        return value.to_dict(data="list")
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"no key for a figure input of type {type(value).__name__}")


def _drawn_with(path, key: str) -> bool:
    """The PNG at `path` carries `key` (its text fields come before the image data)."""
    try:
        with location(path).open("rb") as handle:
            return f"{KEY_FIELD}\x00{key}".encode() in handle.read(4096)
    except FileNotFoundError:
        return False


@drawn_on_change
def plot_entropy_vs_depth(measures: dict[str, xr.Dataset], title: str):
    figure, axis = plt.subplots(figsize=(7, 4))
    for (key, ds), color in zip(measures.items(), cycle(FILTER_COLORS)):  # one color per filter; red is the default's
        axis.plot(ds.layer, ds.entropy_h1, marker="o", ms=3, color=color,
                  label=f"H1, {key} ({ds.attrs['tokens_kept']} tokens)")
        axis.plot(ds.layer, ds.entropy_h2, ls="--", lw=1, color=color, label=f"H2, {key}")
    for i, layer in enumerate(_default_layers(next(iter(measures.values())))):
        axis.axvline(layer, color="tab:red", ls=":", lw=1, label=None if i else "EAGLE-3 default layers")
    axis.set(xlabel="layer (HF hidden_states index)", ylabel="matrix entropy (nats)", title=title)
    _whole_layer_ticks(axis.xaxis)
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    return figure


def _whole_layer_ticks(*layer_axes) -> None:
    """Layers are whole numbers: no tick at 2.5."""
    for layer_axis in layer_axes:
        layer_axis.set_major_locator(MaxNLocator(integer=True))


@drawn_on_change
def plot_cka(ds: xr.Dataset, title: str):
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for axis, name in zip(axes, ("cka", "cka_debiased")):
        image = axis.imshow(ds[name].values, vmin=0, vmax=1, cmap="viridis", origin="lower")
        axis.set(title=f"{name} ({ds.attrs['filter']})", xlabel="layer (HF hidden_states index)",
                 ylabel="layer (HF hidden_states index)")
        _whole_layer_ticks(axis.xaxis, axis.yaxis)
        figure.colorbar(image, ax=axis, fraction=0.046)
        default = _default_layers(ds)
        axis.scatter(*np.meshgrid(default, default), marker="s", s=30, facecolors="none", edgecolors="tab:red")
    figure.suptitle(f"{title}\nred squares: the EAGLE-3 default's layer pairs", fontsize=10)
    return figure


@drawn_on_change
def plot_tau_by_set(rows: list[dict], benches: list[str], title: str):
    """τ per layer set and benchmark: each seed a dot, the mean with its 95% interval a bar, so
    the reader sees how far apart the sets are next to how far apart the seeds are."""
    benches = [b for b in benches if any(r["bench"] == b for r in rows)]
    labels = sorted({str(r["layers"]) for r in rows},  # best on average at the top
                    key=lambda label: np.mean([r["tau_mean"] for r in rows if str(r["layers"]) == label]))
    figure, axes = plt.subplots(1, len(benches), figsize=(max(6.5, 4.5 * len(benches)), 0.35 * len(labels) + 1.9),
                                sharey=True, squeeze=False)
    for axis, bench in zip(axes[0], benches):
        for y, label in enumerate(labels):
            row = next((r for r in rows if r["bench"] == bench and str(r["layers"]) == label), None)
            if row is None:
                continue
            color = "tab:red" if is_default(row) else "tab:blue"
            axis.errorbar(row["tau_mean"], y, xerr=row["tau_ci95"] or 0, fmt="o", color=color, capsize=3)
            axis.scatter(row["tau_per_seed"], [y] * len(row["tau_per_seed"]), s=10, color=color, alpha=0.4)
        axis.set(title=bench, xlabel="τ (tokens per target forward)")
        axis.xaxis.set_major_locator(MaxNLocator(nbins=5))  # close means: keep tick labels apart
        axis.grid(alpha=0.3)
    axes[0][0].set_yticks(range(len(labels)), labels, fontsize=7)
    figure.suptitle(f"{title}\nred: EAGLE-3 default · dots: one seed each · bars: 95% t interval over seeds",
                    fontsize=9)
    return figure


def _default_layers(ds: xr.Dataset) -> list[int]:
    """The EAGLE-3 default of the analysed model: its hidden states are the embeddings and N layers."""
    return eagle3_default(ds.sizes["layer"] - 1) or []
