"""Choosing and configuring analyses by name: groups, instance labels and parameters from text or YAML.

A selection is a list of names: an analysis (``cka``), a group (``representation``), either with an instance
label (``cka@cls``, ``representation@cls``) so that two configurations of one analysis run side by side. Its
parameters are the analysis's constructor arguments, given per analysis, group or label::

    --param knn_probe.k=20 --param representation.tokens=cls --param cka@cls.tokens=cls

or as a ``params:`` mapping in a YAML config (``{knn_probe: {k: 20}}``). A parameter given to a group goes to
every member that takes it; one given to an analysis, a label or an instance overrides it. Values given as
text are read as YAML scalars (``20``, ``0.5``, ``true``, ``none``) and comma-separated lists, then checked
against the constructor's annotations; the constructor checks the rest. Every mistake is one line that
names the parameter and what is allowed.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Collection, Mapping, Sequence
from types import NoneType, UnionType
from typing import Any

from vitscope.analyses.base import Analysis
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.registry import ANALYSES, GROUPS, Obstacle, obstacle, unknown_analysis
from vitscope.errors import VitscopeTypeError, VitscopeUsageError, VitscopeValueError
from vitscope.models.spec import ModelSpec

__all__ = ["ParameterError", "build_analyses", "describe_parameters", "parameters_of", "parse_param_assignments",
           "typed_params"]

#: constructor arguments that are not analysis parameters (they say where work files go)
HIDDEN = ("workdir",)


class ParameterError(VitscopeUsageError):
    """A parameter that does not exist, cannot be converted, or that the analysis refuses (one line)."""


def parse_param_assignments(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["knn_probe.k=20", "cka@cls.tokens=cls"]`` -> ``{"knn_probe": {"k": "20"}, "cka@cls": {"tokens": "cls"}}``.

    Raises:
        ParameterError: an item that is not ``NAME.KEY=VALUE``.
    """
    out: dict[str, dict[str, str]] = {}
    for item in items:
        target, eq, value = item.partition("=")
        name, dot, key = target.strip().rpartition(".")
        if not eq or not dot or not name or not key:
            raise ParameterError(f"--param {item!r}: write ANALYSIS.PARAMETER=VALUE, e.g. --param knn_probe.k=20")
        out.setdefault(name, {})[key.strip()] = value.strip()
    return out


def parameters_of(cls: type[Analysis]) -> dict[str, inspect.Parameter]:
    """The settable constructor arguments of an analysis class, by name."""
    signature = inspect.signature(cls.__init__)
    return {name: p for name, p in list(signature.parameters.items())[1:]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in HIDDEN}


def _documented(cls: type[Analysis]) -> dict[str, str]:
    """``{parameter: text}`` from the ``Args:`` sections of the class's docstring and its bases' (a subclass
    documents what it changes)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if "__doc__" in vars(klass) and klass.__doc__:
            out.update(_args_section(klass.__doc__))
    return out


def _args_section(docstring: str) -> dict[str, str]:
    """``{parameter: text}`` of one Google-style ``Args:`` section (``a, b: text`` documents both;
    ``a: text; b: text`` on one line documents each)."""
    import re

    doc, out, current = inspect.cleandoc(docstring).replace("``", ""), {}, []
    lines = doc.split("Args:", 1)[1].splitlines()[1:] if "Args:" in doc else []
    for line in lines:
        if line and not line.startswith(" "):  # the section ended
            break
        text = line.strip()
        if not (line.startswith("    ") and not line.startswith("     ")):  # a continuation line
            if current and text:
                for n in current:
                    out[n] += " " + text
            continue
        for part in re.split(r";\s+(?=[a-z_]\w*(?:, [a-z_]\w*)*: )", text):
            head, colon, rest = part.partition(": ")
            names = [n.strip() for n in head.split(",")]
            if colon and all(n.isidentifier() for n in names):
                current = names
                for n in names:
                    out[n] = rest
            elif current:
                for n in current:
                    out[n] += " " + part
    return out


def describe_parameters(name: str) -> str:
    """The parameters of a registered analysis: name, default and meaning, one per line (``analyze --params-of``).

    Raises:
        VitscopeValueError: an unknown analysis name (with the names it may have meant).
    """
    if name not in ANALYSES:
        raise unknown_analysis(name)
    cls = ANALYSES[name]
    docs = _documented(cls)
    lines = [f"{name} parameters (-p {name}.KEY=VALUE):"]
    for key, p in parameters_of(cls).items():
        default = "" if p.default is inspect.Parameter.empty else f" = {p.default!r}"
        lines.append(f"  {key}{default}" + (f"\n      {docs[key]}" if key in docs else ""))
    return "\n".join(lines) if len(lines) > 1 else f"{name} takes no parameters"


def _hints(cls: type[Analysis]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not resolve: fall back on the defaults' types
        return {}


def _options(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation (a plain annotation is its own single alternative)."""
    if typing.get_origin(hint) in (typing.Union, UnionType):
        return typing.get_args(hint)
    return (hint,)


