"""Every registered analysis obeys the analysis contract (docs/architecture.md, "Declared state").

Parametrised over ``ANALYSES`` and the analyses docs/extending.md registers (run from the page as written) x the
fake spec kinds each analysis supports, so a newly registered analysis, and the form the page teaches, are
covered without touching this file (an analysis must be constructible without arguments). Results are read
through ``Analysis.result()``, as the engine reads them: a dict from ``compute()`` is a Result there.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.doc_examples import doc_analyses, registered
from vitscope.analyses import ANALYSES, GROUPS, Analysis, Result, get_analysis
from vitscope.analyses.registry import default_analyses
from vitscope.hooks.names import expand_names

try:  # pytest's default "prepend" import mode puts this folder on sys.path
    from fake_records import (
        MODEL_KINDS,
        SPEC_KINDS,
        analysis_kinds,
        construct,
        fake_record,
        fake_spec,
        give_reference,
        hook_names,
    )
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.contract.fake_records import (
        MODEL_KINDS,
        SPEC_KINDS,
        analysis_kinds,
        construct,
        fake_record,
        fake_spec,
        give_reference,
        hook_names,
    )


def _kinds(cls) -> list[str]:
    """The fake kinds an analysis runs on; analyses that need a classifier or re-run the model get real tiny ones."""
    return analysis_kinds(cls)


#: the analyses docs/extending.md registers, by name: the contract holds for the form the page teaches
DOCUMENTED = doc_analyses()

CASES = [
    pytest.param(name, kind, id=f"{name}-{kind}")
    for name, cls in sorted({**ANALYSES, **DOCUMENTED}.items())
    for kind in _kinds(cls)
]


@pytest.fixture(autouse=True, scope="module")
def documented_analyses_registered():
    """The page's analyses are registered while this module runs (and only then: other tests see the package's)."""
    with registered(*DOCUMENTED.values()):
        yield


def made(name: str, kind: str) -> Analysis:
    """The analysis ``name`` at its defaults, with what it needs made for the spec ``kind`` (:func:`construct`)."""
    return construct(name, fake_spec(kind))


def make_batches(acc: Analysis, kind: str, sizes: list[int], seed: int, start: int = 0) -> list[tuple]:
    spec = fake_spec(kind)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for size in sizes:
        out.append(fake_record(spec, acc.required_hooks(spec), size, gen, start_index=start))
        start += size
    return out


def run(acc: Analysis, batches: list[tuple]) -> Analysis:
    if batches:
        give_reference(acc, batches[0][1].spec)
    for record, batch in batches:
        acc.update(record, batch)
    return acc





def assert_meta_close(a: Any, b: Any, path: str = "meta") -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), f"{path}: keys differ {set(a) ^ set(b)}"
        for key in a:
            assert_meta_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_meta_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b)), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_results_equal(got: Result, want: Result) -> None:
    assert isinstance(got, Result) and type(got) is type(want)
    assert got.name == want.name
    assert set(got.tensors) == set(want.tensors)
    for key in want.tensors:
        torch.testing.assert_close(got.tensors[key], want.tensors[key], rtol=1e-6, atol=1e-9, equal_nan=True,
                                   msg=lambda m, key=key: f"{key}: {m}")
    assert_meta_close(got.meta, want.meta)


@pytest.mark.parametrize(("name", "kind"), CASES)
class TestAccumulatorContract:
    def _data(self, name: str, kind: str) -> dict[str, list[tuple]]:
        acc = made(name, kind)
        x1 = make_batches(acc, kind, [2, 3], seed=0, start=0)
        x2 = make_batches(acc, kind, [1], seed=1, start=5)
        return {"x1": x1, "x2": x2, "all": x1 + x2}

    def test_merge_equals_whole(self, name: str, kind: str) -> None:
        d = self._data(name, kind)
        whole = run(made(name, kind), d["all"]).result()
        assert whole.tensors, "an updated accumulator must produce tensors"
        a2 = run(made(name, kind), d["x2"])
        a2_before = a2.result()
        merged = run(made(name, kind), d["x1"]).merge(a2)
        assert isinstance(merged, Analysis)
        assert_results_equal(merged.result(), whole)
        assert_results_equal(a2.result(), a2_before)  # merge leaves its argument unchanged

    def test_merge_with_empty_is_identity(self, name: str, kind: str) -> None:
        d = self._data(name, kind)
        want = run(made(name, kind), d["all"]).result()
        acc = run(made(name, kind), d["all"])
        assert_results_equal(acc.merge(acc.fresh()).result(), want)
        assert_results_equal(made(name, kind).merge(run(made(name, kind), d["all"])).result(), want)

    def test_pickle_round_trip(self, name: str, kind: str) -> None:
        acc = run(made(name, kind), self._data(name, kind)["all"])
        clone = pickle.loads(pickle.dumps(acc))
        assert_results_equal(clone.result(), acc.result())

    def test_state_dict_round_trip(self, name: str, kind: str) -> None:
        d = self._data(name, kind)
        acc = run(made(name, kind), d["x1"])
        twin = acc.fresh()
        twin.load_state_dict(pickle.loads(pickle.dumps(acc.state_dict())))
        assert_results_equal(twin.result(), acc.result())
        # the reloaded state keeps streaming exactly like the original
        assert_results_equal(run(twin, d["x2"]).result(), run(acc, d["x2"]).result())

    def test_reset_empties(self, name: str, kind: str) -> None:
        d = self._data(name, kind)
        acc = run(made(name, kind), d["x1"])
        acc.reset()
        assert_results_equal(acc.result(), made(name, kind).result())
        assert_results_equal(run(acc, d["x2"]).result(), run(made(name, kind), d["x2"]).result())
        assert_results_equal(run(made(name, kind), d["x1"]).fresh().result(), made(name, kind).result())

    def test_required_hooks_are_canonical(self, name: str, kind: str) -> None:
        spec = fake_spec(kind)
        hooks = made(name, kind).required_hooks(spec)
        assert all(isinstance(h, str) for h in hooks)
        assert hooks or ANALYSES[name] in {ANALYSES[n] for n in GROUPS["masking"]}  # those may read the model alone
        assert not hooks or expand_names(hooks, hook_names(spec), model=spec.name)

    def test_figures_carry_their_captions(self, name: str, kind: str) -> None:
        result = run(made(name, kind), self._data(name, kind)["all"]).result()
        stems = [f.stem for f in result.figures()]
        assert len(set(stems)) == len(stems), stems
        assert all(f.caption and f.title and f.stem.startswith(name) for f in result.figures())
        if type(result).figures is not Result.figures:  # a result type that draws figures draws them
            assert stems, f"{type(result).__name__}.figures() drew nothing"
        assert ANALYSES[name].description and result.intro  # the report's paragraph for this analysis
        assert any(not table.empty for table in result.tables().values())  # the report's table of its numbers

    def test_save_and_plot(self, name: str, kind: str, tmp_path: Path) -> None:
        result = run(made(name, kind), self._data(name, kind)["all"]).result()
        # every tensor names its dimensions (result.to_frame, the CSV tables)
        unnamed = {k: result.dims(k) for k in result.tensors if any(d.startswith("dim") for d in result.dims(k))}
        assert not unnamed, f"declare the dimensions of {unnamed} in {type(result).__name__}.DIMS"
        for key, t in result.tensors.items():  # and each is a frame of its elements
            frame = result.to_frame(key)
            assert frame.size == max(t.numel(), 1) or t.numel() == 0, key
        saved = result.save(tmp_path)
        assert {p.suffix for p in saved} >= {".csv", ".json"}
        figures = result.plot(tmp_path / "figures")
        assert all(Path(p).is_file() and Path(p).stat().st_size > 0 for p in saved + figures)


def test_every_registered_analysis_and_kind_is_covered() -> None:
    assert {p.values[1] for p in CASES} == set(SPEC_KINDS) | set(MODEL_KINDS)
    assert {p.values[0] for p in CASES} == set(ANALYSES)  # the masking analyses included
    assert DOCUMENTED and set(DOCUMENTED) <= set(ANALYSES), "the analysis docs/extending.md shows is in the suite"


def test_get_analysis_unknown_name_suggests() -> None:
    with pytest.raises(ValueError, match="Did you mean 'attention_stats'") as info:
        get_analysis("attention_stat")
    assert "\n" not in str(info.value)
    assert all(name in str(info.value) for name in ANALYSES)


def test_get_analysis_passes_kwargs() -> None:
    acc = get_analysis("mean_activation", hooks=["blocks.0.resid_post"])
    assert acc.required_hooks(fake_spec()) == ["blocks.0.resid_post"]


def test_default_analyses_follow_supports() -> None:
    vit_names = {a.name for a in default_analyses(fake_spec("transformer"), targets={"masks", "label"})}
    cnn_names = {a.name for a in default_analyses(fake_spec("cnn"), targets={"masks", "label"})}
    assert vit_names == {n for n, cls in ANALYSES.items() if cls.default}
    # opt-in: they re-run the model, (artifacts) read every block's MLP activations besides its output, or (sae)
    # need an SAE
    assert {n for n, cls in ANALYSES.items() if not cls.default} == set(GROUPS["masking"]) | set(
        GROUPS["interventions"]) | set(GROUPS["artifacts"]) | set(GROUPS["sae"])
    assert "attention_stats" not in cnn_names and "mean_activation" in cnn_names
    assert not any(getattr(ANALYSES[n], "needs_attention", False) for n in cnn_names)


def test_default_analyses_leave_out_what_the_data_cannot_feed() -> None:
    """Without ground truth, analyses that need it (saliency needs masks) are not defaults."""
    plain = {a.name for a in default_analyses(fake_spec("transformer"))}
    needy = {n for n, cls in ANALYSES.items() if getattr(cls, "required_targets", ())}
    assert "saliency_iou" in needy
    assert plain == {n for n, cls in ANALYSES.items() if cls.default} - needy


@pytest.mark.parametrize(("name", "kind"), CASES)
@settings(max_examples=2, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4), cut=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_merge_of_a_random_split_equals_the_whole(name: str, kind: str, sizes: list[int], cut: int, seed: int) -> None:
    """Batches of random sizes split at a random batch boundary (how ranks and resumed runs divide the work)."""
    cut = min(cut, len(sizes) - 1)
    batches = make_batches(made(name, kind), kind, sizes, seed)
    whole = run(made(name, kind), batches).result()
    merged = run(made(name, kind), batches[:cut]).merge(run(made(name, kind), batches[cut:]))
    assert_results_equal(merged.result(), whole)


@pytest.mark.parametrize("name", sorted({**ANALYSES, **DOCUMENTED}))
def test_every_parameter_is_documented_for_analyze_params_of(name: str) -> None:
    """``vitscope analyze --params-of NAME`` prints each parameter with its default and what it means."""
    from typer.testing import CliRunner

    from vitscope.analyses.params import parameters_of
    from vitscope.cli.main import app

    out = CliRunner().invoke(app, ["analyze", "--params-of", name])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    for key in parameters_of(ANALYSES[name]):
        at = next(i for i, line in enumerate(lines) if line == f"  {key}" or line.startswith(f"  {key} = "))
        assert at + 1 < len(lines) and lines[at + 1].startswith("      ") and len(lines[at + 1].strip()) > 5, \
            f"{name}.{key} has no description: document it in the class's Args section"
