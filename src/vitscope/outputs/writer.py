"""``write_run``: the one writer of every command's outputs.

Layout of an output folder::

    results.json          summaries a person reads (small tensors as lists, large ones as shape and mean)
    tables/*.csv          tables (per block, per head...) and tables/<name>.json (each result's summary)
    arrays/<name>.npz     large arrays (per-token means, patch maps), compressed, float64 as float32
    figures/*.png|svg     figures (pictures always; curves and heat maps with --figure-files)
    charts/*.json         the numbers of every curve and heat-map figure, drawn by the browser in the report
    (other files)         a command's own files, e.g. predictions/<sequence>/<frame>.png of DAVIS test-dev
    report.html           one self-contained page
    .vitscope-manifest.json   what this run wrote (the next run into the folder replaces exactly these)

Everything is written into a staging folder first and moved into place file by file (``os.replace``),
results.json last; the progress bar shows the writing. Figures are drawn first, all together
(:mod:`vitscope.outputs.drawing`: in forked workers when there are many).
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitscope._version import __version__
from vitscope.analyses.result import Figure
from vitscope.atomic import named_os_error
from vitscope.errors import VitscopeRuntimeError
from vitscope.outputs.folder import Staging, prepare_output
from vitscope.outputs.lock import releasing_outputs
from vitscope.outputs.run_result import RunResult
from vitscope.strict_json import dumps

__all__ = ["environment", "write_run"]


#: libraries whose versions decide the numbers (decoding, resizing, SIFT, probes), by their installed distributions
_LIBRARIES = {
    "numpy": ("numpy",),
    "pillow": ("pillow",),
    "opencv": ("opencv-python-headless", "opencv-python", "opencv-contrib-python-headless", "opencv-contrib-python"),
    "scikit-learn": ("scikit-learn",),
}


def environment() -> dict[str, Any]:
    """Versions that decide the numbers (results.json ``environment``): Python, torch, and those of numpy, Pillow,
    OpenCV and scikit-learn that are installed (read from their distributions: nothing is imported); and torch's
    intra-op threads, by which a training's float32 sums (guided MAE's, an SAE's) may round otherwise."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    found: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                             "torch_threads": torch.get_num_threads()}
    for name, distributions in _LIBRARIES.items():
        for distribution in distributions:
            try:
                found[name] = version(distribution)
                break
            except PackageNotFoundError:
                continue
    return found


class _Writer:
    def __init__(self, staging: Staging, advance: Callable[[], None]) -> None:
        self.staging, self.advance = staging, advance
        self.drawn: dict[str, list[Any]] = {}  # section key -> [(Figure, png path in staging or None)]

    def table(self, stem: str, frame: Any) -> str:
        rel = f"tables/{stem}.csv"
        frame.to_csv(self.staging.path(rel), index=False)
        self.advance()
        return rel

    def json(self, rel: str, doc: Any) -> str:
        self.staging.path(rel).write_text(dumps(doc, indent=1))
        return rel

    def arrays(self, name: str, arrays: dict[str, Any]) -> list[str]:
        if not arrays:
            return []
        from vitscope.analyses.result import save_arrays

        rel = f"arrays/{name}.npz"
        save_arrays(self.staging.path(rel), arrays)
        self.advance()
        return [rel]

    def section(self, section: Any) -> Any:
        """A run section with its figures resolved: its own Figure objects (drawn already, in order) and the
        stems of result figures looked up."""
        from vitscope.report.model import figure_item

        own = iter(self.drawn.get(f"section:{section.id}", []))
        items = []
        for fig in section.figures:
            if isinstance(fig, Figure):
                items.append(figure_item(*next(own)))
            elif isinstance(fig, str):
                found = [(f, p) for key, pairs in self.drawn.items() for f, p in pairs if f.stem == fig]
                items += [figure_item(f, p) for f, p in found[:1]]
            else:
                items.append(fig)
        return dataclasses.replace(section, figures=items)

    def figures(self, jobs: list[tuple[str, Figure]], meanwhile: Callable[[], None] | None = None,
                figure_files: bool = False) -> list[list[str]]:
        """Write every ``(section key, figure)``: a figure with a chart as ``charts/<stem>.json`` (and drawn too
        when ``figure_files``), any other drawn (in worker processes when there are many, while this process runs
        ``meanwhile``). Returns each one's files relative to the output folder and remembers, for the report,
        each figure with its PNG (None for a chart not drawn)."""
        from vitscope.outputs.drawing import draw_figures

        to_draw = [i for i, (_, fig) in enumerate(jobs) if fig.chart is None or figure_files]
        drawn = draw_figures([(jobs[i][1], self.staging.path(f"figures/{jobs[i][1].stem}")) for i in to_draw],
                             self.advance, meanwhile=meanwhile)
        paths: dict[int, list[Path]] = dict(zip(to_draw, drawn))
        files = []
        for i, (key, fig) in enumerate(jobs):
            written = list(paths.get(i, []))
            if fig.chart is not None:
                written.append(self.staging.path(f"charts/{fig.stem}.json"))
                written[-1].write_text(dumps(fig.chart.to_json()))
                if i not in paths:
                    self.advance()
            pngs = [p for p in written if p.suffix == ".png"]
            if pngs or fig.chart is not None:
                self.drawn.setdefault(key, []).append((fig, pngs[0] if pngs else None))
            files.append([p.relative_to(self.staging.root).as_posix() for p in written])
        return files


