"""Every random baseline is in the units of the model value it is read against (docs/methods.md, Random baselines).

The baselines are found generically: a result tensor ``random_<key>`` is the baseline of ``<key>`` (and
``random_<key>_std`` its spread over images). Each must have the model value's shape (or be one number for
every block, as a probe's random chance), and lie in the range the quantity is documented to take, with the
model value itself; a map must sum as the model's maps do. A new baseline whose quantity is not in
:data:`UNITS` fails until its units are declared here and in docs/methods.md.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from vitscope.analyses import ANALYSES
from vitscope.functional.attention_geometry import HEAD_TYPES

try:  # pytest's default "prepend" import mode puts this folder on sys.path
    from fake_records import analysis_kinds, construct, fake_record, fake_spec, give_reference
except ImportError:  # pragma: no cover - when tests/ is a package
    from tests.contract.fake_records import analysis_kinds, construct, fake_record, fake_spec, give_reference

METHODS = Path(__file__).resolve().parents[2] / "docs" / "methods.md"

#: the analyses that compare with a random baseline today: discovery must find every one of them
WITH_BASELINES = {"aligned_attention", "attention_distance", "attention_focus", "attention_rollout",
                  "cls_attention_maps", "clustering", "interrelation", "knn_probe", "linear_probe", "saliency_iou",
                  "spatial_average_maps"}

Range = Callable[[dict], tuple[float, float]]
_UNIT = lambda meta: (0.0, 1.0)  # shares, IoUs, accuracies
_SQRT2 = lambda meta: (0.0, math.sqrt(2.0))  # distances on the unit square


def _tokens(meta: dict) -> int:
    return int(meta["num_prefix"]) + int(meta["grid"][0]) * int(meta["grid"][1])


#: model quantity (a regular expression on its key) -> the range it is documented to take
UNITS: dict[str, Range] = {
    r"distance|block_mean|offset_norm": _SQRT2,
    r"(cls|spatial)_(best_)?iou": _UNIT,
    r"entropy": lambda meta: (0.0, math.log(_tokens(meta))),
    r"focus": lambda meta: (0.0, math.log(_tokens(meta) - int(meta["num_prefix"]))),
    r"(entropy|focus)_normalised": _UNIT,
    r"accuracy|purity|nmi": _UNIT,
    r"ari": lambda meta: (-0.5, 1.0),  # the adjusted Rand index is at least -1/2
    r"(KK|NK)_blocks": _UNIT,
}
#: maps (a regular expression on the key): each map, over its last two dims, sums like the model's
MAPS = r"mean_map|aaam"
#: baselines named otherwise than ``random_<key>``: the rollout's random map is read against its dataset map
NAMED_OTHERWISE = {"random_map": "mean_map"}


def _kinds(cls) -> list[str]:
    """The fake kinds an analysis runs on; of the real tiny classifiers (slow: masking re-runs them) one."""
    return analysis_kinds(cls, first_model_only=True)


CASES = [pytest.param(name, kind, id=f"{name}-{kind}") for name, cls in sorted(ANALYSES.items())
         for kind in _kinds(cls)]


@functools.cache
def _result(name: str, kind: str):
    spec = fake_spec(kind)
    acc = construct(name, spec)
    give_reference(acc, spec)
    gen, start = torch.Generator().manual_seed(0), 0
    for size in (2, 3):
        record, batch = fake_record(spec, acc.required_hooks(spec), size, gen, start_index=start)
        acc.update(record, batch)
        start += size
    return acc.compute()


def _baselines(result) -> dict[str, str]:
    """``random_<key>`` -> ``<key>`` for every baseline tensor of the result (spreads excluded)."""
    return {k: NAMED_OTHERWISE.get(k, k[len("random_"):]) for k in result.tensors
            if k.startswith("random_") and not k.endswith("_std")}


def _range(key: str, meta: dict) -> tuple[float, float]:
    for pattern, rng in UNITS.items():
        if re.fullmatch(pattern, key):
            return rng(meta)
    raise AssertionError(f"the units of {key!r} are not declared: add them to UNITS and to docs/methods.md")


def _within(values: torch.Tensor, lo: float, hi: float) -> bool:
    v = values.double()
    v = v[~v.isnan()]
    return bool(((v >= lo - 1e-6) & (v <= hi + 1e-6)).all())


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_every_random_baseline_is_in_the_units_of_its_model_value(name: str, kind: str) -> None:
    result = _result(name, kind)
    for key, model_key in _baselines(result).items():
        assert model_key in result.tensors, f"{name}: {key} has no model value {model_key!r} to be read against"
        base, model = result[key].double(), result[model_key].double()
        assert base.shape == model.shape or base.dim() == 0, f"{name}: {key} {tuple(base.shape)} vs {model_key} " \
                                                             f"{tuple(model.shape)}"
        assert not base.isnan().all(), f"{name}: {key} is all NaN"
        if re.fullmatch(MAPS, model_key):
            model_sums, base_sums = model.sum(dim=(-2, -1)), base.sum(dim=(-2, -1))
            assert _within(model_sums, 0.0, 1.0) and _within(base_sums, 0.0, 1.0), \
                f"{name}: {key} sums to {base_sums.max():.4g} where {model_key} sums to at most {model_sums.max():.4g}"
            if torch.allclose(model_sums, torch.ones_like(model_sums), atol=1e-6):  # normalised maps stay so
                torch.testing.assert_close(base_sums, torch.ones_like(base_sums), atol=1e-6, rtol=0)
            continue
        lo, hi = _range(model_key, result.meta)
        assert _within(model, lo, hi), f"{name}: {model_key} leaves its documented range [{lo:.4g}, {hi:.4g}]"
        assert _within(base, lo, hi), f"{name}: {key} leaves the range [{lo:.4g}, {hi:.4g}] of {model_key}"
        spread = result.tensors.get(f"{key}_std")
        if spread is not None:  # a standard deviation over images: as wide as the range at most
            assert spread.shape == base.shape and _within(spread, 0.0, hi - lo), f"{name}: {key}_std"
    if "random_head_types" in result.meta:  # the taxonomy of the random maps, labelled as the model's heads
        types, random_types = result.meta["head_types"], result.meta["random_head_types"]
        assert [len(row) for row in random_types] == [len(row) for row in types]
        assert {t for row in random_types for t in row} <= set(HEAD_TYPES)


def test_the_baselines_are_found_and_documented() -> None:
    found = {name for name, kind in (p.values for p in CASES) if _baselines(_result(name, kind))}
    assert found == WITH_BASELINES, f"analyses with a random baseline changed: {sorted(found ^ WITH_BASELINES)}"
    section = METHODS.read_text().split("\n## Random baselines", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in sorted(found) if f"`{name}`" not in section]
    assert not missing, f"docs/methods.md, Random baselines, does not describe {missing}"
