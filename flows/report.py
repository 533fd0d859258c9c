"""The report flow: a Markdown report per model beside the store, plus Prefect artifacts."""

from __future__ import annotations

from prefect import flow

from tasks.data.registry import store_key
from tasks.names import DEFAULT_MODEL
from tasks.pipeline_presets import preset_store
from tasks.report.write_report import check_reportable, report_task


@flow(name="layerwave-report")
def report(model: str = DEFAULT_MODEL, preset: str = "quick", store: str | None = None) -> dict:
    """Regenerate a model's report from the store and the heads' evaluation results."""
    store, model_key = preset_store(preset, store), store_key(model)
    check_reportable(store, model_key, preset)
    return report_task(store, model_key, preset)
