"""One home per fact: what an analysis can run on, whether a result has an explorer, which analyses the attention
suite holds are each decided in one place, and the names removed as dead code or aliases stay gone."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

import vitscope
from contract.fake_records import fake_spec
from vitscope.analyses import registry as _registry
from vitscope.analyses import result as _result
from vitscope.analyses.attention.suite import attention_suite
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.params import build_analyses
from vitscope.analyses.probes.clustering import Clustering
from vitscope.analyses.registry import ANALYSES, GROUPS, why_cannot_run, why_skipped
from vitscope.analyses.result import Figure, Result
from vitscope.errors import DegenerateDataError

SRC = Path(vitscope.__file__).parent
TARGET_SETS = [set(), {"label"}, {"masks"}, {"label", "masks"}, {"label", "masks", "instance_labels"}]


# -- what an analysis can run on ---------------------------------------------------------------------------


def _configured() -> list:
    """Every registered analysis at its defaults, plus configurations whose data needs differ from the class's."""
    return [cls() for cls in ANALYSES.values()] + [Clustering(level="object")]


@pytest.mark.parametrize("kind", ["transformer", "cnn"])
def test_the_listed_reason_and_the_refusal_agree_for_every_analysis_and_data(kind) -> None:
    spec = fake_spec(kind)
    for analysis in _configured():
        for targets in TARGET_SETS:
            refused, listed = why_cannot_run(analysis, spec, targets), why_skipped(analysis, spec, targets)
            assert (refused is None) == (listed is None), (analysis.name, targets, refused, listed)


@pytest.mark.parametrize("kind", ["transformer", "cnn"])
def test_every_reason_is_the_one_obstacle_worded_two_ways(kind) -> None:
    spec = fake_spec(kind)
    for analysis in _configured():
        for targets in TARGET_SETS:
            found = _registry.obstacle(analysis, spec, DataFacts(targets=targets))
            said = (why_cannot_run(analysis, spec, targets), why_skipped(analysis, spec, targets))
            assert said == ((found.reason, found.short) if found else (None, None))


def test_the_model_is_asked_first_and_the_data_is_to_blame_only_when_the_model_can_run() -> None:
    saliency = ANALYSES["saliency_iou"]()
    on_cnn = _registry.obstacle(saliency, fake_spec("cnn"), DataFacts(targets=()))
    assert not on_cnn.by_data and "CNN" in on_cnn.reason and not on_cnn.short.startswith("analysis")
    no_masks = _registry.obstacle(saliency, fake_spec("transformer"), DataFacts(targets=()))
    assert no_masks.by_data and no_masks.short == "the data has no object masks"
    assert isinstance(no_masks.error(), DegenerateDataError) and not isinstance(on_cnn.error(), DegenerateDataError)


def test_a_comparison_lists_what_a_model_cannot_run_and_refuses_what_the_data_cannot_feed() -> None:
    skipped: dict[str, str] = {}
    chosen = build_analyses(["attention_distance", "mean_activation"], fake_spec("cnn"), {"label"}, skipped=skipped)
    assert [a.name for a in chosen] == ["mean_activation"] and "CNN" in skipped["attention_distance"]
    # object-level clustering needs region masks: the data lacks them for every model, so it is refused
    with pytest.raises(DegenerateDataError, match="region masks"):
        build_analyses(["clustering"], fake_spec("transformer"), {"label"},
                       params={"clustering": {"level": "object"}}, skipped={})


def test_the_engine_refuses_with_the_reason_the_registry_gives() -> None:
    from vitscope.models.wrap import build_tiny_resnet

    cnn = build_tiny_resnet("cnn", num_classes=2, image_size=32, widths=(4, 4, 4, 4)).eval()
    saliency = ANALYSES["saliency_iou"]()
    with pytest.raises(ValueError) as caught:
        vitscope.run(cnn, [Image.new("RGB", (32, 32))], [saliency], progress=False)
    assert str(caught.value) == why_cannot_run(saliency, cnn.spec, ())


# -- the explorer is a capability of a result ----------------------------------------------------------------


class _PluginMaps(Result):
    """A result from outside the package whose name is no built-in analysis's: it declares an explorer."""

    def figures(self) -> list[Figure]:
        return [self.figure("_grid", lambda path: [], "Every block and head."),
                self.figure("_other", lambda path: [], "Something else.")]

    def explorer_maps(self) -> _result.ExplorerMaps:
        return _result.ExplorerMaps(self.tensors["maps"], "token norms", blocks=[0, 2], caption="Norm maps.",
                            figure_stems=(f"{self.name}_grid",))


