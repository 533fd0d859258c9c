"""bfloat16 where the device has it natively: training autocasts over float32 master weights,
`auto` picks it only where native, an explicit ask the device cannot serve is one line, and a
float32 head keeps the stage key it had before the recipe named a precision."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from flows.cli import main
from store.errors import LayerwaveError
from tasks import precision
from tasks.heads.request import TrainRequest
from tasks.heads.train import training_key
from tasks.heads.train_head import ADDED_LATER, preset, train
from tasks.stage_key import stage_key
from tests.conftest import LAYERS, TINY
from tests.processes import error_line

CPU = torch.device("cpu")
NATIVE = precision.bf16_native(CPU)


def test_auto_is_bfloat16_only_where_native(monkeypatch):
    assert precision.resolve_precision("auto", CPU) == ("bfloat16" if NATIVE else "float32")
    assert precision.resolve_precision("float32", CPU) == "float32"
    with pytest.raises(LayerwaveError, match="unknown --precision 'half'"):
        precision.resolve_precision("half", CPU)
    monkeypatch.setattr(precision, "bf16_native", lambda device: False)  # a CPU without avx512_bf16 or AMX
    assert precision.resolve_precision("auto", CPU) == "float32"
    with pytest.raises(LayerwaveError, match="no native bfloat16"):
        precision.resolve_precision("bfloat16", CPU)


@pytest.mark.parametrize("kind", ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    not NATIVE, reason="this CPU has no native bfloat16"))])
def test_both_precisions_train_a_head_that_learns(training_store, tmp_path, kind):
    head, record = train(training_store, TINY, LAYERS, tmp_path, preset("smoke", epochs=2, precision=kind),
                         log=lambda line: None)
    assert all(p.dtype == torch.float32 for p in head.parameters())  # master weights stay float32
    assert all(torch.isfinite(p).all() for p in head.parameters())
    assert record["config"]["precision"] == kind
    assert record["final"]["loss"][0] < 0.9 * record["untrained"]["loss"][0]


def test_the_precision_enters_the_stage_key_only_when_it_is_not_float32(training_store):
    def checked(kind):
        return TrainRequest(model=TINY, store=training_store, layers=LAYERS, preset_name="smoke", device="cpu",
                            precision=kind).check()
    fp32 = checked("float32")
    recipe = {k: v for k, v in asdict(fp32.config).items() if k not in ADDED_LATER}  # at their first values: the key as it was
    assert training_key(fp32) == stage_key(fp32.plan_hash, fp32.layers, recipe, "vllm", fp32.verifier)
    if NATIVE:
        assert training_key(checked("bfloat16")) != training_key(fp32)
        assert checked("auto").config.precision == "bfloat16"


def test_bfloat16_asked_on_a_device_without_it_is_one_line(training_store, monkeypatch, capsys):
    monkeypatch.setattr(precision, "bf16_native", lambda device: False)
    assert main(["train", "--model", TINY, "--store", training_store, "--layers", "2,4,5", "--preset", "smoke",
                 "--device", "cpu", "--precision", "bfloat16"]) == 2
    assert "--precision bfloat16: this cpu has no native bfloat16" in error_line(capsys.readouterr().err)


def test_generation_and_extraction_in_bfloat16_say_so(tmp_path, prefect_api):
    """`generate --dtype bfloat16`: the manifest and the corpus identity name it (a checkpoint-dtype
    corpus keeps the identity it always had); extracting in bfloat16 records it in the store."""
    from flows.extract import extract
    from flows.generate import generate
    from store.read import open_activations
    from tasks.data.regen_corpus import read_manifest
    from tests.conftest import GENERATION, extract_options

    settings = {**GENERATION, "tokens": 200}
    corpora = {dtype: generate(out=str(tmp_path / dtype), dtype=dtype, **settings)["corpus"]
               for dtype in ("auto", "bfloat16")}
    manifests = {dtype: read_manifest(tmp_path / dtype) for dtype in corpora}
    assert manifests["bfloat16"]["model"]["compute_dtype"] == "bfloat16"
    assert manifests["auto"]["model"]["compute_dtype"] == "float32" and "dtype" not in manifests["auto"]["identity"]
    assert manifests["bfloat16"]["identity"]["dtype"] == "bfloat16" and manifests["bfloat16"]["tokens"] >= 200
    store = tmp_path / "store.zarr"
    extract(**extract_options(store, corpora["bfloat16"], tokens=400, dtype="bfloat16"))
    attrs = open_activations(str(store), TINY).attrs
    assert attrs["model"]["compute_dtype"] == "bfloat16" and attrs["extraction"]["dtype"] == "bfloat16"


def test_data_stages_choose_bfloat16_only_where_native_and_warn_when_asked_elsewhere(monkeypatch):
    """The `scale` preset generates and extracts in bfloat16 only where it is native: emulated, a
    CPU without avx512_bf16 multiplies bfloat16 matrices about 100x slower than float32."""
    from tasks.pipeline_presets import pipeline_preset

    scale, quick = pipeline_preset("scale"), pipeline_preset("quick")
    monkeypatch.setattr(precision, "bf16_native", lambda device: True)
    assert (scale.data_dtype(CPU), quick.data_dtype(CPU)) == ("bfloat16", "auto")
    assert precision.emulated_bfloat16_warning("bfloat16", CPU) is None
    monkeypatch.setattr(precision, "bf16_native", lambda device: False)
    assert (scale.data_dtype(CPU), quick.data_dtype(CPU)) == ("auto", "auto")
    assert "--dtype bfloat16: this cpu has no native bfloat16" in precision.emulated_bfloat16_warning("bfloat16", CPU)
    assert precision.emulated_bfloat16_warning("float32", CPU) is None
