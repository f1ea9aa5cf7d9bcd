"""What :func:`vitscope.run` returns: every analysis's result with what the pass saw, and the error of a pass that
could read no image."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from vitscope.analyses.base import Result
from vitscope.errors import VitscopeRuntimeError

__all__ = ["EmptyRunError", "Results", "pass_timing", "run_record"]


class EmptyRunError(VitscopeRuntimeError):
    """No image of the dataset could be read."""


def pass_timing(images: int, seconds: float, loader_seconds: float) -> dict[str, float] | None:
    """results.json's account of what passes cost: ``pass_seconds``, ``images_per_second`` and ``loader_wait`` (the
    share of the time spent waiting for decoded images); None when no pass ran (every feature was cached)."""
    if seconds <= 0:
        return None
    return {"pass_seconds": round(seconds, 6), "images_per_second": round(images / seconds, 3),
            "loader_wait": round(min(max(loader_seconds / seconds, 0.0), 1.0), 3)}


def run_record(passes: Any) -> dict[str, Any]:
    """``RunResult``'s fields for results.json's ``run`` from a pass (:class:`Results`) or a tally of passes
    (``vitscope.engine.run.PassTally``): the images restored states held and how they were read, the loading
    workers, the processes and :func:`pass_timing`."""
    fallback = getattr(passes, "compile_fallback", None)  # asked to compile, ran op by op: why
    return {"resumed_images": passes.resumed_images, "earlier_parts": passes.earlier_parts,
            "workers": passes.workers, "processes": passes.processes, "timing": passes.timing(),
            **({"compile_fallback": fallback} if fallback else {})}


@dataclass
class Results(Mapping[str, Result]):
    """Mapping from each analysis's name to its Result, plus what the run saw.

    Attributes:
        results: name -> Result.
        num_images: images fed to the analyses.
        skipped: ``SkippedImage`` records of unreadable files.
        hooks: canonical names recorded.
        data: the source's description with its fingerprint (the data entry of results.json).
        resumed_images: images the restored state already held (0 when the run started afresh).
        workers: the processes that decoded the images (0: a thread of the running process).
        grids: ``"HxW"`` token grid (CNN: feature map) -> images that ran at it, most images first (one entry
            unless images keep their aspect ratio); a resumed run counts those of the saved state too.
        compile_stats: the shared attention statistics ran through ``torch.compile`` (:func:`vitscope.run`).
        compile_fallback: why they ran op by op although ``compile_stats`` was asked for (None: they did not).
        seconds: wall time of this process's pass, from asking for the first batch to the last update (no start-up,
            no merging across processes, no writing).
        loader_seconds: the part of ``seconds`` spent waiting for the loader's next batch (near 0 when the model,
            not the decoding, sets the pace).
        earlier_parts: how the images a restored state held were read, one entry per earlier part of the run
            (``images`` it added in the process that kept the state, ``batch_size``, ``workers``); empty when
            the run started afresh.
        processes: the processes of the run (``torchrun``'s world size; 1 alone). ``workers``, ``seconds`` and
            ``loader_seconds`` are this process's; ``num_images`` counts every process's.
    """

    results: dict[str, Result]
    num_images: int
    skipped: list = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    resumed_images: int = 0
    workers: int = 0
    grids: dict[str, int] = field(default_factory=dict)
    compile_stats: bool = False
    seconds: float = 0.0
    loader_seconds: float = 0.0
    processes: int = 1
    earlier_parts: list[dict[str, Any]] = field(default_factory=list)
    compile_fallback: str | None = None

    def timing(self) -> dict[str, float] | None:
        """:func:`pass_timing` of this pass (the images it fed, not those a restored state held)."""
        return pass_timing(self.num_images - self.resumed_images, self.seconds, self.loader_seconds)

    def __getitem__(self, name: str) -> Result:
        return self.results[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def _repr_html_(self) -> str:
        """The run in Jupyter: what it saw, then one card per result (as the report's sections)."""
        from vitscope.viz.notebook import cards_html

        lines = [f"{self.num_images} images" + (f", {len(self.skipped)} skipped" if self.skipped else ""),
                 f"data: {self.data.get('name', '')}" if self.data else ""]
        return cards_html("vitscope results", [line for line in lines if line],
                          [r._repr_html_() for r in self.results.values()])