def test_a_result_that_declares_an_explorer_gets_one_and_a_name_alone_gets_none(tmp_path) -> None:
    from vitscope.outputs.run_result import RunResult
    from vitscope.report.build import build_report

    maps = torch.rand(2, 3, 4, 4)
    plugin = _PluginMaps("token_maps", {"maps": maps})
    named = Result("cls_attention_maps", {"mean_map": maps})  # a built-in's name, but no declared explorer
    drawn = {"token_maps": [(f, tmp_path / f"{f.stem}.png") for f in plugin.figures()]}
    report = build_report(RunResult("analyze", results={"token_maps": plugin, "cls_attention_maps": named}), {}, drawn)
    sections = {s.id: s for s in report.sections}
    (explorer,) = sections["token-maps"].explorers
    assert explorer.title == "Block x head explorer: token norms" and explorer.blocks == [0, 2]
    assert explorer.caption.endswith("Norm maps.") and explorer.num_heads == 3
    assert sections["token-maps"].figure_links == [("Token maps grid", "figures/token_maps_grid.png")]
    assert [f.stem for f in sections["token-maps"].figures] == ["token_maps_other"]
    assert sections["cls-attention-maps"].explorers == []


def test_a_comparison_shows_every_declared_explorer_and_no_name_list() -> None:
    from vitscope.comparison.analyses import shown_by_comparison
    from vitscope.comparison.curves import Comparison, ModelRun
    from vitscope.comparison.outputs import comparison_sections

    plugin = _PluginMaps("token_maps", {"maps": torch.rand(2, 3, 4, 4)})
    assert shown_by_comparison("token_maps", plugin)
    assert not shown_by_comparison("cls_attention_maps", Result("cls_attention_maps", {}))
    sections = comparison_sections(Comparison(), [ModelRun("m", fake_spec(), {"token_maps": plugin}, "vit")])
    (maps,) = [s for s in sections if s.id == "attention-maps"]
    assert [e.title for e in maps.explorers] == ["vit: token norms"]


# -- the attention suite is the registry's attention group ----------------------------------------------------


def test_the_attention_suite_is_the_attention_group(clean_registry) -> None:
    spec = fake_spec("transformer")
    assert [a.name for a in attention_suite(spec, targets={"masks"})] == list(GROUPS["attention"])
    assert "saliency_iou" not in [a.name for a in attention_suite(spec)]  # no masks: left out

    @vitscope.register_analysis("token_attention", groups=("attention",))
    class TokenAttention(ANALYSES["attention_distance"]):
        def __init__(self, seed: int = 0, random_samples: int = 4, random_kind: str = "uniform") -> None:
            super().__init__(seed=seed, random_samples=random_samples, random_kind=random_kind)

    suite = attention_suite(spec, targets={"masks"}, seed=7, random_samples=2)
    assert [a.name for a in suite] == list(GROUPS["attention"]) and suite[-1].name == "token_attention"
    assert all(a.params["seed"] == 7 and a.params["random_samples"] == 2 for a in suite)


# -- dead code, aliases and history ---------------------------------------------------------------------------


@pytest.mark.parametrize("module, name", [
    ("vitscope.analyses", "Accumulator"), ("vitscope.analyses.base", "Accumulator"),
    ("vitscope.analyses", "expand_group"), ("vitscope.analyses", "block_cka"),
    ("vitscope.analyses.registry", "cannot_run_error"), ("vitscope.analyses.attention.suite", "ATTENTION_SUITE"),
    ("vitscope.data", "open_dataset"), ("vitscope.data.open", "open_dataset"),
    ("vitscope.analyses.result.Result", "summary"), ("vitscope.models.digest", "files_fingerprint"),
    ("vitscope.models.digest", "file_signature"), ("vitscope.hooks.tokens", "split_prefix"),
    ("vitscope.viz.featviz_figures", "top_maps_figure"), ("vitscope.viz.probe_figures", "clustering_curves"),
    ("vitscope.viz.attention_maps", "map_mosaic"), ("vitscope.report", "write_report"),
    ("vitscope.engine.run", "refuse_data"), ("vitscope.comparison.analyses", "COMPARED"),
])
def test_removed_names_stay_gone(module, name) -> None:
    holder: object
    if module.endswith(".Result"):
        holder = importlib.import_module(module.rpartition(".")[0]).Result
    else:
        holder = importlib.import_module(module)
    assert not hasattr(holder, name)


def test_no_comment_in_the_source_tells_history_instead_of_why() -> None:
    history = re.compile(r"\bissue \d+|\bengine[ -]v2\b|\bpre-v2\b|architecture\.md idea \d+", re.IGNORECASE)
    found = [f"{path.relative_to(SRC)}:{n}: {line.strip()}" for path in sorted(SRC.rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if history.search(line)]
    assert found == []
