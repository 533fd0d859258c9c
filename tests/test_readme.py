"""The README as written: every Python block runs against a store made by the quick start's own
stages (bfloat16 storage, as SmolLM2's), and its hidden states are real float32 values equal to
what `store.read.open_activations` gives; every `layerwave` command and option it shows exists.
The docs name no absolute machine path."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from flows.analyze import analyze
from flows.cli import main
from flows.extract import extract
from store.read import open_activations
from tests.conftest import TINY, extract_options

README = (Path(__file__).parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def for_the_tiny_model(block: str) -> str:
    """The README speaks of SmolLM2 (N = 30); the tiny model has N = 8, whose default is [2, 4, 5]."""
    return block.replace("smollm2-135m", TINY).replace("[2, 15, 27]", "[2, 4, 5]")


@pytest.fixture(scope="module")
def quick_start_store(tmp_path_factory, corpus, prefect_api) -> Path:
    store = tmp_path_factory.mktemp("readme") / "layerwave.zarr"
    extract(**extract_options(store, corpus, tokens=1200, dtype="bfloat16"))
    analyze(model=TINY, store=str(store), entropy_quantile=0.5, drop_first_token=True, memory_gb=1.0)
    return store


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2 and all("layerwave.zarr" in block for block in BLOCKS)


def test_every_readme_python_block_runs_and_gives_real_values(quick_start_store, monkeypatch, capsys):
    monkeypatch.chdir(quick_start_store.parent)
    namespace: dict = {}
    for number, block in enumerate(BLOCKS):
        exec(compile(for_the_tiny_model(block), f"README.md python block {number}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "[[" in printed  # the states' values, not an error
    ds = namespace["ds"]
    assert ds.hidden_states.dtype == np.float32 and ds.hidden_states.attrs["storage_dtype"] == "bfloat16"
    assert ds.hidden_states.chunks is not None  # lazy, Dask-backed
    checked = open_activations(str(quick_start_store), TINY).hidden_states.values
    np.testing.assert_array_equal(ds.hidden_states.values, checked)
    assert np.isfinite(checked).all() and np.abs(checked).max() < 1e3  # numbers, not raw bit patterns
    assert set(namespace["a"].data_vars) >= {"entropy_h1", "cka"}


# --- Every `layerwave` command the README shows is real, with the options it shows. ---

ROOT = Path(__file__).parents[1]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
INLINE_AT_LINE_START = re.compile(r"^\s*(?:#+\s+|[-*]\s+)?`((?:\.venv/bin/)?layerwave\s[^`]*)`")
GLOBAL_OPTIONS = {"--debug", "--verbose", "--help"}


def layerwave_command(line: str) -> tuple[str, set[str]] | None:
    """('train', {'--layers', ...}) for a command line `layerwave [--debug] train --layers 2,15,27 ...`."""
    line = re.sub(r"^\s*(?:\$\s+)?", "", line)
    line = re.split(r"\s#", line, maxsplit=1)[0]  # a trailing shell comment
    words = line.split()
    if not words or words[0] not in ("layerwave", ".venv/bin/layerwave"):
        return None
    rest = [w for w in words[1:] if w not in GLOBAL_OPTIONS]
    if not rest or not re.fullmatch(r"[a-z][a-z-]*", rest[0]):
        return None  # a placeholder such as <command>, not a command
    options = {m.split("=")[0] for w in rest[1:] for m in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?:=\S*)?", w)}
    return rest[0], options - GLOBAL_OPTIONS


def command_lines(text: str) -> list[str]:
    """The lines of the shell blocks (``` or ```bash; continuation lines joined), then the inline
    code that opens a line outside any block."""
    shell, prose, block, language = [], [], None, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block, language = [], line.strip().strip("`").strip()
            else:
                if language in SHELL_LANGUAGES:
                    shell += "\n".join(block).replace("\\\n", " ").splitlines()
                block = None
        elif block is not None:
            block.append(line)
        else:
            prose.append(line)
    return shell + [m.group(1) for line in prose if (m := INLINE_AT_LINE_START.match(line))]


def readme_commands(text: str) -> dict[str, set[str]]:
    """Every `layerwave <command>` the README shows, with the options shown for it."""
    found: dict[str, set[str]] = {}
    for line in command_lines(text):
        command = layerwave_command(line)
        if command:
            found.setdefault(command[0], set()).update(command[1])
    return found


README_COMMANDS = readme_commands(README)


def cli_help(capsys, *argv: str) -> str:
    """`layerwave <argv> --help`'s text (in-process: the entry point's own runs are tested elsewhere)."""
    status = main([*argv, "--help"])
    printed = capsys.readouterr()
    assert status == 0, f"layerwave {' '.join(argv)} --help: {printed.err or printed.out}"
    return printed.out


def test_the_readme_shows_every_command(capsys):
    listed = re.search(r"\{([a-z,-]+)\}", cli_help(capsys))
    assert listed, "layerwave --help lists no subcommands"
    assert set(listed.group(1).split(",")) <= README_COMMANDS.keys()


@pytest.mark.parametrize("command", sorted(README_COMMANDS))
def test_every_readme_command_and_option_exists(command, capsys):
    offered = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", cli_help(capsys, command)))
    assert README_COMMANDS[command] <= offered, \
        f"the README shows layerwave {command} {sorted(README_COMMANDS[command] - offered)}, which it does not offer"


# --- The docs speak of no machine's absolute paths and use no narration words. ---

DOCS = sorted({ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").rglob("*.md"),
               *(ROOT / "results").rglob("*.md"), *(ROOT / "results").rglob("*.json")})
SESSION = re.compile(r"\bsession", re.I)
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/(?:work|tmp|root|home)/")


@pytest.mark.parametrize("path", [p for p in DOCS if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_no_session_and_no_absolute_path(path):
    bad = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:160]}"
           for number, line in enumerate(path.read_text().splitlines(), 1)
           if SESSION.search(line) or ABSOLUTE_PATH.search(line)]
    assert not bad, "\n".join(bad)