def _is_sequence(hint: Any) -> bool:
    return typing.get_origin(hint) in (list, tuple, Sequence, Collection)


def _scalar(text: str) -> Any:
    import yaml

    if text.strip().lower() == "none":  # Python's spelling of YAML's null
        return None
    for number in (int, float):  # YAML 1.1 reads 1e3 and 1e-3 as strings
        try:
            return number(text.strip())
        except ValueError:
            pass
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _as(kind: Any, value: Any, text: str | None) -> Any:
    """``value`` as ``kind`` (int, float, bool, str), or raise TypeError."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise VitscopeTypeError("true or false")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                int(value) != value:
            raise VitscopeTypeError("an integer")
        return int(value)
    if kind is float:
        if isinstance(value, str):  # a YAML file's 1e-3 (YAML 1.1 reads it as a string)
            try:
                return float(value)
            except ValueError:
                raise VitscopeTypeError("a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise VitscopeTypeError("a number")
        return float(value)
    if kind is str:
        if isinstance(value, str):
            return value
        if text is not None:  # "--param cka.tokens=1" means the string "1"
            return text
        raise VitscopeTypeError("a string")
    return value


def convert(cls: type[Analysis], key: str, value: Any) -> Any:
    """A parameter value (text from the command line, or a YAML value) converted for ``cls(key=...)``.

    Raises:
        ParameterError: the value cannot be the parameter's type.
    """
    param = parameters_of(cls)[key]
    hint = _hints(cls).get(key, inspect.Parameter.empty)
    if hint is inspect.Parameter.empty:
        hint = type(param.default) if param.default not in (None, inspect.Parameter.empty) else Any
    text = value if isinstance(value, str) else None
    parsed = _scalar(value) if text is not None else value
    options = _options(hint)
    if parsed is None:
        if NoneType in options or param.default is None:
            return None
        raise ParameterError(f"{cls.name}.{key} cannot be none")
    wanted = []
    for option in options:
        if option is NoneType:
            continue
        if _is_sequence(option):
            args = typing.get_args(option)
            item = args[0] if args else Any
            items = parsed if isinstance(parsed, (list, tuple)) else (
                [_scalar(t) for t in text.split(",")] if text is not None and "," in text else [parsed])
            try:
                return tuple(_as(item, v, str(v)) for v in items)
            except TypeError as err:
                wanted.append(f"a list of {err}")
                continue
        try:
            return _as(option, parsed, text)
        except TypeError as err:
            wanted.append(str(err))
    raise ParameterError(f"{cls.name}.{key} must be {' or '.join(dict.fromkeys(wanted)) or 'another value'}, "
                         f"got {value!r}")


def typed_params(params: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``params`` as the analyses take them, for a run's record: ``--param knn_probe.k=20`` and a YAML file's
    ``{knn_probe: {k: 20}}`` both give ``{"knn_probe": {"k": 20}}`` (a list for a sequence). A group's parameter
    is converted as its first member that takes it does; a key no analysis takes is kept as given (the run
    refused it before any record is made)."""
    out: dict[str, dict[str, Any]] = {}
    for where, values in (params or {}).items():
        base = where.partition("@")[0]
        members = [ANALYSES[name] for name in GROUPS.get(base, (base,)) if name in ANALYSES]
        out[where] = {}
        for key, value in values.items():
            cls = next((c for c in members if key in parameters_of(c)), None)
            typed = convert(cls, key, value) if cls is not None else value
            out[where][key] = list(typed) if isinstance(typed, tuple) else typed
    return out


def _instantiate(cls: type[Analysis], label: str, given: Mapping[str, tuple[str, Any]]) -> Analysis:
    """``cls(**params)`` with converted values; ``given``: key -> (where it was given, value)."""
    known = parameters_of(cls)
    kwargs = {}
    for key, (where, value) in given.items():
        if key not in known:
            allowed = ", ".join(known) or "none"
            raise ParameterError(f"--param {where}.{key}: {cls.name} has no parameter {key!r}; its parameters: "
                                 f"{allowed}")
        kwargs[key] = convert(cls, key, value)
    try:
        analysis = cls(**kwargs)
    except (ValueError, TypeError) as err:
        culprit = next((k for k in kwargs if str(err).startswith(k)), None)
        if culprit is not None:
            where, raw = given[culprit]
            raise ParameterError(f"--param {where}.{culprit}={raw}: {err}") from None
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "defaults"
        raise ParameterError(f"{label} ({shown}): {err}") from None
    if label != cls.name:
        analysis.name = label  # an instance label: results, state and outputs go under it
    return analysis


