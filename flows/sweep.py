"""The scheduled sweep: the pipeline for every registered model that has no complete result."""

from __future__ import annotations

import importlib.util

from prefect import flow, get_run_logger

from flows.pipeline import pipeline
from store.errors import LayerwaveError
from tasks.data.registry import registry, resolve
from tasks.pipeline_request import RunRequest
from tasks.pipeline_stages import is_complete


def installed_models(logger) -> list[str]:
    """The registered models a sweep runs unasked: not the tests' random one, nor a built-in whose
    package is not installed (it would fail every scheduled run); each left out is said once."""
    names = []
    for name in sorted(registry()):
        spec = resolve(name)
        package = spec.options.get("package")
        if spec.source == "random":
            logger.info("sweep leaves out %s: a random test model", name)
        elif package and importlib.util.find_spec(package) is None:
            logger.info("sweep leaves out %s: not installed (%s)", name, spec.options["install"])
        else:
            names.append(name)
    return names


@flow(name="layerwave-sweep")
def sweep(preset: str = "quick", store: str | None = None, models: list[str] | None = None,
          limit: int | None = None) -> dict:
    """Run the pipeline for every registered model (or those named) without a complete result;
    `limit` caps each model's candidate sets, as `layerwave run --limit` does."""
    logger = get_run_logger()
    names = list(models) if models else installed_models(logger)
    runs = {name: RunRequest(name, preset, store, limit).check() for name in names}  # mistakes fail before any run
    missing = [name for name, run in runs.items() if not is_complete(run.store, run.model_key, preset)]
    if not missing:
        logger.info("nothing to do: every model (%s) has a complete %s result", ", ".join(names), preset)
    failed = []
    for name in missing:  # one model's failure does not stop the others
        logger.info("running the %s pipeline for %s", preset, name)
        if pipeline(model=name, preset=preset, store=runs[name].store, limit=limit, return_state=True).is_failed():
            failed.append(name)
    if failed:
        raise LayerwaveError(f"the {preset} pipeline failed for {', '.join(failed)} (see their flow runs)")
    return {"ran": missing, "complete": [n for n in names if n not in missing]}
