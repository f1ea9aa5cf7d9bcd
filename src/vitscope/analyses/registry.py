"""The analysis registry: ``@register_analysis`` on the class, in its own file (timm's ``@register_model``).

The CLI's ``--analyses``, the groups, the defaults of ``vitscope analyze``, the report and the contract tests
discover analyses here and nowhere else, and every command asks :func:`obstacle` whether an analysis can run on a
model and data. Adding one is one file::

    @vitscope.register_analysis("token_norm", groups=("representation",))
    class TokenNorm(vitscope.Analysis):
        ...

The first read of :data:`ANALYSES` or :data:`GROUPS` imports every module of the analyses package and the
plug-ins of the ``vitscope.analyses`` entry points (:mod:`vitscope.analyses.plugins`), so no list names the
analyses. They are kept in the order of their ``order=`` (the order of the defaults and of their results),
then in registration order.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from vitscope.analyses.base import Analysis
from vitscope.analyses.data_checks import DataFacts
from vitscope.errors import DegenerateDataError, VitscopeUsageError, VitscopeValueError
from vitscope.models.spec import ModelSpec

__all__ = ["ANALYSES", "GROUPS", "Obstacle", "default_analyses", "get_analysis", "not_run_text", "obstacle",
           "refuse_what_cannot_run", "register_analysis", "skipped_defaults", "unknown_analysis", "why_cannot_run",
           "why_skipped"]

_ANALYSES: dict[str, type[Analysis]] = {}
_GROUPS: dict[str, tuple[str, ...]] = {}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_LOADED = False
_BROKEN: list[Exception] = []  # the plug-in error of the first load, raised again by every later one


def _load() -> None:
    """Import the built-in analyses and the entry points' plug-ins, once: each registers where it is defined. A
    broken plug-in stops every use of the registry in this process with its own error (not a later 'unknown
    analysis', nor a built-in run in place of the plug-in that clashed with it)."""
    global _LOADED
    if _BROKEN:
        raise _BROKEN[0]
    if _LOADED:
        return
    _LOADED = True  # first: the modules imported below register through the decorator, which reads the tables
    from vitscope.analyses.plugins import import_builtins, import_entry_points

    import_builtins()
    try:
        import_entry_points()
    except Exception as err:
        _BROKEN.append(err)
        raise


class _Loaded(Mapping):
    """A read-only view of a registry table whose first read imports every analysis (:func:`_load`)."""

    def __init__(self, table: dict[str, Any]) -> None:
        self._table = table

    def __getitem__(self, key: str) -> Any:
        _load()
        return self._table[key]

    def __iter__(self) -> Iterator[str]:
        _load()
        return iter(self._table)

    def __len__(self) -> int:
        _load()
        return len(self._table)

    def __repr__(self) -> str:
        return repr(dict(self))


#: name -> analysis class, by ``order`` then registration (a live, read-only view).
ANALYSES: Mapping[str, type[Analysis]] = _Loaded(_ANALYSES)
#: group -> member names (``--analyses attention``), in the order of :data:`ANALYSES` (a live, read-only view).
GROUPS: Mapping[str, tuple[str, ...]] = _Loaded(_GROUPS)

A = TypeVar("A", bound=type[Analysis])


def _place(cls: type[Analysis]) -> tuple[bool, int]:
    """Sort key of a registered class: those with an ``order`` first, by it; the sort is stable, so registration
    order decides the rest."""
    order = getattr(cls, "order", None)
    return order is None, order or 0


def _reorder() -> None:
    """Sort :data:`ANALYSES` by :func:`_place` and rebuild the groups from their members, in that order."""
    ordered = sorted(_ANALYSES.items(), key=lambda item: _place(item[1]))
    _ANALYSES.clear()
    _ANALYSES.update(ordered)
    groups: dict[str, list[str]] = {}
    for name, cls in ordered:
        for group in cls.groups:
            groups.setdefault(group, []).append(name)
    _GROUPS.clear()
    _GROUPS.update({group: tuple(members) for group, members in groups.items()})


def _same_class(a: type, b: type) -> bool:
    """Whether two classes are one class imported twice: the same name in the same module, or in the same file
    imported under two module names (``--import my_lab/token_norm.py`` and an entry point ``my_lab.token_norm``)."""
    if a.__qualname__ != b.__qualname__:
        return False
    if a.__module__ == b.__module__:
        return True
    files = [getattr(sys.modules.get(c.__module__), "__file__", None) for c in (a, b)]
    return None not in files and os.path.realpath(files[0]) == os.path.realpath(files[1])


def register_analysis(name: str, *, groups: Collection[str] = (), default: bool = True,
                      order: int | None = None) -> Callable[[A], A]:
    """Class decorator: make an :class:`~vitscope.analyses.base.Analysis` available by ``name``.

    Args:
        name: lower-case identifier used by ``--analyses``, ``results.json`` and the report.
        groups: group names that include it (``--analyses attention`` runs every member that can run).
        default: part of ``vitscope analyze`` without ``--analyses`` (when the model and data support it).
        order: where it stands in listings, among the defaults and in the results (lower first); None: after
            every analysis that has one, in registration order.

    Raises:
        ValueError: a bad name, a class that is not an Analysis, or a name another class already holds.
    """
    if not _NAME.match(name):
        raise VitscopeValueError(f"analysis name {name!r} must be lower case letters, digits and '_', starting with a "
                                 "letter")
    bad = [g for g in groups if not _NAME.match(g)]
    if bad:
        raise VitscopeValueError(f"group names {bad} must be lower case letters, digits and '_'")
    if order is not None and (isinstance(order, bool) or not isinstance(order, int)):
        raise VitscopeValueError(f"order of analysis {name!r} must be an integer or None, got {order!r}")

    def decorate(cls: A) -> A:
        if not (isinstance(cls, type) and issubclass(cls, Analysis)):
            raise VitscopeValueError(f"@register_analysis({name!r}) decorates vitscope.Analysis subclasses, got "
                                     f"{cls!r}")
        if not cls.__module__.startswith(f"{__package__}."):
            _load()  # another package's name is checked against every built-in one
        held = _ANALYSES.get(name)
        if held is not None and not _same_class(held, cls):
            raise VitscopeValueError(f"analysis name {name!r} is already registered by "
                                     f"{held.__module__}.{held.__qualname__}")
        if name in _GROUPS:
            raise VitscopeValueError(f"analysis name {name!r} is already the name of a group")
        clash = [group for group in groups if group in _ANALYSES]
        if clash:
            raise VitscopeValueError(f"group name {clash[0]!r} is already the name of an analysis")
        cls.name = name
        cls.groups = tuple(groups)
        cls.default = bool(default)
        cls.order = order
        _ANALYSES[name] = cls
        _reorder()
        return cls

    return decorate


def unknown_analysis(name: str, known: Collection[str] | None = None, groups: Collection[str] | None = None
                     ) -> ValueError:
    """The one-line error for an unknown analysis name: the closest known name or group, then all of them."""
    names = sorted(ANALYSES if known is None else known)
    group_names = sorted(GROUPS if groups is None else groups)
    close = difflib.get_close_matches(str(name), names + group_names, n=1, cutoff=0.4)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    listed = f" Groups: {', '.join(group_names)}." if group_names else ""
    return VitscopeUsageError(f"unknown analysis '{name}'.{hint} Known analyses: {', '.join(names)}.{listed}")


def get_analysis(name: str, **kwargs: Any) -> Analysis:
    """Instantiate the analysis registered as ``name`` with ``kwargs``.

    Raises:
        ValueError: unknown name; the one-line message suggests the closest name and lists all.
    """
    try:
        cls = ANALYSES[name]
    except KeyError:
        raise unknown_analysis(name) from None
    return cls(**kwargs)


@dataclass(frozen=True)
class Obstacle:
    """Why an analysis cannot run on a model and data: every command asks :func:`obstacle` and words it from here.

    Attributes:
        reason: the one-line error (``analysis 'saliency_iou' needs ground truth masks, ...``).
        short: the reason a run lists the analysis as not run with (``the data has no object masks``).
        by_data: the data is to blame (missing ground truth, one class...), not the model: a comparison of several
            models leaves out what a model cannot run but refuses what the data cannot feed.
    """

    reason: str
    short: str
    by_data: bool

    def error(self) -> VitscopeValueError:
        """The error to raise: a :class:`~vitscope.errors.DegenerateDataError` when the data is to blame."""
        return DegenerateDataError(self.reason) if self.by_data else VitscopeValueError(self.reason)


#: what each kind of ground truth is called in the list of analyses not run
_TARGET_WORDS = {"label": "image labels", "masks": "object masks", "instance_labels": "labels of its masks",
                 "regions": "region masks"}


def obstacle(analysis: Analysis, spec: ModelSpec, data: DataFacts) -> Obstacle | None:
    """Why ``analysis`` cannot run on the model ``spec`` with ``data`` (None when it can): the one place that
    decides it, from the analysis's :meth:`~vitscope.analyses.base.Analysis.why_unsupported`, its hooks, and
    :meth:`~vitscope.analyses.base.Analysis.why_unsupported_data`. The model is asked first.
    """
    reason = analysis.why_unsupported(spec)
    if not reason and not analysis.hooks_exist(spec):
        kind = "a CNN and has no attention" if analysis.needs_attention and not spec.is_transformer else \
            "missing hooks it needs"
        reason = f"analysis '{analysis.name}' cannot run on {spec.name}: the model is {kind}"
    if reason:
        return Obstacle(reason, reason.removeprefix(f"analysis '{analysis.name}' "), by_data=False)
    reason = analysis.why_unsupported_data(data)
    if not reason:
        return None
    missing = sorted(set(analysis.required_targets) - data.targets)
    short = "the data has no " + " and no ".join(_TARGET_WORDS.get(m, m) for m in missing) if missing else reason
    return Obstacle(reason, short, by_data=True)


def _facts(targets: Collection[str], data: DataFacts | None) -> DataFacts:
    return data if data is not None else DataFacts(targets=targets)


def why_cannot_run(analysis: Analysis, spec: ModelSpec, targets: Collection[str],
                   data: DataFacts | None = None) -> str | None:
    """One-line reason ``analysis`` cannot run on ``spec`` with data giving ``targets`` (None when it can):
    :func:`obstacle`'s reason.

    Args:
        analysis: the configured analysis.
        spec: the model's ModelSpec.
        targets: ground-truth keys the data provides.
        data: what is known of the data before the pass (its labels...: one class, no labels and the like are
            reasons too; its own ``targets`` are then the ones checked); default: only ``targets``.
    """
    found = obstacle(analysis, spec, _facts(targets, data))
    return found.reason if found else None


def why_skipped(analysis: Analysis, spec: ModelSpec, targets: Collection[str],
                data: DataFacts | None = None) -> str | None:
    """The short reason a run lists ``analysis`` as not run (``"the data has no object masks"``), None when it can
    run: :func:`obstacle`'s short form."""
    found = obstacle(analysis, spec, _facts(targets, data))
    return found.short if found else None


def refuse_what_cannot_run(analyses: Sequence[Analysis], spec: ModelSpec, data: DataFacts) -> None:
    """Raise the first analysis's :func:`obstacle` as its error (nothing when every analysis can run)."""
    for analysis in analyses:
        found = obstacle(analysis, spec, data)
        if found:
            raise found.error()


def refuse_what_the_view_cannot_feed(analyses: Sequence[Analysis], view: Any) -> None:
    """Raise for the first analysis that reads ``batch.pixels`` when ``view`` gives none (a tiled view)."""
    if view is None or getattr(view, "gives_pixels", True):
        return
    for analysis in analyses:
        if analysis.needs_pixels:
            raise VitscopeValueError(
                f"analysis '{analysis.name}' reads each batch's input pixels (batch.pixels), "
                f"which the {getattr(view, 'name', 'given')} view does not give: its token grids are stitched from "
                "several forwards per image; run it without that view")


def skipped_defaults(spec: ModelSpec, targets: Collection[str] | None = None,
                     data: DataFacts | None = None) -> dict[str, str]:
    """Default analyses that cannot run on ``spec`` and the data: name -> short reason (:func:`why_skipped`), in
    registration order; :func:`default_analyses` runs the others."""
    have = frozenset(targets or ())
    reasons = {name: why_skipped(cls(), spec, have, data) for name, cls in ANALYSES.items()
               if getattr(cls, "default", True)}
    return {name: reason for name, reason in reasons.items() if reason is not None}


def not_run_text(not_run: Mapping[str, str]) -> str:
    """``{"clustering": why, "knn_probe": why}`` -> ``clustering, knn_probe (why)``: one line, grouped by reason."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in not_run.items():
        by_reason.setdefault(reason, []).append(name)
    return "; ".join(f"{', '.join(names)} ({reason})" for reason, names in by_reason.items())


def default_analyses(spec: ModelSpec, targets: Collection[str] | None = None,
                     data: DataFacts | None = None) -> list[Analysis]:
    """One default-configured instance of every default analysis that can run on ``spec`` and the data.

    Args:
        spec: the model's ModelSpec.
        targets: ground-truth keys the dataset provides (``batch.targets``, e.g. ``{"masks"}``); analyses
            with ``required_targets`` (saliency needs masks) are left out unless all of theirs are here.
            None counts as none.
        data: what is known of the data (:class:`~vitscope.analyses.data_checks.DataFacts`): analyses that
            cannot score it (probes on one class...) are left out too; :func:`why_cannot_run` says why.
    """
    have = frozenset(targets or ())
    instances = [cls() for cls in ANALYSES.values() if getattr(cls, "default", True)]
    return [a for a in instances if why_cannot_run(a, spec, have, data) is None]
