"""`layerwave <stage>`: run the flows in-process on Prefect's ephemeral API (no server needed)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from store.errors import LayerwaveError


def _extract_parser(sub) -> None:
    p = sub.add_parser("extract", help="write every layer's hidden states over a corpus into the Zarr store")
    p.add_argument("--model", default="smollm2-135m", help="registry id (see `layerwave models`) or hf:PATH")
    p.add_argument("--corpus", default="sharegpt", help="sharegpt, mt-bench or jsonl:PATH")
    p.add_argument("--tokens", type=int, default=20000, help="token budget (documents are picked by --seed)")
    p.add_argument("--store", default="layerwave.zarr", help="Zarr store directory (or fsspec URL)")
    p.add_argument("--max-length", type=int, default=2048, help="truncate documents to this many tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda[:N]")
    p.add_argument("--dtype", default="auto", help="compute dtype: auto (the checkpoint's), float32, float16, bfloat16")
    p.add_argument("--storage-dtype", default="auto",
                   help="auto (lossless for 16-bit models, else float16 when in range), float16, bfloat16, float32")
    p.add_argument("--topk", type=int, default=20, help="target top-k next-token labels kept per token")
    p.add_argument("--tokens-per-chunk", type=int, help="default: ~1 MiB chunks")
    p.add_argument("--chunks-per-shard", type=int, help="default: ~128 MiB shards")
    p.add_argument("--batch-tokens", type=int, help="tokens per forward pass (default: adapts to the device)")
    p.add_argument("--workers", type=int, default=1, help="shards extracted concurrently")
    p.add_argument("--overwrite", action="store_true", help="replace this model's activations made with other settings")
    p.add_argument("--json", help="also write the run summary to this JSON file")


def _run_extract(args) -> dict:
    from tasks.extract import ExtractRequest, check_request

    options = {k: v for k, v in vars(args).items() if k not in ("command", "json", "workers")}
    check_request(ExtractRequest(**options))  # bad input fails here, before Prefect starts
    _configure_logging()
    from flows.extract import extract

    return extract(**options, workers=args.workers)


def _run_models(args) -> dict:
    from tasks.registry import registry

    for model_id, entry in sorted(registry().items()):
        print(f"{model_id:20s} {entry.get('description', '')}")
    return {}


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed run's traceback; for a LayerwaveError the message alone says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], LayerwaveError):
            record.exc_info, record.exc_text = None, None
        return True


def _configure_logging() -> None:
    from prefect.logging.configuration import setup_logging

    setup_logging()
    for handler in logging.getLogger().handlers:
        handler.addFilter(_NoTracebackForUserErrors())


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    parser = argparse.ArgumentParser(prog="layerwave", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _extract_parser(sub)
    sub.add_parser("models", help="list the built-in models")
    args = parser.parse_args(argv)
    runners = {"extract": _run_extract, "models": _run_models}
    try:
        summary = runners[args.command](args)
    except LayerwaveError as err:
        print(f"layerwave: error: {err}", file=sys.stderr)
        return 2
    if summary:
        print(json.dumps(summary, indent=2))
        if getattr(args, "json", None):
            with open(args.json, "w") as handle:
                json.dump(summary, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
