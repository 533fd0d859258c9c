"""Prefect events layerwave emits, so deployments can react (see deploy/prefect.yaml triggers)."""

from __future__ import annotations

MODEL_ADDED = "layerwave.model.added"


def emit_model_added(name: str) -> bool:
    """Announce a newly registered model; True when the event went to a Prefect API."""
    from prefect.events import emit_event

    event = emit_event(event=MODEL_ADDED, resource={"prefect.resource.id": f"layerwave.model.{name}",
                                                     "prefect.resource.name": name}, payload={"model": name})
    return event is not None
