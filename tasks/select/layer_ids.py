"""Layer ids in the HF hidden_states convention (DESIGN.md): checks and the EAGLE-3 default."""

from __future__ import annotations

from store.errors import LayerwaveError


def eagle3_default(num_hidden_layers: int) -> list[int] | None:
    """[2, N//2, N-3] for a model with N decoder layers; None when those are not 3 distinct layers."""
    n = num_hidden_layers
    layers = [2, n // 2, n - 3]
    return layers if len(set(layers)) == 3 and min(layers) >= 1 else None


def check_layers(layers, n_layers: int, holder: str = "the store") -> list[int]:
    """A layer set must be non-empty, inside `holder`'s 0..n_layers-1, and repeat nothing. It comes
    back in ascending order: vLLM and SGLang hand a head its layers in model order whatever order
    its config lists them, so a head trained on 5,2,4 would read its fc inputs permuted there."""
    layers = [int(layer) for layer in layers]
    if not layers:
        raise LayerwaveError("the layer set is empty; give at least one HF hidden-state index, e.g. 2,15,27")
    outside = [layer for layer in layers if not 0 <= layer < n_layers]
    if outside:
        raise LayerwaveError(f"layers {outside} are not in {holder} (it has HF indices 0..{n_layers - 1})")
    if len(set(layers)) != len(layers):
        raise LayerwaveError(f"layer set {layers} repeats a layer")
    return sorted(layers)


def check_stored(layers: list[int], stored: list[int], store: str, model_key: str) -> None:
    """A head reads only layers its store holds (a training store, `extract --layers`, keeps some)."""
    missing = [layer for layer in layers if layer not in stored]
    if missing:
        union = ",".join(map(str, sorted(set(stored) | set(layers))))
        raise LayerwaveError(f"store {store} holds only layers {stored} of {model_key}, not {missing}; read those, "
                             f"or extract a store with --layers {union}")


def parse_stored_layers(text: str) -> list[int] | None:
    """`extract --layers`: "all" (None: every hidden state, what analysis needs) or a layer list."""
    return None if text.strip() == "all" else parse_layers(text)


def parse_layers(text: str) -> list[int]:
    """"2,15,27" → [2, 15, 27]; an empty entry ("2,,5") is a typo, not a shorter set ("" is the
    empty set, which the checks refuse as such)."""
    if not text.strip():
        return []
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise LayerwaveError(f"{text!r} is not a comma-separated list of layer indices, e.g. 2,15,27") from None
