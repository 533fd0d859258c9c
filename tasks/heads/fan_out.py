"""A round's heads side by side (`layerwave run --workers N` or `--dask-address`): each head is a
Prefect task on a Dask cluster, one head per worker at a time (prefect-dask's task runner). Without
either, heads run one after another in the flow's own process. Both ways hand back each head as it
finishes, so the round publishes it at once and a killed run loses no finished head.

On a local cluster each head gets an equal share of the cores as its thread budget (`threads`), so
two workers on two cores do not oversubscribe them; on a user's cluster a head keeps its worker
process's torch threads (one: Dask's nanny starts worker processes with OMP_NUM_THREADS=1), and a
head asks for one `GPU` where workers declare that resource.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

@dataclass
class HeadPool:
    """Where a run's heads train: `workers` local processes, the cluster at `dask_address`, or
    neither (in process). The cluster starts at the first head that needs it and stops on close."""

    workers: int | None = None
    dask_address: str | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    _runner: Any = field(default=None, repr=False)
    _gpus: bool = field(default=False, repr=False)

    @property
    def parallel(self) -> bool:
        return bool(self.workers or self.dask_address)

    @property
    def threads(self) -> int | None:
        """Each head's torch threads on a local cluster: the cores shared out among its workers."""
        return max(1, (os.cpu_count() or 1) // self.workers) if self.workers else None

    def where(self) -> str:
        """`on the Dask cluster at tcp://…`, `on 2 local Dask workers`, or `in this process`."""
        if self.dask_address:
            return f"on the Dask cluster at {self.dask_address}"
        return f"on {self.workers} local Dask workers" if self.workers else "in this process"

    def finished(self, job, jobs: dict[int, dict]) -> Iterator[tuple[int, Any]]:
        """(number, result) of the task `job` called with each of `jobs`' parameters on the
        cluster, in the order they finish."""
        from prefect.futures import as_completed

        runner = self._started()
        with _annotated(self._gpus):
            futures = {runner.submit(job, parameters=parameters): number for number, parameters in jobs.items()}
        for future in as_completed(list(futures)):
            yield futures[future], future.result()

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> HeadPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _started(self):
        if self._runner is None:
            from prefect_dask import DaskTaskRunner

            if self.dask_address:
                self._gpus = _declares_gpus(self.dask_address)
                runner = DaskTaskRunner(address=self.dask_address)
            else:
                runner = DaskTaskRunner(cluster_kwargs={"n_workers": self.workers, "threads_per_worker": 1,
                                                        "processes": True, "dashboard_address": None})
            self._runner = self._stack.enter_context(runner)
        return self._runner


def _declares_gpus(address: str) -> bool:
    """Whether any worker of the cluster declares a `GPU` resource (`dask worker --resources GPU=1`)."""
    from tasks.dask_cluster import connect

    with connect(address, "train heads one after another in this process") as client:
        return any(worker.get("resources", {}).get("GPU") for worker in client.scheduler_info()["workers"].values())


def _annotated(gpus: bool):
    """Each head takes one GPU of its worker, where workers declare GPUs."""
    if not gpus:
        return contextlib.nullcontext()
    import dask

    return dask.annotate(resources={"GPU": 1})
