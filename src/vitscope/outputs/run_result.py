"""``RunResult``: everything one command produced, as objects (the writer turns it into files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vitscope.analyses.result import Figure, Result

__all__ = ["RunResult"]


@dataclass
class RunResult:
    """What a command produced.

    Attributes:
        command: ``analyze``, ``compare``, ``probe``, ``explain-pair``, ``featviz``, ``experiment robustness``...
        title: the report's title; subtitle: one line under it.
        config: the resolved configuration (results.json ``config``).
        results: name -> typed :class:`~vitscope.analyses.result.Result` (results.json ``analyses``, one report
            section each, with its tables, arrays and figures).
        models: model identities (``vitscope.engine.provenance.model_identity``).
        data: the data's description with its fingerprint.
        num_images: images analysed (None when it does not apply).
        skipped: unreadable files (``SkippedImage`` records or ``{"path", "reason"}`` dicts).
        skipped_analyses: analyses of the chosen set (the defaults, a group) that could not run on the model
            and data: name -> reason (results.json ``skipped_analyses``, the report's "Analyses not run"); over
            several models, the reason names every model that left it out (one reason every model gave is said once).
        extra: further top-level results.json entries (JSON-able), e.g. ``hooks`` or ``best_blocks``.
        figures: figures that belong to the run rather than one result (drawn into ``figures/``), with the report
            section they go to (``(section title, Figure)``).
        tables: run-level CSV tables ``{stem: pandas DataFrame}`` (written to ``tables/``).
        sections: extra report sections (:class:`vitscope.report.model.Section`), after the results' own; their
            ``figures`` may hold :class:`Figure` objects (drawn by the writer) or the stems of result figures.
        own_sections: results whose default report section is left out (``sections`` present them instead).
        notes: warnings worth showing in the report.
        resumed_images: images a restored state already held (results.json ``run``).
        earlier_parts: how they were read, one entry per earlier part of the run (results.json ``run``, when
            resumed: :attr:`vitscope.engine.results.Results.earlier_parts`).
        workers: processes that decoded the images (results.json ``run``; None: not known to this command).
        processes: processes the run was split over (``torchrun``; results.json ``run``); None: not recorded.
        device: the device that ran (results.json ``run``; the GPU's name and CUDA version on a GPU:
            :func:`~vitscope.engine.settings.describe_device`); None: not recorded by this command.
        timing: what the passes cost (results.json ``run``: ``pass_seconds``, ``images_per_second``,
            ``loader_wait``; :func:`vitscope.engine.results.pass_timing`); None: no pass ran or not recorded.
        compile_fallback: why the statistics asked to compile (``--compile-stats``) ran op by op (results.json
            ``run`` and a note of the report); None: they compiled, or compiling was not asked for.
        files: other files, relative path -> contents (e.g. DAVIS palette PNGs under ``predictions/``).
    """

    command: str
    title: str = ""
    subtitle: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Result] = field(default_factory=dict)
    models: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    num_images: int | None = None
    skipped: list[Any] = field(default_factory=list)
    skipped_analyses: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    figures: list[tuple[str, Figure]] = field(default_factory=list)
    tables: dict[str, Any] = field(default_factory=dict)
    sections: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resumed_images: int = 0
    earlier_parts: list[dict[str, Any]] = field(default_factory=list)
    workers: int | None = None
    processes: int | None = None
    device: dict[str, str] | None = None
    timing: dict[str, float] | None = None
    compile_fallback: str | None = None
    own_sections: set[str] = field(default_factory=set)
    files: dict[str, bytes] = field(default_factory=dict)

    def skipped_records(self) -> list[dict[str, str]]:
        """The skipped files as ``{"path", "reason"}`` dicts."""
        return [s if isinstance(s, dict) else {"path": str(s.path), "reason": str(s.reason)} for s in self.skipped]
