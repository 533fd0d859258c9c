"""The study's ledger: one small record per trained head, published beside the report.

A study takes hours of CPU and is spread over runs on machines that keep nothing in between
(a fresh machine, CI): the store and the heads are gone, only what was committed stays. The
ledger is what is committed of each head: the key of its inputs (tasks/heads/train.py:
training_key), its τ_offline and its benchmark scores with their keys. A later run that would
train a head under the same key takes its scores from the ledger instead, and its report counts
them. A key made from other data, another recipe or other benchmark settings matches nothing,
so nothing stale is reused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from upath import UPath

from store import paths
from store.artefacts import read_json, write_text
from store.paths import Workspace
from tasks.report.study import screening_tau

LEDGER = "heads.json"
SCORE_FIELDS = ("tau", "speedup", "lossless", "contention")  # what the report reads of a benchmark score
ROUNDS = ("screening", "final")


def head_record(head: UPath, round_name: str, layers: list[int], seed: int, benches) -> dict | None:
    """A head's ledger record from its files; None until its training record is written."""
    if not (head / "training.json").is_file():
        return None
    training = read_json(head / "training.json")
    scores = {}
    for bench in benches:
        path = paths.evaluation(head, bench)
        if path.is_file():
            score = read_json(path)
            scores[bench] = {"key": score["stage_key"], **{name: score.get(name) for name in SCORE_FIELDS}}
    return {"round": round_name, "layers": layers, "seed": seed, "training_key": training["stage_key"],
            "data_plan_hash": training["data_plan_hash"], "tau_offline": screening_tau(training["final"]),
            "scores": scores}


def heads_on_disk(store: str, model_key: str, preset: str, sets: list[list[int]], seeds, benches,
                  data_plan_hash: str) -> list[dict]:
    """The records of every screening and final head of `sets` × `seeds` found beside the store
    and trained from the activations `data_plan_hash` names (a head left from a training store
    since remade is another study's)."""
    workspace, records = Workspace(store), []
    for layers in sets:
        for seed in seeds:
            for round_name, head in (("screening", workspace.screening_head(model_key, preset, layers, seed)),
                                     ("final", workspace.head(model_key, preset, layers, seed))):
                record = head_record(head, round_name, layers, seed, benches)
                if record is not None and record["data_plan_hash"] == data_plan_hash:
                    records.append(record)
    return records


def head_slot(record: dict) -> tuple:
    """Which head of the study a record is: its round, set and seed."""
    return record["round"], tuple(record["layers"]), record["seed"]


@dataclass(frozen=True)
class Ledger:
    """The published records of one model's study, by training key (empty when the preset
    publishes nothing)."""

    path: Path | None
    records: dict[str, dict]

    @classmethod
    def published(cls, publish: str | None, model_key: str) -> Ledger:
        if not publish:
            return cls(None, {})
        path = Path(publish) / model_key / LEDGER
        records = json.loads(path.read_text())["heads"] if path.is_file() else []
        return cls(path, {record["training_key"]: record for record in records})

    def screening_tau(self, training_key: str) -> dict | None:
        """A screened head's τ_offline, if the ledger holds the head."""
        record = self.records.get(training_key)
        return record["tau_offline"] if record else None

    def scores(self, training_key: str, keys: dict[str, str]) -> dict[str, dict] | None:
        """A final head's score per benchmark, if the ledger holds every one under the key given."""
        found = (self.records.get(training_key) or {}).get("scores", {})
        if all(found.get(bench, {}).get("key") == key for bench, key in keys.items()):
            return {bench: found[bench] for bench in keys}
        return None

    def current(self, data_plan_hash: str) -> list[dict]:
        """The records of heads trained from these activations."""
        return [record for record in self.records.values() if record["data_plan_hash"] == data_plan_hash]

    def write(self, records: list[dict]) -> Ledger:
        """The ledger with `records` added, written whole. A record replaces the one of the same
        head (round, set, seed) whatever its key: with two recipes' records of one head, a report
        would count that head twice."""
        merged = {head_slot(record): record for record in [*self.records.values(), *records]}
        ordered = sorted(merged.values(), key=lambda r: (ROUNDS.index(r["round"]), r["seed"], r["layers"]))
        lines = ",\n".join(json.dumps(record, sort_keys=True) for record in ordered)  # a head per line: short diffs
        write_text(self.path, f'{{"heads": [\n{lines}\n]}}\n')
        return Ledger(self.path, {record["training_key"]: record for record in ordered})

    def publish_head(self, head: UPath, round_name: str, layers: list[int], seed: int, benches) -> Ledger:
        """The ledger with one just-finished head added, published at once: a run lost before its
        next report loses no head it finished."""
        record = head_record(UPath(head), round_name, layers, seed, benches)
        return self.write([record]) if self.path and record else self
