"""Images of several token grids in one run (``--keep-aspect``, SigLIP 2 NaFlex): every attention analysis is either
per image (distances on each image's own unit square, entropy over each image's own tokens) or keeps one state per
grid (maps, aligned maps, rollout), checked against single-grid runs of the same images."""

from __future__ import annotations

import math

import pytest
import torch

from vitscope.analyses import (
    AlignedAttention,
    AttentionDistance,
    AttentionFocus,
    AttentionRollout,
    CLSAttentionMaps,
    SpatialAverageMaps,
)
from vitscope.analyses.attention.stats import AttentionStats
from vitscope.analyses.batch import Batch
from vitscope.models.spec import ModelSpec

GRIDS = ((3, 3), (2, 4))


def spec_of(grid) -> ModelSpec:
    return ModelSpec(name="hand-vit", family="tiny-vit", kind="transformer", num_blocks=2, num_heads=2, embed_dim=8,
                     mlp_dim=16, patch_size=2, grid=grid, num_prefix_tokens=1, prefix_kinds=("cls",),
                     image_size=(grid[0] * 2, grid[1] * 2))


def batch_of(grid, size, start) -> tuple[dict[str, torch.Tensor], Batch]:
    g = torch.Generator().manual_seed(start)
    n = 1 + grid[0] * grid[1]
    record = {f"blocks.{i}.attn.pattern": torch.softmax(3 * torch.randn(size, 2, n, n, generator=g), -1)
              for i in range(2)}
    spec = spec_of(grid)
    indices = list(range(start, start + size))
    return record, Batch(pixels=torch.zeros(size, 3, *spec.image_size), indices=indices,
                         paths=[str(i) for i in indices], spec=spec, grid=grid)


#: three images of grid 3x3 (indices 0-2), then two of 2x4 (3-4), then one more 3x3 (5)
BATCHES = [((3, 3), 2, 0), ((2, 4), 2, 3), ((3, 3), 1, 2), ((3, 3), 1, 5)]


def run(analysis, batches=BATCHES):
    for grid, size, start in batches:
        record, batch = batch_of(grid, size, start)
        analysis.update(record, batch)
        analysis.end_batch()
    return analysis.compute()


def of_grid(grid):
    return [b for b in BATCHES if b[0] == grid]


def test_per_image_scalars_are_the_mean_over_every_image():
    """distance and focus: the image-weighted mean of the single-grid runs; their random baselines too."""
    for cls in (AttentionDistance, AttentionFocus):
        mixed = run(cls())
        parts = {grid: run(cls(), of_grid(grid)) for grid in GRIDS}
        counts = {grid: sum(b[1] for b in of_grid(grid)) for grid in GRIDS}
        total = sum(counts.values())
        assert mixed.meta["grids"] == {"3x3": 4, "2x4": 2} and mixed.meta["grid"] == [3, 3]
        for key, value in mixed.tensors.items():
            expected = sum(parts[g].tensors[key] * counts[g] for g in GRIDS) / total
            torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12, msg=key)


def test_normalised_entropy_divides_each_image_by_its_own_tokens():
    mixed = run(AttentionStats())
    parts = {grid: run(AttentionStats(), of_grid(grid)) for grid in GRIDS}
    expected = (parts[(3, 3)].tensors["entropy_normalised"] * 4 + parts[(2, 4)].tensors["entropy_normalised"] * 2) / 6
    torch.testing.assert_close(mixed.tensors["entropy_normalised"], expected, rtol=1e-12, atol=1e-12)
    assert mixed.meta["tokens"] == {"10": 4, "9": 2} and mixed.meta["num_tokens"] == 10
    # not the mean entropy over one log N: the two grids' N differ (10 and 9 tokens)
    assert not torch.allclose(mixed.tensors["entropy_normalised"], mixed.tensors["entropy"] / math.log(10))


@pytest.mark.parametrize("cls,key", [(CLSAttentionMaps, "mean_map"), (SpatialAverageMaps, "mean_map"),
                                     (AttentionRollout, "mean_map"), (AlignedAttention, "aaam")])
def test_maps_keep_one_mean_per_grid(cls, key):
    """The main grid (most images) under the plain names, the other as ``@HxW``; each equal to the single-grid run
    of its images, random baselines included; chosen images split by grid."""
    mixed = run(cls(images=(0, 3, 5)) if cls is not AlignedAttention else cls())
    for j, grid in enumerate(GRIDS):
        alone = run(cls(images=(0, 3, 5)) if cls is not AlignedAttention else cls(), of_grid(grid))
        suffix = "" if j == 0 else f"@{grid[0]}x{grid[1]}"
        torch.testing.assert_close(mixed.tensors[key + suffix], alone.tensors[key], rtol=1e-12, atol=1e-12)
        random = "random_map" if cls is AttentionRollout else "random_" + key
        torch.testing.assert_close(mixed.tensors[random + suffix], alone.tensors[random], rtol=1e-12, atol=1e-12)
        if cls is not AlignedAttention:
            torch.testing.assert_close(mixed.tensors["image_maps" + suffix], alone.tensors["image_maps"])
    if cls is AlignedAttention:
        assert mixed.meta["head_types"] == run(cls(), of_grid((3, 3))).meta["head_types"]
        assert set(mixed.meta["other_grids"]) == {"2x4"}
    else:
        assert mixed.meta["image_indices"] == [0, 5]
        assert mixed.meta["other_grids"]["2x4"]["image_indices"] == [3]
    stems = {f.stem for f in mixed.figures()}
    other = {CLSAttentionMaps: "_mean_grid2x4", SpatialAverageMaps: "_mean_grid2x4", AttentionRollout: "_grid2x4"}
    if cls in other:  # the other grid's dataset maps are drawn too
        assert mixed.name + other[cls] in stems, stems


def test_merged_states_of_two_grids_equal_one_run():
    """Two processes that saw different grids merge into the run that saw both (the state is keyed by grid)."""
    a, b = CLSAttentionMaps(images=()), CLSAttentionMaps(images=())
    for analysis, batches in ((a, BATCHES[:1]), (b, BATCHES[1:])):
        for grid, size, start in batches:
            analysis.update(*batch_of(grid, size, start))
    merged = a.merge(b).compute()
    whole = run(CLSAttentionMaps(images=()))
    assert merged.meta["grids"] == whole.meta["grids"]
    for key, value in whole.tensors.items():
        torch.testing.assert_close(merged.tensors[key], value, rtol=1e-12, atol=1e-12)
