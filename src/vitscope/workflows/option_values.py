"""Reading option values: one value checked and converted to its option's type, a YAML file of options, and the
merge of the command line, the file and the defaults (:func:`resolve_options`). The commands' option tables live in
:mod:`vitscope.workflows.options`."""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitscope.errors import VitscopeUsageError

__all__ = ["IMPORT_KEY", "ConfigError", "Option", "load_config", "resolve_options"]


class ConfigError(VitscopeUsageError):
    """The configuration file or the merged options are invalid (one line, says what to change)."""


@dataclass(frozen=True)
class Option:
    """One option: its name, type (``str``, ``int``, ``float``, ``bool``, ``list``, ``path``, ``params``,
    ``models``, ``blocks``), default, whether it must be given, and bounds for numbers."""

    name: str
    kind: str
    default: Any = None
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None


#: the key of a config file that names modules of analyses to import (``--import`` on the command line)
IMPORT_KEY = "import"

#: keys of a run's record (results.json ``config``) that say how it ran rather than set an option: a record read
#: as a config file passes over them (the probe's detected ``format`` and ``task``, the file it was read from)
RECORDED_ONLY = frozenset({"config_file", "format", "task"})

#: the record's account of the analyses from outside vitscope (``{"analysis", "module", "file", "sha256"}`` each)
RECORDED_IMPORTS = "imports"


@functools.cache
def _unique_key_loader() -> type:
    """YAML's safe loader, refusing a key given twice in one mapping (the safe loader keeps the last silently);
    keys a merge (``<<: *anchor``) brings in may be set again, as YAML intends. Made on first use: the command
    line starts without importing yaml."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _recorded_imports(value: Any, path: Path) -> list[tuple[str | None, str | None, str | None]]:
    """The ``(module, file, sha256)`` of each analysis module a record's ``imports`` names, each once."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value) or \
            not all(isinstance(v.get(k), (str, type(None))) for v in value for k in ("module", "file", "sha256")):
        raise ConfigError(f"'{RECORDED_IMPORTS}' in {path} must be a run's record of its imports (a list of "
                          "mappings with 'module' and 'file'); to import modules, use 'import:'")
    return list(dict.fromkeys((v.get("module"), v.get("file"), v.get("sha256")) for v in value))


def _require_imported(module: str | None, file: str | None, sha256: str | None, path: Path) -> None:
    """A record's plug-in module must be imported already (``--import``, ``import:``, an installed entry point),
    under its name or as its file, and have registered analyses: a record is data, and reading one never runs the
    code it names (someone else's results.json included).

    Raises:
        ConfigError: the module is not imported; the message names what to give ``--import`` once it is read.
    """
    import hashlib
    import sys
    import warnings

    from vitscope.analyses.registry import ANALYSES

    plugins = {cls.__module__ for cls in ANALYSES.values()}  # the first read imports the installed plug-ins too
    held = sys.modules.get(module) if module in plugins else None  # a module of that name that registers analyses
    if held is None and file:  # given by another name: its file (a dotted name, then a path, or the reverse)
        same = Path(file).resolve()
        held = next((sys.modules[name] for name in plugins if name in sys.modules and
                     getattr(sys.modules[name], "__file__", None) and
                     Path(sys.modules[name].__file__).resolve() == same), None)
    if held is None:
        given = module if module and ("." in module or not file) else file
        raise ConfigError(f"the run recorded in {path} used analyses from {file or module}; a record does not run "
                          f"code: read it, then give it with --import {given} (or import: in a config file)")
    source = Path(held.__file__).resolve() if getattr(held, "__file__", None) else None
    if sha256 and source is not None and source.is_file() and \
            hashlib.sha256(source.read_bytes()).hexdigest() != sha256:
        from vitscope.errors import VitscopeWarning

        warnings.warn(f"{source} is not the file of the run recorded in {path} (its sha256 differs): the numbers "
                      "may differ", VitscopeWarning, stacklevel=2)


def _where(source: str | None) -> str:
    return f" in {source}" if source else ""


