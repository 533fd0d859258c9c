"""Read a corpus the target generated (`layerwave generate`): a directory of JSONL shards and a manifest.

Kept apart from the generation itself so reading a corpus never imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from store.artefacts import location, read_json
from store.errors import LayerwaveError

FORMAT = "layerwave-regen/1"
MANIFEST = "manifest.json"


def shard_path(out: Path, shard: int) -> Path:
    return out / f"shard-{shard:05d}.jsonl"


def committed_shards(out: Path) -> list[Path]:
    """Shards written whole, in order (a shard file exists only once it is complete)."""
    shards = []
    while shard_path(out, len(shards)).is_file():
        shards.append(shard_path(out, len(shards)))
    return shards


def read_manifest(out: Path) -> dict | None:
    path = out / MANIFEST
    if not path.is_file():
        return None
    try:
        return read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise LayerwaveError(f"{path} is not a layerwave generation manifest; remove it or use another --out") \
            from None


def read_generated(out: Path) -> tuple[list[tuple], list[int], dict]:
    """(conversations, their source-corpus records, manifest) of a complete generation in `out`."""
    manifest = read_manifest(out)
    if manifest is None or manifest.get("format") != FORMAT:
        raise LayerwaveError(f"corpus regen:{out}: no generated corpus there (no {MANIFEST}); "
                             "write one with `layerwave generate --out DIR`")
    if not manifest.get("complete"):
        raise LayerwaveError(f"corpus regen:{out} is incomplete; re-run the same `layerwave generate` to finish it")
    shards = committed_shards(out)[: manifest["shards"]]
    if len(shards) < manifest["shards"]:
        raise _damaged(out, f"holds {len(shards)} of its {manifest['shards']} shards")
    conversations, records = [], []
    for path in shards:
        try:
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _damaged(out, f"has a damaged shard, {path.name}") from None
        for row in rows:
            conversations.append(GeneratedConversation(row["messages"], row["token_ids"], row["loss_mask"]))
            records.append(row["source_record"])
    return conversations, records, manifest


def _damaged(out: Path, what: str) -> LayerwaveError:
    """Shards are written whole: a copy cut short, or a file removed by hand."""
    return LayerwaveError(f"corpus regen:{out} {what}; generate it again (the same `layerwave generate` with "
                          "--overwrite)")


class GeneratedConversation(tuple):
    """A conversation (its messages) that also carries the exact tokens the target saw and wrote,
    so extraction stores the target's own token sequence rather than a re-tokenization of its text."""

    def __new__(cls, messages, token_ids, loss_mask):
        conversation = super().__new__(cls, messages)
        conversation.token_ids, conversation.loss_mask = token_ids, loss_mask
        return conversation


def generator_key(spec: str) -> str | None:
    """The model key that generated a regen: corpus (None for other corpora)."""
    manifest = _regen_manifest(spec)
    return manifest["model"]["key"] if manifest else None


def replies_summary(spec: str) -> str | None:
    """How the target's replies of a regen: corpus ended and how much they repeat, for a report: a
    target that seldom ends its turn (a base model) writes replies that run to the token limit in loops."""
    if _regen_manifest(spec) is None:
        return None
    conversations, _, manifest = read_generated(location(spec[6:]).expanduser())
    return (f"{manifest['replies']}, {manifest['finished_replies']} ended on the target's end of turn, the rest "
            f"at {manifest['identity']['max_new_tokens']} new tokens; {repeated_share(conversations):.0%} of their "
            "tokens repeat a 4-gram seen earlier in the conversation")


def repeated_share(conversations: list[GeneratedConversation], n: int = 4) -> float:
    """Share of reply tokens that close an n-gram already seen earlier in their conversation: text
    a prompt-lookup drafter could copy, and a sign of a target that loops."""
    repeated = replied = 0
    for conversation in conversations:
        ids, seen = conversation.token_ids, set()
        for end in range(n, len(ids) + 1):
            gram = tuple(ids[end - n:end])
            if conversation.loss_mask[end - 1]:
                replied += 1
                repeated += gram in seen
            seen.add(gram)
    return repeated / max(replied, 1)


def _regen_manifest(spec: str) -> dict | None:
    return read_manifest(location(spec[6:]).expanduser()) if spec.startswith("regen:") else None