def _split_label(name: str) -> tuple[str, str | None]:
    base, at, tag = name.partition("@")
    if at and not tag.replace("_", "").isalnum():
        raise ParameterError(f"instance label {name!r}: write NAME@TAG with letters, digits and '_' in the tag")
    return base, (tag if at else None)


def build_analyses(selection: Sequence[str], spec: ModelSpec, targets: Collection[str] = (),
                   params: Mapping[str, Mapping[str, Any]] | None = None,
                   skipped: dict[str, str] | None = None, data: DataFacts | None = None) -> list[Analysis]:
    """The analyses named by ``selection`` for a model and data, configured by ``params``.

    Args:
        selection: analysis and group names, each optionally with an ``@tag`` instance label. A group keeps the
            members that can run on the model and data; a name given alone must be able to run.
        spec: the model's ModelSpec.
        targets: ground-truth keys the data provides.
        params: ``{analysis, group or label: {parameter: value}}``; text values are converted.
        skipped: when given (several models, one selection: ``compare``), what this model cannot run (a CNN has
            no attention) is left out and its reason put here, by name, instead of raising; what the data lacks
            still raises.
        data: what is known of the data before the pass (labels...; :func:`~vitscope.analyses.registry.obstacle`).

    Returns:
        One instance per analysis (duplicates dropped), in selection order.

    Raises:
        ValueError: unknown names (with the closest one), an analysis that cannot run, a bad parameter, or
            parameters given for something not selected.
    """
    facts = data if data is not None else DataFacts(targets=targets)
    params = {k: dict(v) for k, v in (params or {}).items()}
    chosen: list[Analysis] = []
    seen: set[str] = set()
    used: set[str] = set()
    for raw in (s.strip() for s in selection):
        if not raw:
            continue
        base, tag = _split_label(raw)
        if base not in ANALYSES and base not in GROUPS:
            raise unknown_analysis(base)
        members = GROUPS.get(base, (base,))
        first: Obstacle | None = None  # of the group's first member, when none can run
        for name in members:
            cls = ANALYSES[name]
            label = f"{name}@{tag}" if tag else name
            if label in seen:
                continue
            given: dict[str, tuple[str, Any]] = {}
            for where in dict.fromkeys([*(g for g in cls.groups if g in params), *(
                    f"{g}@{tag}" for g in cls.groups if tag and f"{g}@{tag}" in params), name, label]):
                if where not in params:
                    continue
                accepted = parameters_of(cls)
                for key, value in params[where].items():
                    is_group = where.partition("@")[0] in GROUPS
                    if is_group and key not in accepted:
                        continue  # a group's parameter goes to the members that take it
                    given[key] = (where, value)
                used.add(where)
            analysis = _instantiate(cls, label, given)
            if base in GROUPS:
                found = obstacle(analysis, spec, facts)
                if found:
                    first = first or found
                    continue
            seen.add(label)
            chosen.append(analysis)
        if base in GROUPS and first is not None and not any(a.name.partition("@")[0] in members for a in chosen):
            if skipped is not None and not first.by_data:
                for name in members:  # by analysis, as a run lists what it did not run
                    found = obstacle(ANALYSES[name](), spec, facts)
                    skipped.setdefault(name, found.short if found else "")
                continue
            raise VitscopeValueError(f"no analysis of the '{base}' group can run: {first.reason}")
    for a in list(chosen):
        found = obstacle(a, spec, facts)
        if found is None:
            continue
        if skipped is not None and not found.by_data:  # another model may run it: listed, not refused
            skipped[a.name] = found.short
            chosen.remove(a)
        else:
            raise found.error()
    _check_group_params(params, used)
    return chosen


def _check_group_params(params: Mapping[str, Mapping[str, Any]], used: set[str]) -> None:
    """Parameters for nothing that runs, or a group parameter no member takes, are mistakes too."""
    for where, values in params.items():
        base = where.partition("@")[0]
        if where not in used:
            if base not in ANALYSES and base not in GROUPS:
                raise unknown_analysis(base)
            raise ParameterError(f"--param {where}.{next(iter(values), '?')}: {where} is not among the analyses "
                                 "run; add it to --analyses")
        if base in GROUPS:
            takes = set().union(*(parameters_of(ANALYSES[m]) for m in GROUPS[base]))
            for key in values:
                if key not in takes:
                    raise ParameterError(f"--param {where}.{key}: no analysis of the '{base}' group has a parameter "
                                         f"{key!r}; they take: {', '.join(sorted(takes))}")