def _coerce(option: Option, value: Any, source: str | None) -> Any:
    """Check and convert one value to the option's type."""
    if value is None:
        return None
    kind, where = option.kind, _where(source)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"'{option.name}'{where} must be true or false, got {value!r}")
        return value
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or \
                (kind == "int" and (math.isinf(value) or value != int(value))):  # a file's .nan or .inf
            raise ConfigError(f"'{option.name}'{where} must be {'an integer' if kind == 'int' else 'a number'}, "
                              f"got {value!r}")
        value = int(value) if kind == "int" else float(value)
        if option.minimum is not None and value < option.minimum:
            raise ConfigError(f"'{option.name}'{where} must be at least {option.minimum:g}, got {value!r}")
        if option.maximum is not None and value > option.maximum:
            raise ConfigError(f"'{option.name}'{where} must be at most {option.maximum:g}, got {value!r}")
        return value
    if kind == "params":
        return _params(option, value, where)
    if kind == "models":
        return _models(option, value, where)
    if kind == "blocks":
        return _blocks(option, value, where)
    if kind == "list":
        return _names(option, value, where)
    if not isinstance(value, (str, Path)) or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"'{option.name}'{where} must be a non-empty string, got {value!r}")
    return Path(value).expanduser() if kind == "path" else str(value)


def _params(option: Option, value: Any, where: str) -> dict[str, dict[str, Any]] | None:
    """``--param`` items (``["knn_probe.k=20"]``) or a YAML mapping ``{analysis: {parameter: value}}``."""
    from vitscope.analyses.params import ParameterError, parse_param_assignments

    from_command_line = where == _where("the command line")
    if from_command_line and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        try:
            return parse_param_assignments(value) or None
        except ParameterError as err:
            raise ConfigError(str(err)) from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(f"'{option.name}'{where} must map analyses to their parameters, e.g. "
                          f"{{knn_probe: {{k: 20}}}}, got {value!r}")
    return {str(k): {str(p): v for p, v in v.items()} for k, v in value.items()} or None