def _refuse_shared_files(owners: list[tuple[str, str]]) -> None:
    """Two results that would write the same file (the second silently replacing the first) are a bug of the
    command that built them: say which, before anything is written."""
    seen: dict[str, str] = {}
    for owner, rel in owners:
        if rel in seen:
            raise VitscopeRuntimeError(f"{seen[rel]!r} and {owner!r} would both write {rel} (the second replacing "
                                       "the first); give each result and figure its own name")
        seen[rel] = owner


def _with_columns(tables: dict[str, Any]) -> dict[str, Any]:
    """The tables that have columns: one without any would be a file no CSV reader opens."""
    return {stem: frame for stem, frame in tables.items() if len(frame.columns)}


@releasing_outputs  # its own call when called alone; inside a command, the command holds the folder
def write_run(out: str | Path, run: RunResult, progress: bool | None = None,
              log: Callable[[str], None] | None = None, figure_files: bool = False) -> Path:
    """Write every output of ``run`` into ``out`` (see the module docstring); returns results.json's path.

    Args:
        out: the output folder (created when missing; a file there is an error).
        run: what the command produced.
        progress: show a progress bar while writing (default: when stderr is a terminal).
        log: receives one-line messages.
        figure_files: also draw the PNG and SVG files of figures the report shows as charts (matplotlib; a few
            tenths of a second each).

    Raises:
        OutputError: ``out`` cannot be used.
    """
    from vitscope.engine.settings import progress_bar
    from vitscope.report.build import build_report
    from vitscope.report.render import render_html

    out = prepare_output(out)
    staging = Staging(out)
    try:
        results = dict(run.results)
        figures = {name: r.figures() for name, r in results.items()}
        tables = {name: _with_columns(r.tables()) for name, r in results.items()}
        run_tables = _with_columns(run.tables)
        arrays = {name: r.arrays() for name, r in results.items()}
        total = sum(len(v) for v in figures.values()) + sum(len(v) for v in tables.values()) + \
            sum(bool(v) for v in arrays.values()) + len(run.figures) + len(run_tables) + \
            sum(isinstance(f, Figure) for s in run.sections for f in s.figures)
        with progress_bar(progress) as bar:
            task = bar.add_task("writing outputs", total=max(total, 1), unit="files")
            writer = _Writer(staging, lambda: bar.advance(task))
            jobs = [(name, fig) for name in results for fig in figures[name]]
            jobs += [(f"run:{section}", fig) for section, fig in run.figures]
            jobs += [(f"section:{s.id}", fig) for s in run.sections for fig in s.figures if isinstance(fig, Figure)]
            _refuse_shared_files([(key, f"figures/{fig.stem}") for key, fig in jobs] +
                                 [(name, f"tables/{stem}") for name in results for stem in tables[name]] +
                                 [("run", f"tables/{stem}") for stem in run_tables])
            written: dict[str, dict[str, Any]] = {}

            def tables_and_arrays() -> None:
                for name, result in results.items():
                    files = {"tables": [writer.table(stem, frame) for stem, frame in tables[name].items()],
                             "arrays": writer.arrays(name, arrays[name])}
                    files["tables"].append(writer.json(f"tables/{name}.json", result.to_json()))
                    written[name] = files
                written[""] = {"tables": [writer.table(s, f) for s, f in run_tables.items()]}

            drawn = iter(writer.figures(jobs, meanwhile=tables_and_arrays, figure_files=figure_files))
            entries = {}
            for name, result in results.items():
                files = {"tables": written[name]["tables"], "figures": [f for _ in figures[name] for f in next(drawn)],
                         "arrays": written[name]["arrays"]}
                entries[name] = {"summary": result.to_json(), "files": files}
            run_files: dict[str, list[str]] = {"tables": written[""]["tables"],
                                               "figures": [f for _ in run.figures for f in next(drawn)]}
            run_files["figures"] += [f for s in run.sections for fig in s.figures if isinstance(fig, Figure)
                                     for f in next(drawn)]
            sections = [writer.section(s) for s in run.sections]
            for rel, content in run.files.items():
                staging.path(rel).write_bytes(content)
        doc = {"vitscope_version": __version__, "command": run.command, "config": run.config, "models": run.models,
               "data": run.data}
        if run.num_images is not None:
            doc["num_images"] = run.num_images
        doc["skipped"] = run.skipped_records()
        doc["skipped_analyses"] = [{"analysis": name, "reason": why} for name, why in run.skipped_analyses.items()]
        doc["analyses"] = entries
        doc.update(run.extra)
        if run.files:
            run_files["other"] = list(run.files)
        if run_files["tables"] or run_files["figures"] or run.files:
            doc["files"] = run_files
        doc["environment"] = environment()
        doc["run"] = {"resumed_images": run.resumed_images}
        if run.earlier_parts:  # a resumed run: how its saved images were read
            doc["run"]["earlier_parts"] = run.earlier_parts
        if run.processes is not None:
            doc["run"]["processes"] = run.processes
        if run.workers is not None:
            doc["run"]["workers"] = run.workers
        if run.device is not None:  # config.device is as given ("auto"): this is what it chose
            doc["run"]["device"] = run.device
        if run.timing is not None:
            doc["run"].update(run.timing)
        if run.compile_fallback:
            doc["run"]["compile_fallback"] = run.compile_fallback
        writer.json("results.json", doc)
        report = build_report(run, doc, writer.drawn, sections)
        staging.path("report.html").write_text(render_html(report), encoding="utf-8")
        staging.publish(last=["report.html", "results.json"])
    except BaseException as err:
        staging.discard()
        named = named_os_error(err, out)  # a write's error (a full disk) names no file: name the folder
        if named is None:
            raise
        raise named from err
    return out / "results.json"
