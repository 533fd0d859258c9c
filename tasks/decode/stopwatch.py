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


class Stopwatch:
    def __init__(self, device: torch.device | str = "cpu"):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        cuda = torch.device(device).type == "cuda"
        self._sync = torch.cuda.synchronize if cuda else (lambda: None)

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
