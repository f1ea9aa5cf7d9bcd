"""What ``vitscope analyses`` and ``analyze --help`` list comes from the registry: the built-ins' declarations,
read from their source without importing them, say what the registered classes say, and every need a class
declares is one the registry enforces (and the other way round)."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.registry import kept_registry
from vitscope.analyses import declared
from vitscope.analyses.catalog import declared_catalog, info_of
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.registry import ANALYSES, GROUPS, why_cannot_run

try:  # pytest's default "prepend" import mode puts this folder on sys.path
    from fake_records import construct, fake_spec
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.contract.fake_records import construct, fake_spec


def test_the_source_declares_what_the_registered_classes_say():
    builtins = [info_of(cls) for cls in ANALYSES.values() if cls.__module__.startswith("vitscope.")]
    assert declared_catalog() == builtins  # every field, in the registry's order
    assert [info.name for info in builtins][:3] == ["mean_activation", "attention_stats", "cls_attention_maps"]
    assert all(info.summary and "\n" not in info.summary for info in builtins)


#: a new analysis inside the package: one file (tests/helpers puts it in a folder added to the package's path)
INSIDE = '''
import torch

from vitscope.analyses.base import Analysis
from vitscope.analyses.registry import register_analysis


@register_analysis("token_count", groups=("representation",), order=105)
class TokenCount(Analysis):
    """Tokens leaving block 0, counted."""

    summary = "tokens leaving block 0"
    needs_transformer = True

    def __init__(self):
        super().__init__()
        self.add_state("count", torch.zeros((), dtype=torch.float64), reduce="sum")

    def required_hooks(self, spec):
        return ["blocks.0.resid_post"]

    def update(self, record, batch):
        self.count += record["blocks.0.resid_post"].shape[:2].numel()

    def compute(self):
        return {"count": self.count}
'''


def test_an_analysis_inside_the_package_is_one_file(tmp_path, monkeypatch):
    """A new module of the package is registered, placed by its order and listed from its source: no list names
    it (the registry imports every module of the package on its first read)."""
    import vitscope.analyses as package
    from vitscope.analyses import registry

    (tmp_path / "token_count.py").write_text(INSIDE)
    with kept_registry(tmp_path):
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
        monkeypatch.setattr(registry, "_LOADED", False)  # as in a fresh process
        declared._tree.cache_clear()
        try:
            names = list(ANALYSES)
            assert names.index("token_count") == names.index("cka") + 1  # order 105: between 100 and 110
            assert GROUPS["representation"][:2] == ("cka", "token_count")
            listed = declared_catalog()
            assert listed == [info_of(cls) for cls in ANALYSES.values() if cls.__module__.startswith("vitscope.")]
            assert next(i for i in listed if i.name == "token_count").needs() == ["a transformer"]
        finally:
            declared._tree.cache_clear()
    assert "token_count" not in ANALYSES


#: every target a source gives (boxes: a format of boxes without masks, which foreground masking takes for masks)
ALL_TARGETS = frozenset({"label", "masks", "instance_labels", "boxes"})


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_every_declared_need_is_one_the_registry_enforces(name):
    """Take one thing away from a model and data that give everything: the analysis stops running exactly when
    it declared that it needs it."""
    info = info_of(ANALYSES[name])
    everything = dataclasses.replace(fake_spec("transformer"), has_head=True)
    assert why_cannot_run(construct(name, everything), everything, ALL_TARGETS) is None

    def refused(spec=everything, targets=ALL_TARGETS) -> bool:  # an SAE is made for the model it reads
        return why_cannot_run(construct(name, spec), spec, targets, DataFacts(targets=targets)) is not None

    cnn = dataclasses.replace(fake_spec("cnn"), has_head=True)
    no_cls = dataclasses.replace(everything, num_prefix_tokens=0, prefix_kinds=())
    assert refused(cnn) == (info.needs_attention or info.needs_transformer)
    assert refused(no_cls) == info.needs_cls_token
    assert refused(dataclasses.replace(everything, has_head=False)) == info.needs_classifier_head
    for target in ALL_TARGETS:
        assert refused(targets=ALL_TARGETS - {target}) == (target in info.required_targets), target


def test_a_declaration_that_is_not_a_literal_is_named(tmp_path, monkeypatch):
    import vitscope.analyses as package

    (tmp_path / "fancy.py").write_text('ORDER = 5\n\n\n@register_analysis("fancy", order=ORDER)\n'
                                       'class Fancy(Analysis):\n    summary = "fancy"\n')
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    declared._tree.cache_clear()
    try:
        with pytest.raises(declared.DeclarationError, match=r"register_analysis of vitscope\.analyses\.fancy.*order="):
            declared.declared_analyses()
    finally:
        declared._tree.cache_clear()


def test_no_two_builtins_share_a_place():
    """Ties are broken by import order, which a user's imports can change: each built-in has its own ``order``."""
    orders = [cls.order for cls in ANALYSES.values() if cls.__module__.startswith("vitscope.")]
    assert None not in orders and len(set(orders)) == len(orders), sorted(orders)
