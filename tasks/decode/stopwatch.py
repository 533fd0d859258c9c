"""Wall time per named part of a decoding round, for the round profile (benchmarks/evaluate.py).

A GPU runs work asynchronously, so each part synchronises the device on entry and exit: the time
is charged to the part that queued the work, not to whichever part happens to wait for it.
Decoding takes `NO_STOPWATCH` by default, whose parts cost one `nullcontext` each.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext

import torch


def device_sync(device: torch.device | str):
    """What waits for `device`'s queued work before a clock is read (nothing on a CPU)."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


class Stopwatch:
    def __init__(self, device: torch.device | str = "cpu"):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._sync = device_sync(device)

    @contextmanager
    def part(self, name: str):
        self._sync()
        began = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - began
            self.calls[name] += 1


class _Off(Stopwatch):
    def part(self, name: str):
        return nullcontext()


NO_STOPWATCH = _Off()
