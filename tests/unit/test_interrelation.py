"""Weighted SIFT patch interrelation (docs/methods.md, SIFT patch interrelation) on hand-built patterns with known
answers."""

from __future__ import annotations

import math

import pytest
import torch

from vitscope.functional import (
    interrelation,
    interrelation_patch_scores,
    interrelation_stages,
    outside_baseline,
    patch_interrelation,
    random_attention,
    random_interrelation,
)

GRID = (2, 2)


def _pattern(rows_per_head: list[list[list[float]]], prefix_mass: float = 0.0) -> torch.Tensor:
    """[1, H, 1+4, 1+4] pattern whose spatial rows are the given ones scaled to 1 - prefix_mass."""
    heads = len(rows_per_head)
    p = torch.zeros(1, heads, 5, 5, dtype=torch.float64)
    for hd, rows in enumerate(rows_per_head):
        sp = torch.tensor(rows, dtype=torch.float64)
        sp = sp / sp.sum(-1, keepdim=True)
        p[0, hd, 1:, 1:] = sp * (1 - prefix_mass)
        p[0, hd, 1:, 0] = prefix_mass
        p[0, hd, 0, :] = 0.2
    return p.float()


ONE_HOT_0 = [[1, 0, 0, 0]] * 4
UNIFORM = [[1, 1, 1, 1]] * 4
IDENTITY = [[1 if i == j else 0 for j in range(4)] for i in range(4)]
COUNTS = torch.tensor([[[3, 1], [0, 0]]])  # patches 0 and 1 are keypoint patches


