"""Timing helpers shared by the benchmark scripts: CPU load of other processes during a timed block, and a
device synchronisation before reading the clock."""

from __future__ import annotations

import os
import time

import torch


class OtherLoad:
    """CPU used by OTHER processes while the block runs, in cores (Linux /proc; 0.0 elsewhere).

    System-wide busy ticks from ``/proc/stat`` minus this process's own ticks from ``/proc/self/stat``,
    divided by the wall time. Lets the benchmark tell rounds that shared the CPU from quiet ones.
    """

    _tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @staticmethod
    def _sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                vals = [int(x) for x in f.readline().split()[1:]]
            with open("/proc/self/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            return None
        busy = sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)  # minus idle and iowait
        own = int(fields[11]) + int(fields[12])  # utime + stime of all threads
        return busy, own

    def __enter__(self) -> OtherLoad:
        self.cores = 0.0
        self._t0, self._s0 = time.perf_counter(), self._sample()
        return self

    def __exit__(self, *exc) -> None:
        s1, wall = self._sample(), time.perf_counter() - self._t0
        if self._s0 is None or s1 is None or wall <= 0:
            return
        other_ticks = (s1[0] - self._s0[0]) - (s1[1] - self._s0[1])
        self.cores = max(0.0, other_ticks / self._tick / wall)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class CompileRecord:
    """Around the run that pays ``torch.compile``'s compilation: its seconds, and whether it fell back to op by op
    (a ``CompileFallbackWarning``: no compiler on the machine), so a JSON never passes op-by-op numbers off as
    compiled ones. ``as_dict()`` after the block."""

    def __enter__(self) -> CompileRecord:
        import warnings

        from vitscope.functional.compiled import CompileFallbackWarning

        self._caught = warnings.catch_warnings(record=True)
        self._warnings = self._caught.__enter__()
        warnings.simplefilter("always", CompileFallbackWarning)
        self._category = CompileFallbackWarning
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
        self._caught.__exit__(*exc)
        self.fallbacks = [str(w.message) for w in self._warnings if issubclass(w.category, self._category)]

    def as_dict(self) -> dict:
        return {"compiled": not self.fallbacks, "warm_up_s": round(self.seconds, 2), "fallbacks": self.fallbacks}
