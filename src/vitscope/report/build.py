"""Build the report of any command from its :class:`~vitscope.outputs.run_result.RunResult`: one section per
typed result (its intro, drawn figures with their captions, tables from its summary, an explorer where the result
declares one), the run's own figures and sections, and the summary of what was run."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitscope.report.model import FigureItem, Report, Section, Table, figure_item
from vitscope.report.sections import explorer_of, resolved_config, slug, summary_rows
from vitscope.report.tables import summary_tables
from vitscope.viz.labels import display_name

__all__ = ["build_report"]

#: single images an analysis report's explorer offers (the chosen images beyond them stay figures)
EXPLORER_IMAGES = 4


def _title(name: str) -> str:
    return display_name(name)


def _items(drawn: list[tuple[Any, Path | None]]) -> list[FigureItem]:
    return [figure_item(fig, path) for fig, path in drawn]


#: skipped files listed in the page (results.json lists every one)
SKIPPED_SHOWN = 100


def _skipped_section(skipped: list[Mapping[str, Any]]) -> Section:
    rows = [[str(s.get("path", "")), str(s.get("reason", ""))] for s in skipped[:SKIPPED_SHOWN]]
    more = len(skipped) - len(rows)
    note = f"{more} more in results.json" if more > 0 else ""
    return Section("skipped-files", "Skipped files", "Files that could not be read as images; the run went on "
                   "without them (--strict stops at the first one instead).",
                   tables=[Table(f"{len(skipped)} skipped file(s)", ["file", "reason"], rows, note)])


def _chart_numbers(chart: Mapping[str, Any]) -> str | None:
    """What a heat-map chart shows, without its titles, to the 5 digits a reader sees (one analysis sums in
    float32, another in float64): two with the same matrices on the same axes are one. None for curves (a few
    per-block scores may be equal by chance, e.g. two probes at 1 everywhere)."""
    import json

    def shown(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.5g}")
        return [shown(v) for v in value] if isinstance(value, list) else value

    panels = chart.get("panels", [])
    if not panels or any(p.get("kind") != "heatmap" or len(p.get("rows", [])) * len(p.get("columns", [])) < 4
                         for p in panels):
        return None
    return json.dumps([{k: shown(v) for k, v in p.items() if k != "title"} for p in panels], sort_keys=True,
                      default=str)


def _unique_ids(sections: list[Section]) -> None:
    """One id per section: labels that slug alike (``@x`` and ``@X``, ``a.b`` and ``a-b``, letters outside ASCII)
    get ``-2``, ``-3``... in order, so every link of the navigation reaches its own section."""
    seen: set[str] = set()
    for section in sections:
        base, n = section.id, 1
        while section.id in seen:
            n += 1
            section.id = f"{base}-{n}"
        seen.add(section.id)


def _drop_repeated_tables(sections: list[Section]) -> None:
    """A table or chart whose numbers another section already shows (two analyses reporting the same mean
    entropy) is left out, with a line saying where it is; a section left with no figure, explorer or table of
    numbers beyond its settings is folded (its title says so)."""
    seen: dict[tuple, str] = {}
    charts: dict[str, str] = {}
    for section in sections:
        kept, repeated = [], []
        figures = []
        for item in section.figures:
            key = _chart_numbers(item.chart) if item.chart else None
            if key is not None and key in charts:
                repeated.append([f"{item.title} (chart)", charts[key]])
                continue
            if key is not None:
                charts.setdefault(key, section.title)
            figures.append(item)
        section.figures = figures
        for table in section.tables:
            quantity = table.title.split(": ", 1)[-1]  # only the same named quantity with the same numbers:
            key = (quantity, tuple(table.columns), tuple(tuple(map(str, row)) for row in table.rows))
            own = quantity in ("per block", "settings and scores")  # each analysis's own, equal by chance
            if len(table.rows) > 1 and not own and key in seen:
                repeated.append([table.title.split(": ", 1)[-1], seen[key]])
                continue
            seen.setdefault(key, section.title)
            kept.append(table)
        if repeated:
            kept.append(Table("The same numbers in another section", ["numbers", "shown in"], repeated))
        section.tables = kept
        only_settings = all(t.title.endswith("settings and scores") for t in section.tables)
        if not section.figures and not section.explorers and not section.pair_explorers and only_settings:
            section.folded = True


def _columns_of(result: Any, key: str) -> str | None:
    """The declared name of the second dimension of a result's ``[L, X]`` tensor ``key`` (None: not declared)."""
    try:
        dims = result.dims(key)
    except (KeyError, TypeError, AttributeError):  # a summary entry that is no tensor of the result
        return None
    return dims[1] if len(dims) == 2 and dims[0] == "block" and not dims[1].startswith("dim") else None


def build_report(run: Any, doc: Mapping[str, Any], drawn: Mapping[str, list[tuple[Any, Path]]],
                 extra: list[Section] | None = None) -> Report:
    """The report of one run.

    Args:
        run: the :class:`~vitscope.outputs.run_result.RunResult`.
        doc: its results.json document (for the summary rows and the tables).
        drawn: section key (a result's name, or ``run:<section title>``) -> ``[(Figure, PNG path)]``.
        extra: the run's own sections with their figures resolved (default: ``run.sections``).
    """
    sections = []
    for name, result in run.results.items():
        if name in run.own_sections:
            continue
        maps = result.explorer_maps()  # a result that declares an explorer gets one, whatever its name
        explorers = [explorer_of(result, max_images=EXPLORER_IMAGES)] if maps is not None else []
        summary = doc.get("analyses", {}).get(name, {}).get("summary", {})
        items, links = _items(drawn.get(name, [])), []
        if maps is not None:  # the explorer shows the dataset grid and its images' grids: their files are a link away
            shown = set(maps.figure_stems[:1 + EXPLORER_IMAGES])
            links = [(i.title, f"figures/{i.path.name}") for i in items if i.path is not None and i.stem in shown]
            items = [i for i in items if not (i.path is not None and i.stem in shown)]
        sections.append(Section(slug(name), _title(name), result.intro, items,
                                summary_tables(name, summary, functools.partial(_columns_of, result)),
                                explorers, figure_links=links))
    _drop_repeated_tables(sections)
    for key, items in drawn.items():
        if key.startswith("run:"):
            title = key[4:]
            sections.append(Section(slug(title), title, "", _items(items)))
    sections += list(run.sections if extra is None else extra)
    notes = list(run.notes)
    if run.compile_fallback:
        notes.append("The statistics asked to compile (--compile-stats) ran op by op: compiling failed "
                     f"({run.compile_fallback}). The numbers are the op-by-op pass's.")
    if doc.get("skipped"):
        notes.append(f"{len(doc['skipped'])} unreadable file(s) were skipped: see the section Skipped files.")
        sections.append(_skipped_section(doc["skipped"]))
    _unique_ids(sections)
    models = ", ".join(str(m.get("id", m.get("name"))) for m in doc.get("models", []))
    title = run.title or f"vitscope {run.command}" + (f": {models}" if models else "")
    subtitle = run.subtitle or (f"data: {doc.get('data', {}).get('name', '')}" if doc.get("data") else "")
    colour_keys = [str(m.get("display_name") or m.get("name") or m.get("id")) for m in doc.get("models", [])]
    return Report(title=title, subtitle=subtitle, summary=summary_rows(doc), config=resolved_config(doc),
                  sections=sections, notes=notes, colour_keys=colour_keys)
