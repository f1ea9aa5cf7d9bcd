"""Where analyses come from: the modules of this package, other packages' ``vitscope.analyses`` entry points,
and the modules a user names (``--import``, ``import:`` in a config file).

An analysis registers where it is defined (``@register_analysis``), so bringing analyses in is importing the
modules that define them. The registry imports the first two on its first read (:func:`import_builtins`,
:func:`import_entry_points`); the command line imports the third (:func:`import_analyses`).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vitscope.errors import VitscopeError

if TYPE_CHECKING:  # pragma: no cover - importlib.metadata takes tens of ms: imported when entry points are read
    from importlib.metadata import EntryPoint

__all__ = ["ENTRY_POINT_GROUP", "PluginImportError", "analysis_entry_points", "analysis_sources", "import_analyses",
           "import_builtins",
           "import_entry_points"]

#: entry-point group through which other packages add analyses: each entry point names a module (or an object in
#: it) whose import registers them, e.g. ``token_norm = "my_lab.token_norm"``
ENTRY_POINT_GROUP = "vitscope.analyses"

#: resolved path of a ``.py`` file -> its module, so that naming a file twice imports it once
_FILES: dict[Path, ModuleType] = {}


class PluginImportError(VitscopeError, ImportError):
    """A module of analyses that cannot be imported: one line naming it and why."""


def import_builtins() -> None:
    """Import every module of the analyses package: each built-in analysis registers where it is defined, so no
    list names them."""
    for module in pkgutil.walk_packages(sys.modules[__package__].__path__, f"{__package__}."):
        importlib.import_module(module.name)


def analysis_entry_points() -> list[EntryPoint]:
    """The installed ``vitscope.analyses`` entry points, by name (reading them imports nothing)."""
    from importlib.metadata import entry_points

    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda point: point.name)


def import_entry_points() -> None:
    """Import the module of every ``vitscope.analyses`` entry point (all of them, also after one fails).

    Raises:
        PluginImportError: the first entry point whose module cannot be imported (naming it, its distribution and
            why), once every other one has been imported.
    """
    failed: PluginImportError | None = None
    for point in analysis_entry_points():
        try:
            point.load()
        except Exception as err:
            dist = f" of {point.dist.name} {point.dist.version}" if point.dist is not None else ""
            error = PluginImportError(f"cannot import the analyses of entry point '{point.name} = {point.value}'"
                                      f"{dist}: {_why(err)}")
            error.__cause__ = err
            failed = failed or error
    if failed is not None:
        raise failed


def import_analyses(name: str) -> ModuleType:
    """Import a module that registers analyses (``--import``, ``import:``).

    Args:
        name: a dotted module name importable from Python's path or the current folder
            (``my_lab.token_norm``), or the path of a ``.py`` file (imported as a module named after the file).

    Returns:
        The module (imported once, however often it is named).

    Raises:
        PluginImportError: the module cannot be found or raises while it is imported (one line naming it).
    """
    name = str(name).strip()
    try:
        if name.endswith(".py") or "/" in name or "\\" in name:
            return _import_file(name)
        return _import_dotted(name)
    except PluginImportError:
        raise
    except Exception as err:
        raise PluginImportError(f"cannot import analyses from '{name}': {_why(err)}") from err


def _why(err: BaseException) -> str:
    """The first line of an error, with its type unless it is one of vitscope's (already a sentence)."""
    text = (str(err).strip().splitlines() or [""])[0]
    if isinstance(err, VitscopeError):
        return text or type(err).__name__
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _import_file(given: str) -> ModuleType:
    path = Path(given).expanduser().resolve()
    if path in _FILES:
        return _FILES[path]
    if not path.is_file():
        raise PluginImportError(f"cannot import analyses from '{given}': no such file")
    module_name = path.stem
    other = _origin(module_name)
    if other is not None and other != path:
        raise PluginImportError(f"cannot import analyses from '{given}': the module name '{module_name}' is taken (by "
                                f"{other}); rename the file")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginImportError(f"cannot import analyses from '{given}': not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # as an import does: the module's classes name it, pickles find it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    _FILES[path] = module
    return module


def _origin(module_name: str) -> Path | str | None:
    """Where the module ``module_name`` comes from, imported or importable (None: nowhere)."""
    held = sys.modules.get(module_name)
    if held is not None:
        return Path(held.__file__).resolve() if getattr(held, "__file__", None) else "a module without a file"
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return Path(spec.origin).resolve() if spec.origin and spec.has_location else f"the module {module_name}"


def _import_dotted(name: str) -> ModuleType:
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise PluginImportError(f"cannot import analyses from '{name}': give a dotted module name (my_lab.token_norm) "
                                "or the path of a .py file")
    top = name.split(".")[0]
    here = Path.cwd()
    if importlib.util.find_spec(top) is None and ((here / top).is_dir() or (here / f"{top}.py").is_file()):
        sys.path.insert(0, str(here))  # as ``python -m`` does: the current folder's modules are importable
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        parts = name.split(".")
        if err.name in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            raise PluginImportError(f"cannot import analyses from '{name}': no module named '{err.name}' (on "
                                    "Python's path or in the current folder)") from None
        raise


def analysis_sources(analyses: Sequence[Any]) -> list[dict[str, Any]]:
    """Where the analyses from outside vitscope come from (``--import``, ``import:``, entry points): one record per
    such analysis with its ``module``, its ``file`` and the file's ``sha256``, so a run's results.json says which
    code made its numbers (empty when every analysis is vitscope's own)."""
    import hashlib
    import inspect

    out = []
    for analysis in analyses:
        cls = type(analysis)
        if cls.__module__.split(".")[0] == "vitscope":
            continue
        try:
            file = inspect.getsourcefile(cls)
        except TypeError:  # defined where no source file is (an interactive session)
            file = None
        digest = hashlib.sha256(Path(file).read_bytes()).hexdigest() if file and Path(file).is_file() else None
        out.append({"analysis": analysis.name, "module": cls.__module__, "file": file, "sha256": digest})
    return out