def test_known_answers_rule_max() -> None:
    pattern = _pattern([ONE_HOT_0, UNIFORM, IDENTITY], prefix_mass=0.3)
    out = interrelation(pattern, COUNTS, GRID, num_prefix=1)
    # head 0: every query attends patch 0 only -> P = 3/3; head 1: all four -> (3+1)/(3+1+2);
    # head 2: each query attends itself -> keypoint queries 1, non-keypoint queries 0
    torch.testing.assert_close(out["KK"], torch.tensor([[1.0, 4 / 6, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(out["NK"], torch.tensor([[1.0, 4 / 6, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(out["KN"], 1 - out["KK"])
    torch.testing.assert_close(out["NN"], 1 - out["NK"])


def test_rules_differ_where_the_detection_line_does() -> None:
    row = [0.6, 0.3, 0.1, 0.0]
    pattern = _pattern([[row] * 4])
    counts = torch.tensor([[[3, 0], [1, 0]]])
    # max: 0.3 is not above 0.5 * 0.6, so only patch 0 is attended -> P = 1
    p_max = patch_interrelation(pattern, counts, GRID, 1, lam=0.5, rule="max")
    torch.testing.assert_close(p_max, torch.ones(1, 1, 4, dtype=torch.float64))
    # uniform: above 0.5 / 4 are patches 0 and 1 (a non-keypoint patch) -> P = 3 / (3 + 1)
    p_uni = patch_interrelation(pattern, counts, GRID, 1, lam=0.5, rule="uniform")
    torch.testing.assert_close(p_uni, torch.full((1, 1, 4), 0.75, dtype=torch.float64))


def _reference(pattern: torch.Tensor, counts: torch.Tensor, p: int, lam: float, rule: str) -> dict:
    """Loop version of docs/methods.md, SIFT patch interrelation, written independently of the vectorised one."""
    b, heads, n, _ = pattern.shape
    k = n - p
    out = {q: torch.full((b, heads), float("nan"), dtype=torch.float64) for q in ("KK", "NK")}
    for i in range(b):
        nj = counts[i].flatten().tolist()
        for hd in range(heads):
            per_query = []
            for q in range(k):
                row = pattern[i, hd, p + q, p:].double()
                row = row / row.sum()
                line = lam * float(row.max()) if rule == "max" else lam / k
                attended = [j for j in range(k) if float(row[j]) > line]
                key = sum(nj[j] for j in attended if nj[j] > 0)
                plain = sum(1 for j in attended if nj[j] == 0)
                per_query.append(key / (key + plain))
            for name, want in (("KK", True), ("NK", False)):
                vals = [v for q, v in enumerate(per_query) if (nj[q] > 0) == want]
                if vals:
                    out[name][i, hd] = sum(vals) / len(vals)
    return out


@pytest.mark.parametrize("rule", ["max", "uniform"])
@pytest.mark.parametrize("lam", [0.2, 0.5, 0.9])
def test_matches_loop_reference_and_complements(rule: str, lam: float) -> None:
    gen = torch.Generator().manual_seed(3)
    grid, p = (3, 4), 2
    n = p + 12
    pattern = torch.softmax(3 * torch.randn(3, 2, n, n, generator=gen), dim=-1)
    counts = torch.randint(0, 3, (3, *grid), generator=gen) * (torch.rand(3, *grid, generator=gen) > 0.5)
    counts[2] = 0  # an image with no keypoint at all: KK is NaN, NK defined
    got = interrelation(pattern, counts, grid, p, lam=lam, rule=rule)
    want = _reference(pattern, counts, p, lam, rule)
    torch.testing.assert_close(got["KK"], want["KK"], equal_nan=True)
    torch.testing.assert_close(got["NK"], want["NK"], equal_nan=True)
    assert got["KK"][2].isnan().all() and not got["NK"][2].isnan().any()
    torch.testing.assert_close(got["KN"], 1 - got["KK"], equal_nan=True)
    torch.testing.assert_close(got["NN"], 1 - got["NK"], equal_nan=True)


def test_all_keypoint_image_has_nan_nk_and_scores_average_heads() -> None:
    pattern = _pattern([ONE_HOT_0, IDENTITY])
    counts = torch.ones(1, 2, 2, dtype=torch.long)
    out = interrelation(pattern, counts, GRID, 1)
    assert out["NK"].isnan().all() and out["NN"].isnan().all()
    scores = interrelation_patch_scores(_pattern([ONE_HOT_0, IDENTITY]), COUNTS, GRID, 1)
    # head 0 gives 1 everywhere, head 2 gives 1, 1, 0, 0 -> mean over heads
    torch.testing.assert_close(scores, torch.tensor([[[1.0, 1.0], [0.5, 0.5]]], dtype=torch.float64))


def test_bad_inputs_raise() -> None:
    pattern = _pattern([UNIFORM])
    with pytest.raises(ValueError, match="rule"):
        interrelation(pattern, COUNTS, GRID, 1, rule="mean")
    with pytest.raises(ValueError, match="keypoint_counts"):
        interrelation(pattern, COUNTS[:, :1], GRID, 1)
    with pytest.raises(ValueError, match="prefix"):
        interrelation(pattern, COUNTS, GRID, 0)


def test_stage_rule() -> None:
    kk = torch.tensor([0.2, 0.21, 0.3, 0.6, 0.8, 0.7, 0.65])
    assert interrelation_stages(kk) == {"retrieval": [0, 1, 2], "capture": [3, 4], "coach": [5, 6]}
    assert interrelation_stages(kk, rise=0.0) == {"retrieval": [], "capture": [0, 1, 2, 3, 4], "coach": [5, 6]}
    rising = torch.tensor([0.1, 0.25, 0.3])
    assert interrelation_stages(rising)["coach"] == [] and interrelation_stages(rising)["capture"] == [1, 2]
    with_nan = torch.tensor([math.nan, 0.1, 0.5, 0.2])
    assert interrelation_stages(with_nan) == {"retrieval": [0, 1], "capture": [2], "coach": [3]}


# ---------------------------------------------------------------- stages only where the data support them

#: the KK curve of a random-weight DINOv2-S-sized model on photos (issue 34): flat, 0.5307-0.5344
FLAT = torch.tensor([0.5307, 0.5344, 0.5321, 0.5330, 0.5312, 0.5339, 0.5318, 0.5326, 0.5309, 0.5335, 0.5316, 0.5329])


def test_a_flat_curve_within_the_random_baseline_has_no_stage_structure() -> None:
    # random attention on the same photos: 0.532 +- 0.256 over images (numbers of that run)
    assert not outside_baseline(FLAT, 0.5321, 0.2561).any()
    assert interrelation_stages(FLAT, baseline=0.5321, spread=0.2561) == {"retrieval": [], "capture": [],
                                                                          "coach": []}
    # even a baseline spread ten times tighter holds this curve at the default band (half of it)
    assert interrelation_stages(FLAT, baseline=torch.full((12,), 0.5325), spread=torch.full((12,), 0.0256)) == {
        "retrieval": [], "capture": [], "coach": []}
    assert interrelation_stages(FLAT)["capture"]  # without a baseline the old rule finds stages in the noise


def test_a_curve_with_clear_structure_still_gets_its_stages() -> None:
    kk = torch.tensor([0.2, 0.21, 0.3, 0.6, 0.8, 0.7, 0.65])
    # baseline 0.3 +- 0.1: blocks 3-6 lie outside the 1-std band, blocks 0, 1 also outside the default (0.5 std)
    assert outside_baseline(kk, 0.3, 0.1, band=1.0).tolist() == [False, False, False, True, True, True, True]
    assert outside_baseline(kk, 0.3, 0.1).tolist() == [True, True, False, True, True, True, True]
    assert interrelation_stages(kk, baseline=0.3, spread=0.1, band=1.0) == {"retrieval": [0, 1, 2],
                                                                            "capture": [3, 4], "coach": [5, 6]}
    # the band's width in standard deviations decides: at 6 std nothing is out (the peak's |0.8 - 0.3| < 0.6),
    # at 4.5 std only the peak
    assert not outside_baseline(kk, 0.3, 0.1, band=6.0).any()
    assert outside_baseline(kk, 0.3, 0.1, band=4.5).tolist() == [False] * 4 + [True] + [False] * 2
    assert interrelation_stages(kk, baseline=0.3, spread=0.1, band=6.0)["capture"] == []


def test_outside_baseline_reads_nan_as_no_evidence() -> None:
    kk = torch.tensor([0.9, math.nan, 0.1])
    assert outside_baseline(kk, 0.5, 0.1).tolist() == [True, False, True]
    assert not outside_baseline(kk, 0.5, math.nan).any()  # a baseline of one image has no spread
    assert interrelation_stages(kk, baseline=0.5, spread=math.nan) == {"retrieval": [], "capture": [], "coach": []}
    with pytest.raises(ValueError, match="spread"):
        interrelation_stages(kk, baseline=0.5)
    with pytest.raises(ValueError, match="band"):
        outside_baseline(kk, 0.5, 0.1, band=-1.0)


def test_random_interrelation_is_interrelation_of_the_seeded_random_heads() -> None:
    counts = torch.tensor([[[3, 1], [0, 0]], [[0, 2], [2, 0]], [[1, 1], [1, 1]]])
    got = random_interrelation(counts, GRID, 1, lam=0.5, rule="max", seed=3, samples=5)
    heads = random_attention((1, 5, 5, 5), torch.Generator().manual_seed(3), dtype=torch.float64)
    want = interrelation(heads.expand(3, -1, -1, -1), counts, GRID, 1, lam=0.5, rule="max")
    for q in ("KK", "KN", "NK", "NN"):
        torch.testing.assert_close(got[q], want[q], equal_nan=True)
    assert got["NK"][2].isnan().all()  # an image with keypoints everywhere has no non-keypoint query
    again = random_interrelation(counts, GRID, 1, lam=0.5, rule="max", seed=3, samples=5)
    assert torch.equal(again["KK"], got["KK"])
    other = random_interrelation(counts, GRID, 1, lam=0.5, rule="max", seed=4, samples=5)
    assert not torch.equal(other["KK"], got["KK"])


@pytest.mark.parametrize("lam", [1.0, 1.5])
def test_a_max_rule_threshold_that_selects_nothing_is_refused_everywhere(lam: float) -> None:
    """``a > lam * max`` holds for no key once lam >= 1: every KK was NaN and the result blamed the keypoints."""
    from vitscope.analyses.attention.interrelation import Interrelation
    from vitscope.analyses.masking.interrelation import InterrelationMasking

    pattern = torch.full((1, 1, 5, 5), 0.2)
    for make in (lambda: interrelation(pattern, torch.ones(1, 2, 2), (2, 2), 1, lam=lam, rule="max"),
                 lambda: random_interrelation(torch.ones(1, 2, 2), (2, 2), 1, lam=lam),
                 lambda: Interrelation(lam=lam), lambda: InterrelationMasking(lam=lam)):
        with pytest.raises(ValueError, match="lam must be below 1 under rule 'max'"):
            make()
    Interrelation(lam=lam, rule="uniform")  # keys above lam / K: some may be
    with pytest.raises(ValueError, match="rise must be a fraction"):  # at once, not after the pass
        Interrelation(rise=2.0)
