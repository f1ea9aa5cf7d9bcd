"""What ``vitscope analyses`` and ``vitscope analyze --help`` list: every analysis, built-in or plug-in, with what
it needs, from the registry's metadata.

The metadata are the class's own: its registration (name, groups, default, order) and its attributes
(``summary``, ``description``, ``required_targets``, ``needs_attention``, ``needs_transformer``,
``requires_cls``, ``needs_head``). While no plug-in is around, the built-ins' are read from their source
(:mod:`.declared`), so a listing does not import torch; otherwise from the registered classes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["AnalysisInfo", "analysis_catalog", "declared_catalog", "info_of"]

#: ground-truth key -> what a listing calls it
TARGET_WORDS = {"label": "labels", "masks": "masks", "instance_labels": "labels of the masks"}


@dataclass(frozen=True)
class AnalysisInfo:
    """One analysis as listed.

    Attributes:
        name: its registered name.
        summary: one line (the class's ``summary``, else the first sentence of its description).
        description: the paragraph the report shows.
        groups: the groups it belongs to.
        default: whether ``vitscope analyze`` runs it without ``--analyses`` (else opt-in).
        required_targets: ground-truth keys it needs (``label``, ``masks``...).
        needs_attention: it reads attention patterns (a transformer's).
        needs_transformer: it runs on transformers only.
        needs_cls_token: it needs a CLS token.
        needs_classifier_head: it needs the model's classifier head.
        module: the module that registers it (``vitscope.analyses...`` for the built-ins).
    """

    name: str
    summary: str
    description: str
    groups: tuple[str, ...]
    default: bool
    required_targets: tuple[str, ...]
    needs_attention: bool
    needs_transformer: bool
    needs_cls_token: bool
    needs_classifier_head: bool
    module: str

    @property
    def plugin(self) -> bool:
        """Registered outside vitscope (an entry point or a module the user imported)."""
        return not self.module.startswith("vitscope.")

    def needs(self) -> list[str]:
        """What the model and the data must give, in words: ``["attention", "a CLS token", "masks"]``."""
        model = ["attention"] if self.needs_attention else ["a transformer"] if self.needs_transformer else []
        model += ["a CLS token"] * self.needs_cls_token + ["a classifier head"] * self.needs_classifier_head
        return model + [TARGET_WORDS.get(t, t) for t in self.required_targets]

    def to_json(self) -> dict[str, Any]:
        """The fields, ``needs`` in words and whether it is a plug-in (``vitscope analyses --json``)."""
        return {**asdict(self), "groups": list(self.groups), "required_targets": list(self.required_targets),
                "needs": self.needs(), "plugin": self.plugin}


def _first_sentence(text: str) -> str:
    sentence = " ".join(text.split()).split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 90 else sentence[:87].rsplit(" ", 1)[0] + "..."


def _info(name: str, groups: tuple[str, ...], default: bool, module: str, doc: str | None,
          read: Callable[[str, Any], Any]) -> AnalysisInfo:
    """An :class:`AnalysisInfo` from a registration and a reader of class attributes (``read(key, default)``)."""
    description = str(read("description", "") or "")
    summary = str(read("summary", "") or "") or _first_sentence(description) or \
        _first_sentence((doc or "").strip().split("\n\n")[0])
    return AnalysisInfo(name=name, summary=summary, description=description, groups=tuple(groups),
                        default=bool(default), required_targets=tuple(read("required_targets", ()) or ()),
                        needs_attention=bool(read("needs_attention", False)),
                        needs_transformer=bool(read("needs_transformer", False)),
                        needs_cls_token=bool(read("requires_cls", False)),
                        needs_classifier_head=bool(read("needs_head", False)), module=module)


def info_of(cls: type) -> AnalysisInfo:
    """The listing of a registered analysis class, from its attributes."""
    return _info(cls.name, cls.groups, cls.default, cls.__module__, vars(cls).get("__doc__"),
                 lambda key, default: getattr(cls, key, default))


def declared_catalog() -> list[AnalysisInfo]:
    """The built-in analyses as their source declares them (:mod:`.declared`), without importing them.

    Raises:
        DeclarationError: a registration or attribute that is not a literal.
    """
    from vitscope.analyses.declared import declared_analyses

    return [_info(d.name, d.groups, d.default, d.module, d.doc, d.attribute) for d in declared_analyses()]


def analysis_catalog() -> list[AnalysisInfo]:
    """Every analysis, built-in and plug-in, in the registry's order.

    Before anything imported the registry (a plug-in module does) and without ``vitscope.analyses`` entry
    points, only the built-ins can be registered: they are read from their source, without torch. Otherwise
    the registry is read, after importing the entry points' modules (again: a listing shows a package
    installed since the registry's first read, which imported them).

    Raises:
        PluginImportError: an entry point's module cannot be imported.
    """
    from vitscope.analyses.plugins import analysis_entry_points, import_entry_points

    if "vitscope.analyses.registry" not in sys.modules and not analysis_entry_points():
        return declared_catalog()
    from vitscope.analyses.registry import ANALYSES

    import_entry_points()
    return [info_of(cls) for cls in ANALYSES.values()]
