"""Every command's mistakes, table-driven: exit status 2, exactly one `layerwave: error:` line that
names the fix, no traceback, and the store byte for byte as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from flows.cli import main
from flows.extract import extract
from tasks.heads.export_head import export
from tests.conftest import TINY, extract_options


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, corpus, trained) -> dict[str, str]:
    """A finished tiny store, an exported head, a truncated one, a file, a directory, a binary file."""
    root = tmp_path_factory.mktemp("mistakes")
    store = root / "store.zarr"
    extract(**extract_options(store, corpus, tokens=300))
    head = export(trained[0], root / "head", "vllm", verifier=TINY)  # no training.json: no acceptance profile
    truncated = export(trained[0], root / "truncated", "vllm", verifier=TINY)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (root / "a-file").write_text("not a store")
    (root / "a-dir").mkdir()
    (root / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    return {"store": str(store), "head": str(head), "truncated": str(truncated), "file": str(root / "a-file"),
            "dir": str(root / "a-dir"), "binary": str(root / "binary.jsonl"), "missing": str(root / "missing")}


def extract_argv(w: dict, *flags: str) -> list[str]:
    return ["extract", "--model", TINY, "--store", w["store"], "--corpus", "mt-bench", "--tokens", "300", *flags]


CASES = {
    # malformed values
    "extract --tokens 0": (lambda w: extract_argv(w, "--tokens", "0"), "--tokens must be at least 1 (got 0)"),
    "extract --tokens -3": (lambda w: extract_argv(w, "--tokens", "-3"), "--tokens must be at least 1 (got -3)"),
    "extract --tokens many": (lambda w: extract_argv(w, "--tokens", "many"), "invalid int value: 'many'"),
    "extract --part 2": (lambda w: extract_argv(w, "--part", "2"), "--part '2' should be i/n"),
    "extract --part 3/2": (lambda w: extract_argv(w, "--part", "3/2"), "i must be between 1 and n"),
    "extract --device tpu": (lambda w: extract_argv(w, "--device", "tpu"), "unknown --device 'tpu'"),
    "extract --dtype float8": (lambda w: extract_argv(w, "--dtype", "float8"), "unknown --dtype 'float8'"),
    "extract --unknown-option": (lambda w: extract_argv(w, "--speed", "9"), "unrecognized arguments: --speed 9"),
    "train --layers 2,,5": (lambda w: ["train", "--model", TINY, "--store", w["store"], "--layers", "2,,5"],
                            "'2,,5' is not a comma-separated list of layer indices"),
    "train --layers 2,2,5": (lambda w: ["train", "--model", TINY, "--store", w["store"], "--layers", "2,2,5"],
                             "layer set [2, 2, 5] repeats a layer"),
    "train --layers 40": (lambda w: ["train", "--model", TINY, "--store", w["store"], "--layers", "2,40"],
                          "layers [40] are not in the store"),
    "train --layers -1": (lambda w: ["train", "--model", TINY, "--store", w["store"], "--layers=-1,2"],
                          "layers [-1] are not in the store"),
    "train --format onnx": (lambda w: ["train", "--model", TINY, "--store", w["store"], "--format", "onnx"],
                            "unknown --format 'onnx'"),
    "train --format sglang with layer 0": (
        lambda w: ["train", "--model", TINY, "--store", w["store"], "--format", "sglang", "--layers", "0,2,4"],
        "SGLang cannot capture the embedding output"),
    "train a layer no runtime captures": (lambda w: ["train", "--model", TINY, "--store", w["store"], "--layers",
                                                     "2,4,8"], "vllm cannot capture HF index 8"),
    "sweep --limit 0": (lambda w: ["sweep", "--preset", "smoke", "--store", w["store"], "--model", TINY, "--limit", "0"],
                        "--limit must be at least 1 (got 0)"),
    "select before analyze": (lambda w: ["select", "--model", TINY, "--store", w["store"]], "no analysis for"),
    "select --layers 1-7": (lambda w: ["select", "--model", TINY, "--store", w["store"], "--layers", "1-7"],
                            "--layers '1-7' should be LOW:HIGH"),
    "select --limit 0": (lambda w: ["select", "--model", TINY, "--store", w["store"], "--limit", "0"],
                         "--limit must be at least 1 (got 0)"),
    "report an unknown model": (lambda w: ["report", "--model", "gpt-9", "--store", w["store"]],
                                "unknown model 'gpt-9'"),
    "evaluate --limit 0": (lambda w: ["evaluate", "--model", TINY, "--head", w["head"], "--limit", "0"],
                           "--limit must be at least 1 (got 0)"),
    "evaluate --depth 0": (lambda w: ["evaluate", "--model", TINY, "--head", w["head"], "--depth", "0"],
                           "--depth must be at least 1"),
    "evaluate --repeat 0": (lambda w: ["evaluate", "--model", TINY, "--head", w["head"], "--repeat", "0"],
                            "--repeat must be at least 1"),
    "evaluate --max-new-tokens 0": (lambda w: ["evaluate", "--model", TINY, "--head", w["head"],
                                               "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    "evaluate --temperature -1": (lambda w: ["evaluate", "--model", TINY, "--head", w["head"],
                                             "--temperature", "-1"], "--temperature must be >= 0"),
    "evaluate --draft foo": (lambda w: ["evaluate", "--model", TINY, "--head", w["head"], "--draft", "foo"],
                             "unknown --draft 'foo'; use chain, tree, lookup, hybrid or auto"),
    "evaluate --bench wiki": (lambda w: ["evaluate", "--model", TINY, "--head", w["head"], "--bench", "wiki"],
                              "unknown --bench 'wiki'"),
    "evaluate without --head": (lambda w: ["evaluate", "--model", TINY], "--draft chain drafts with a head: pass --head DIR"),
    # missing, unreadable, binary and directory paths
    "extract from a missing corpus file": (lambda w: extract_argv(w)[:-4] + ["--corpus", f"jsonl:{w['missing']}"],
                                           "does not exist"),
    "extract from a directory": (lambda w: extract_argv(w)[:-4] + ["--corpus", f"jsonl:{w['dir']}"],
                                 "is a directory; give a JSONL file"),
    "extract from a binary file": (lambda w: extract_argv(w)[:-4] + ["--corpus", f"jsonl:{w['binary']}"],
                                   "is not UTF-8 text"),
    "extract into a file": (lambda w: ["extract", "--model", TINY, "--store", w["file"], "--corpus", "mt-bench"],
                            "is a file, not a Zarr store directory"),
    "analyze a missing store": (lambda w: ["analyze", "--model", TINY, "--store", w["missing"]], "no activations for"),
    "verify a missing store": (lambda w: ["verify", "--store", w["missing"]], "no store at"),
    "evaluate a head directory without config": (lambda w: ["evaluate", "--model", TINY, "--head", w["dir"]],
                                                 "has no config.json"),
    # corrupt heads
    "evaluate a truncated head": (lambda w: ["evaluate", "--model", TINY, "--head", w["truncated"]],
                                  "model.safetensors is unreadable"),
    # mismatched model, store and head
    "extract an unknown model": (lambda w: extract_argv(w, "--model", "gpt-9"), "unknown model 'gpt-9'"),
    "train an unknown model": (lambda w: ["train", "--model", "no/such", "--store", w["store"]],
                               "--model 'no/such' is neither a known model nor a store group name"),
    "evaluate --draft auto with no acceptance profile": (
        lambda w: ["evaluate", "--model", TINY, "--head", w["head"], "--draft", "auto"],
        "needs head"),
    "evaluate --offline without --store": (lambda w: ["evaluate", "--model", TINY, "--head", w["head"], "--offline"],
                                           "pass --store"),
    "run an unknown preset": (lambda w: ["run", "--model", TINY, "--preset", "huge"], "unknown pipeline preset 'huge'"),
    "run --limit 0": (lambda w: ["run", "--model", TINY, "--preset", "smoke", "--limit", "0"],
                      "--limit must be at least 1 (got 0)"),
    "run --workers 0": (lambda w: ["run", "--model", TINY, "--preset", "smoke", "--workers", "0"],
                        "--workers must be at least 1 (got 0)"),
    "run --workers with --dask-address": (
        lambda w: ["run", "--model", TINY, "--preset", "smoke", "--workers", "2", "--dask-address", "tcp://127.0.0.1:9"],
        "give --workers (a local cluster) or --dask-address (an existing one), not both"),
    "run with an unreachable Dask scheduler": (
        lambda w: ["run", "--model", TINY, "--preset", "smoke", "--dask-address", "tcp://127.0.0.1:9"],
        "cannot reach a Dask scheduler at --dask-address tcp://127.0.0.1:9"),
    "generate --max-new-tokens 0": (lambda w: ["generate", "--model", TINY, "--store", w["store"],
                                               "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    # unreachable services
    "analyze with an unreachable Dask scheduler": (
        lambda w: ["analyze", "--model", TINY, "--store", w["store"], "--dask-address", "tcp://127.0.0.1:9"],
        "cannot reach a Dask scheduler"),
}


def snapshot(path: str) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(path).rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_every_mistake_is_one_line_and_changes_nothing(case, workspace, capsys):
    build, expected = CASES[case]
    before = snapshot(workspace["store"])
    capsys.readouterr()
    assert main(build(workspace)) == 2
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("layerwave: error:")]
    assert "Traceback" not in err and len(lines) == 1 and err.endswith(lines[0]), err
    assert expected in lines[0], lines[0]
    assert snapshot(workspace["store"]) == before


def test_the_table_covers_every_command():
    commands = {build({k: "x" for k in ("store", "head", "truncated", "file", "dir", "binary", "missing")})[0]
                for build, _ in CASES.values()}
    assert {"extract", "analyze", "select", "train", "evaluate", "verify", "run", "generate"} <= commands
    assert len(CASES) >= 30
