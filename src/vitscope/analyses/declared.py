"""What the built-in analyses declare, read from their source without importing it (so without torch).

``vitscope analyze --help`` and ``vitscope analyses`` list the analyses at once: importing them would import
torch (seconds). Each analysis declares its registration (``@register_analysis("name", groups=..., default=...,
order=...)``) and what it needs (``summary``, ``description``, ``required_targets``, ``needs_attention``...) as
literals in its class or a base class of this package; this module reads those literals from the syntax tree.
``tests/contract/test_analysis_catalog.py`` checks that they equal the imported classes' attributes.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Declared", "DeclarationError", "declared_analyses"]

_PREFIX = f"{__package__}."


class DeclarationError(ValueError):
    """A registration or attribute that is not a literal, so it cannot be read without importing the module."""


@dataclass(frozen=True)
class Declared:
    """One ``@register_analysis`` class as written: its registration and a reader of its class attributes."""

    name: str
    groups: tuple[str, ...]
    default: bool
    order: int | None
    module: str
    qualname: str
    doc: str | None

    def attribute(self, key: str, default: Any) -> Any:
        """The class attribute ``key`` as declared in the class or a base class of this package (``default``
        when none declares it).

        Raises:
            DeclarationError: the attribute is not a literal.
        """
        return _attribute(self.module, self.qualname, key, default)


def declared_analyses() -> list[Declared]:
    """Every class of the analyses package with a ``@register_analysis`` decorator, ordered as the registry
    orders them (by ``order``, then by module and position).

    Raises:
        DeclarationError: a registration whose arguments are not literals.
    """
    found = [found for module in _modules() for found in _registered(module)]
    return sorted(found, key=lambda d: (d.order is None, d.order or 0))


def _roots() -> list[Path]:
    """The package's folders (its ``__path__``, as the import of its modules searches them)."""
    return [Path(root) for root in sys.modules[__package__].__path__]


def _modules() -> Iterator[str]:
    """Modules of the package that mention the decorator, in file order (only those are parsed)."""
    for root in _roots():
        for path in sorted(root.rglob("*.py")):
            if "register_analysis(" in path.read_text(encoding="utf-8"):
                parts = path.relative_to(root).with_suffix("").parts
                yield _PREFIX + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def _tree(module: str) -> ast.Module | None:
    """The syntax tree of a module of this package (None for other modules)."""
    if not module.startswith(_PREFIX):
        return None
    for root in _roots():
        path = root.joinpath(*module.removeprefix(_PREFIX).split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if path.is_file():
            return ast.parse(path.read_text(encoding="utf-8"), str(path))
    return None


def _literal(node: ast.expr, where: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise DeclarationError(f"{where} is not a literal ({ast.unparse(node)}): write the value itself, so that "
                               "the analyses can be listed without importing them") from None


def _decorator(node: ast.expr) -> ast.Call | None:
    """The ``register_analysis(...)`` call of a decorator (``@register_analysis(...)``,
    ``@vitscope.register_analysis(...)``), else None."""
    if isinstance(node, ast.Call):
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if called == "register_analysis":
            return node
    return None


def _registered(module: str) -> Iterator[Declared]:
    tree = _tree(module)
    for node in tree.body if tree is not None else ():
        if not isinstance(node, ast.ClassDef):
            continue
        for call in filter(None, map(_decorator, node.decorator_list)):
            where = f"@register_analysis of {module}.{node.name}"
            if not call.args:
                raise DeclarationError(f"{where} has no name")
            options = {k.arg: _literal(k.value, f"{where}, {k.arg}=") for k in call.keywords if k.arg is not None}
            yield Declared(name=_literal(call.args[0], where), groups=tuple(options.get("groups", ())),
                           default=bool(options.get("default", True)), order=options.get("order"), module=module,
                           qualname=node.name, doc=ast.get_docstring(node))


def _classes(module: str) -> dict[str, ast.ClassDef]:
    tree = _tree(module)
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)} if tree is not None else {}


def _imported(module: str) -> dict[str, tuple[str, str]]:
    """Names a module imports with ``from X import Y [as Z]``: ``{Z: (X, Y)}``."""
    tree = _tree(module)
    found = {}
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update({(a.asname or a.name): (node.module, a.name) for a in node.names})
    return found


def _attribute(module: str, qualname: str, key: str, default: Any) -> Any:
    """``key`` as the class declares it, else as its bases do (depth first, left to right)."""
    node = _classes(module).get(qualname)
    if node is None:
        return default
    for statement in node.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else \
            [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value is not None else []
        if any(isinstance(t, ast.Name) and t.id == key for t in targets):
            return _literal(statement.value, f"{module}.{qualname}.{key}")
    missing = object()
    for base in node.bases:
        if not isinstance(base, ast.Name):
            continue
        where = (module, base.id) if base.id in _classes(module) else _imported(module).get(base.id)
        if where is not None:
            value = _attribute(*where, key, missing)
            if value is not missing:
                return value
    return default