def _names(option: Option, value: Any, where: str) -> list[str] | None:
    """A list of names, or one comma-separated string of them."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
        raise ConfigError(f"'{option.name}'{where} must be a list of names or a comma-separated string, got {value!r}")
    items = [v.strip() for v in items if v.strip()]
    return items or None


def _models(option: Option, value: Any, where: str) -> list[str] | dict[str, str] | None:
    """Models as a list (``"a,b"`` or ``[a, b]``, each ``MODEL`` or ``NAME=MODEL``) or a mapping name -> model
    (kept as given: :func:`vitscope.comparison.names.named_models` reads the names)."""
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) and k.strip() and isinstance(v, str) and v.strip() for k, v in value.items()):
            raise ConfigError(f"'{option.name}'{where} must map display names to models, e.g. "
                              f"{{dino: hf:facebook/dinov2-small}}, got {value!r}")
        return {k.strip(): v.strip() for k, v in value.items()} or None
    return _names(option, value, where)


def _blocks(option: Option, value: Any, where: str) -> tuple[int, ...] | str:
    """Blocks as ``"0,3,-1"``, one integer or a list of integers (negative counts from the end), or ``"all"``
    (every block; a value, so that it overrides a file's list). The model checks the range."""
    if isinstance(value, str) and value.strip().lower() in ("", "all"):
        return "all"
    items = [b for b in value.split(",") if b.strip()] if isinstance(value, str) else \
        [value] if isinstance(value, int) else value
    try:
        if not isinstance(items, (list, tuple)) or not items or \
                any(isinstance(b, bool) or not isinstance(b, (int, str)) for b in items):
            raise ValueError
        return tuple(int(b) for b in items)
    except ValueError:
        raise ConfigError(f"'{option.name}'{where} takes comma-separated integers (negative counts from the end) or "
                          f"'all', got {value!r}") from None


def load_config(path: str | Path, options: tuple[Option, ...]) -> dict[str, Any]:
    """Read a YAML mapping of option values, checking every key and type, and import the modules of analyses
    its ``import:`` names (:func:`vitscope.analyses.plugins.import_analyses`).

    A run's results.json is read as its ``config`` record, so that ``--config OLD/results.json`` runs it again:
    the keys saying how it ran (:data:`RECORDED_ONLY`) are passed over and its ``imports`` imported again (each
    file where it still is, else its module). Relative paths (``data``, ``out``, ``import``...) stay relative
    to the working directory, as on the command line.

    Raises:
        ConfigError: unreadable file, not a mapping, a key given twice (two spellings of one option included),
            unknown key (with the closest known key), bad value (a number that is not finite included).
        PluginImportError: a module of ``import:`` that cannot be imported.
    """
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not YAML: it is not UTF-8 text") from None
    try:
        doc = yaml.load(text, Loader=_unique_key_loader())  # a safe loader refusing repeated keys
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{at}: {getattr(err, 'problem', None) or err}") from None
    if doc is None:
        return {}
    recorded = ""
    if isinstance(doc, dict) and "vitscope_version" in doc and isinstance(doc.get("config"), dict):
        recorded = f" (the record of a 'vitscope {doc.get('command')}' run: give it to that command)"
        doc = doc["config"]  # a run's results.json: its options, to run it again
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path} must be a mapping of option: value, got a {type(doc).__name__}")
    known = {o.name: o for o in options}
    out: dict[str, Any] = {}
    imports: list[str] = []
    recorded_imports: list[tuple[str | None, str | None, str | None]] = []
    spelt: dict[str, Any] = {}
    for raw_key, value in doc.items():
        key = str(raw_key).replace("-", "_")
        if key in spelt:
            raise ConfigError(f"config file {path} sets '{key}' twice ('{spelt[key]}' and '{raw_key}'); keep one")
        spelt[key] = raw_key
        if key == IMPORT_KEY:
            if recorded:  # a record is data: reading one never runs the code it names
                raise ConfigError(f"the run recorded in {path} names modules to import ('{raw_key}'); a record does "
                                  "not run code: read them, then give them with --import")
            imports = _names(Option(IMPORT_KEY, "list"), value, _where(str(path))) or []
            continue
        if recorded and key == RECORDED_IMPORTS:
            recorded_imports = _recorded_imports(value, path)
            continue
        if recorded and key in RECORDED_ONLY:  # a hand-written file keeps them unknown keys
            continue
        if key not in known:
            close = difflib.get_close_matches(key, [*known, IMPORT_KEY], n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown key '{raw_key}' in config file {path}{recorded}{hint} Known keys: "
                              f"{', '.join([*known, IMPORT_KEY])}")
        out[key] = _coerce(known[key], value, str(path))
    if imports:  # before any analysis name is resolved
        from vitscope.analyses.plugins import import_analyses

        for name in imports:
            import_analyses(name)
    for module, file, sha256 in recorded_imports:
        _require_imported(module, file, sha256, path)
    return out


def resolve_options(options: tuple[Option, ...], given: Mapping[str, Any],
                    config_file: str | Path | None = None) -> dict[str, Any]:
    """Merge defaults, the YAML file and command-line values (None = not given there).

    Args:
        options: the command's :class:`Option` table.
        given: command-line values by option name; None means "not given".
        config_file: optional YAML file.

    Returns:
        Every option's final value (plus ``config_file`` when one was read).

    Raises:
        ConfigError: a bad file, or a required option given nowhere.
    """
    known = {o.name for o in options}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}")
    from_file = load_config(config_file, options) if config_file is not None else {}
    resolved: dict[str, Any] = {}
    for o in options:
        value = _coerce(o, given.get(o.name), "the command line")
        if o.kind == "params":  # per parameter: the command line overrides the file
            merged = {k: dict(v) for k, v in (from_file.get(o.name) or {}).items()}
            for name, values in (value or {}).items():
                merged.setdefault(name, {}).update(values)
            value = merged or None
        if value is None:
            value = from_file.get(o.name)
        if value is None:
            value = o.default
        if value is None and o.required:
            flag = "--" + o.name.replace("_", "-")
            raise ConfigError(f"missing {flag}: give it on the command line or as '{o.name}:' in a --config file")
        resolved[o.name] = value
    if config_file is not None:
        resolved["config_file"] = str(config_file)
    return resolved
