"""Scale-out: two processes extract disjoint halves of one store at the same time (`--part 1/2`
and `--part 2/2`); together they leave a store identical to a single run's, and the part locks
refuse a conflicting writer. A store may also be an fsspec URL."""

from __future__ import annotations

import pytest

from flows.cli import main
from flows.extract import extract
from store.errors import LayerwaveError
from store.lock import writer_lock
from tasks.extract.request import parse_part
from tests.conftest import TINY, extract_options
from tests.processes import assert_identical_stores, cli_argv, error_line, start


def test_two_parts_running_together_fill_one_store(tmp_path, corpus, prefect_api):
    options = dict(tokens=3000, batch_tokens=256)
    extract(**extract_options(tmp_path / "single.zarr", corpus, **options))
    shared = tmp_path / "shared.zarr"
    argv = cli_argv("extract", extract_options(shared, corpus, **options))
    processes = [start(argv + ["--part", f"{i}/2"], prefect_api) for i in (1, 2)]
    assert [process.wait(timeout=300) for process in processes] == [0, 0]
    assert_identical_stores(str(tmp_path / "single.zarr"), str(shared), f"{TINY}/activations")


def test_a_parts_summary_says_what_it_wrote_and_what_is_left(tmp_path, corpus, prefect_api):
    store = tmp_path / "parts.zarr"
    options = extract_options(store, corpus, tokens=3000, batch_tokens=256)
    first = extract(**options, part="1/2")
    assert first["part"] == "1/2" and not first["complete"]
    assert first["shards_written"] == list(range(0, first["n_shards"], 2))
    assert first["pending"] == list(range(1, first["n_shards"], 2))
    assert first["committed"] == len(first["shards_written"])
    second = extract(**options, part="2/2")
    assert second["complete"] and second["shards_written"] == first["pending"]


def test_a_whole_run_is_refused_while_parts_write(tmp_path, corpus, prefect_api, capsys):
    """The whole run is the command a user types, here in this process: the part locks are file
    locks, which refuse a second holder within one process as between two."""
    store = str(tmp_path / "busy.zarr")
    with writer_lock(store, TINY):  # a whole run that has finished leaves its pid in the lock file
        pass
    with writer_lock(store, TINY, parse_part("1/2")):
        with writer_lock(store, TINY, parse_part("2/2")):  # parts share the model's lock
            assert main(cli_argv("extract", extract_options(store, corpus))[3:]) == 2
            refusal = error_line(capsys.readouterr().err)
            assert f"another extraction of tiny-random-llama is writing to {store} (its --part runs)" in refusal
        with pytest.raises(LayerwaveError, match="another extraction"):
            with writer_lock(store, TINY, parse_part("1/2")):  # the same part twice
                pass


@pytest.mark.parametrize("part, message", [("2", "should be i/n"), ("3/2", "between 1 and n"), ("0/2", "between")])
def test_bad_part_is_refused(part, message):
    with pytest.raises(LayerwaveError, match=message):
        parse_part(part)


def test_an_fsspec_url_store_holds_the_same_activations(tmp_path, corpus):
    """Object stores come in as fsspec URLs (s3://, gs://); memory:// has their semantics (no
    directories, no flock) inside this process."""
    options = dict(tokens=600, batch_tokens=256)
    extract(**extract_options(tmp_path / "local.zarr", corpus, **options))
    extract(**extract_options("memory://scale-out/url.zarr", corpus, **options))
    assert_identical_stores(str(tmp_path / "local.zarr"), "memory://scale-out/url.zarr", f"{TINY}/activations")
