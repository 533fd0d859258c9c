"""Each stage's request: the CLI's options, the flow's parameters and the request's fields are one
declaration, and a command checks its request once."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from flows.analyze import analyze
from flows.cli import main
from flows.evaluate import evaluate, evaluate_offline
from flows.extract import extract
from flows.generate import generate
from flows.pipeline import pipeline
from flows.selection import select
from flows.train import train_head
from tasks.data.generate_request import GenerateRequest
from tasks.decode.request import EvaluateRequest, OfflineEvaluateRequest
from tasks.extract.request import ExtractRequest
from tasks.heads.request import TrainRequest
from tasks.pipeline_request import RunRequest
from tasks.request import add_options, from_args
from tasks.select.request import SelectRequest
from tasks.stats.request import AnalyzeRequest
from tests.conftest import LAYERS, TINY

FLOWS = [(extract, ExtractRequest), (generate, GenerateRequest), (analyze, AnalyzeRequest), (select, SelectRequest),
         (train_head, TrainRequest), (evaluate, EvaluateRequest), (evaluate_offline, OfflineEvaluateRequest),
         (pipeline, RunRequest)]


@pytest.mark.parametrize("flow, request_type", FLOWS, ids=[request.__name__ for _, request in FLOWS])
def test_a_flow_takes_exactly_its_requests_fields(flow, request_type):
    parameters = [(name, p.default) for name, p in inspect.signature(flow.fn).parameters.items()]
    assert parameters == [(f.name, f.default) for f in dataclasses.fields(request_type)]


def counting_checks(monkeypatch, request_type) -> list:
    """Every check of `request_type` made from now on (the real check still runs)."""
    made, check = [], request_type.check

    def counted(self):
        made.append(self)
        return check(self)
    monkeypatch.setattr(request_type, "check", counted)
    return made


def test_layerwave_train_checks_its_request_once(training_store, tmp_path, monkeypatch):
    made = counting_checks(monkeypatch, TrainRequest)
    out = tmp_path / "head"
    assert main(["train", "--model", TINY, "--store", training_store, "--preset", "smoke", "--epochs", "1",
                 "--out", str(out)]) == 0
    assert len(made) == 1 and made[0].layers is None  # the default set is resolved by the check, once
    assert (out / "model.safetensors").is_file()


def test_layerwave_evaluate_checks_its_request_once(training_store, tmp_path, monkeypatch):
    out = tmp_path / "head"
    assert main(["train", "--model", TINY, "--store", training_store, "--preset", "smoke", "--epochs", "1",
                 "--out", str(out), "--layers", ",".join(map(str, LAYERS))]) == 0
    made = counting_checks(monkeypatch, EvaluateRequest)
    assert main(["evaluate", "--model", TINY, "--head", str(out), "--limit", "1", "--max-new-tokens", "6",
                 "--json", str(tmp_path / "result.json")]) == 0
    assert len(made) == 1 and (made[0].limit, made[0].max_new_tokens) == (1, 6)


def test_an_option_left_out_keeps_the_requests_default():
    parser = argparse.ArgumentParser()
    add_options(parser, EvaluateRequest)
    request = from_args(EvaluateRequest, parser.parse_args(["--head", "h"]))
    assert (request.limit, request.max_new_tokens, request.depth) == (10, 128, 4)
