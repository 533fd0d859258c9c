"""The activation store: a Zarr v3 hierarchy with one group per model (see DESIGN.md)."""
