"""Progress a person can read: which stage a run is in, how much is left, and when it should end.

ETAs come from the pace measured so far in this run, so they start after the first unit of
work and sharpen as it goes.
"""

from __future__ import annotations

import time

PIPELINE_STAGES = ("extract", "analyze", "select", "train", "evaluate", "report")  # generate runs inside extract


def duration(seconds: float) -> str:
    """42s, 3m05s, 1h12m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def stage_line(name: str, detail: str = "") -> str:
    """`[stage 4/6] train: head 2/4 [2, 18, 29]`."""
    number = PIPELINE_STAGES.index(name) + 1
    return f"[stage {number}/{len(PIPELINE_STAGES)}] {name}" + (f": {detail}" if detail else "")


class Pace:
    """Time left for `total` units of work from the pace of those done in this run (units
    skipped as already done are not counted: they took no time)."""

    def __init__(self, total: int):
        self.total, self.timed, self.seconds = total, 0, 0.0
        self.started: float | None = None

    def start(self) -> None:
        self.started = time.perf_counter()

    def finish(self, worked: bool = True) -> None:
        """One unit ended; `worked` False when it was skipped (already done)."""
        if worked and self.started is not None:
            self.timed, self.seconds = self.timed + 1, self.seconds + time.perf_counter() - self.started
        self.started = None

    def eta(self, done: int) -> str:
        """", or ", ETA 12m30s" for the `total − done` units left."""
        if not self.timed or done >= self.total:
            return ""
        return f", ETA {duration(self.seconds / self.timed * (self.total - done))}"


def rate_eta(done: float, total: float, elapsed: float) -> str:
    """", ETA 3m05s" at the average pace of `done` of `total` in `elapsed` seconds ("" before any)."""
    if done <= 0 or done >= total:
        return ""
    return f", ETA {duration(elapsed / done * (total - done))}"


class GenerationMeter:
    """A text progress bar with tokens/s and the time left, at most one line every `every` seconds
    (replies end one by one: a line each would flood the log)."""

    def __init__(self, logger, spent: int, budget: int, every: float = 10.0):
        self.logger, self.spent, self.budget, self.every = logger, spent, budget, every
        self.generated, self.started, self.shard = 0, time.perf_counter(), 0
        self.last_line = self.started

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def due(self) -> bool:
        if time.perf_counter() - self.last_line < self.every:
            return False
        self.last_line = time.perf_counter()
        return True

    def add(self, tokens: int) -> None:
        self.generated += tokens
        if not self.due():
            return
        rate = self.generated / max(self.elapsed(), 1e-9)
        total = self.spent + self.generated
        share = min(1.0, total / self.budget)
        bar = "#" * round(20 * share) + "." * (20 - round(20 * share))
        left = max(0, self.budget - total) / max(rate, 1e-9)
        self.logger.info("generate [%s] %3.0f%% %d/%d reply tokens, shard %d, %.0f tokens/s, ~%.0f min left", bar,
                         100 * share, total, self.budget, self.shard, rate, left / 60)

    def beat(self, step: int) -> None:
        """A line while replies are still generating and none has ended for a while."""
        if self.due():
            self.logger.info("generate: shard %d, step %d, %s elapsed", self.shard, step, duration(self.elapsed()))
