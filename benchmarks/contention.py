"""The busy-machine guard, live: the same evaluation idle, then with CPU hogs started partway.

    python benchmarks/contention.py --head DIR [--model smollm2-135m] [--limit 8] [--max-new-tokens 48]
                                    [--hog-after 12] [--hog-seconds 15] [--out benchmarks/out/contention.json]

Runs `layerwave evaluate` (chain drafting, every prompt beside the target alone) twice on the same
prompts: once on an idle machine, once while one spinning process per CPU core runs from
`--hog-after` seconds into the run for `--hog-seconds`. Prints, for both runs, the speed-up with
its interval and the prompts the contention guard flags (tasks/decode/side_by_side.py: a prompt whose
relative round cost lies beyond 1.5x the run's median either way), and writes both results. The
idle run should flag nothing and the hogged one the prompts the hogs overlapped.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="layerwave-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from flows.evaluate import evaluate  # noqa: E402

GUARD_FIELDS = ("prompt", "tokens", "forwards", "seconds", "baseline_tokens", "baseline_seconds")


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def hogs_later(after: float, seconds: float) -> threading.Thread:
    """One spinning process per core, from `after` seconds from now, for `seconds`."""
    def run():
        time.sleep(after)
        stop_at = time.time() + seconds
        workers = [multiprocessing.Process(target=spin, args=(stop_at,)) for _ in range(os.cpu_count() or 2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def timed_run(args, hogged: bool) -> dict:
    began = time.perf_counter()
    thread = hogs_later(args.hog_after, args.hog_seconds) if hogged else None
    result = evaluate(model=args.model, head=args.head, bench=args.bench, limit=args.limit,
                      max_new_tokens=args.max_new_tokens, depth=args.depth)
    if thread is not None:
        thread.join()
    return {"hogged": hogged, "seconds": time.perf_counter() - began, "speedup": result["speedup"],
            "speedup_ci95": result["speedup_ci95"], "tau": result["tau"], "contention": result["contention"],
            "rows": [{k: r[k] for k in GUARD_FIELDS} for r in result["rows"]]}  # what the guard reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--bench", default="mt-bench")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--hog-after", type=float, default=12.0)
    parser.add_argument("--hog-seconds", type=float, default=15.0)
    parser.add_argument("--out", default="benchmarks/out/contention.json")
    args = parser.parse_args()
    runs = [timed_run(args, hogged) for hogged in (False, True)]
    for run in runs:
        flagged = run["contention"]["busy_prompts"]
        print(f"{'hogged' if run['hogged'] else 'idle  '}: speed-up {run['speedup']:.2f}x "
              f"(95% {run['speedup_ci95'][0]:.2f}–{run['speedup_ci95'][1]:.2f}), τ {run['tau']:.2f}, "
              f"flagged prompts {flagged or 'none'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": vars(args), "runs": runs}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
