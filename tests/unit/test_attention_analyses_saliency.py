"""Saliency IoU by hand (60% mass rule, best-head rules, ground-truth preprocessing) and the suite's
group / capability rules (CNN: no attention; saliency: masks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitscope.analyses import SaliencyIoU, attention_suite
from vitscope.analyses.attention.saliency import mask_to_grid
from vitscope.analyses.attention.suite import NoAttentionError
from vitscope.analyses.batch import union_plan
from vitscope.models.spec import ModelSpec
from vitscope.workflows.analyze import choose_analyses


def spec_2x2(prefix=("cls",), patch=1) -> ModelSpec:
    """2 x 2 grid, 2 heads, one block; with patch 1 the image is 2 x 2 px and masks map to the grid as is."""
    return ModelSpec(name="hand-vit", family="tiny-vit", kind="transformer", num_blocks=1, num_heads=2, embed_dim=8,
                     mlp_dim=16, patch_size=patch, grid=(2, 2), num_prefix_tokens=len(prefix),
                     prefix_kinds=tuple(prefix), image_size=(2 * patch, 2 * patch))


CNN = ModelSpec(name="hand-cnn", family="resnet", kind="cnn", num_blocks=2, num_heads=0, embed_dim=8, mlp_dim=0,
                patch_size=4, grid=(2, 2), num_prefix_tokens=0, prefix_kinds=(), image_size=(8, 8))


def batch_of(spec, masks, start=0):
    from vitscope.analyses import Batch

    n = len(masks)
    return Batch(pixels=torch.zeros(n, 3, *spec.image_size), indices=list(range(start, start + n)),
                 paths=[""] * n, spec=spec, grid=spec.grid, targets={"masks": masks})


def gt(*tokens, empty=False) -> np.ndarray:
    """Instance masks ``[1, 2, 2]`` covering the given row-major tokens of the 2 x 2 image."""
    m = np.zeros((0 if empty else 1, 2, 2), dtype=bool)
    for t in tokens:
        m[0, t // 2, t % 2] = True
    return m


def pattern(cls_rows: list[list[float]]) -> torch.Tensor:
    """One image: row 0 of head i is ``[0, *cls_rows[i]]`` (no mass on CLS); spatial rows are uniform."""
    x = torch.full((2, 5, 5), 0.25)
    x[:, :, 0] = 0.0
    for h, row in enumerate(cls_rows):
        x[h, 0] = torch.tensor([0.0, *row])
    return x


def test_iou_and_both_best_head_rules_by_hand():
    spec = spec_2x2()
    one_hot = [[1.0, 0, 0, 0], [0, 0, 0, 1.0]]
    # image 0: ground truth token 0; head 0 looks at token 0 (IoU 1), head 1 at token 3 (IoU 0)
    # image 1: ground truth tokens 0, 1; head 0 looks at token 3 (IoU 0), head 1 at token 0 (IoU 1/2)
    # image 2: no object: skipped
    x = torch.stack([pattern(one_hot), pattern(one_hot[::-1]), pattern(one_hot)])
    record = {"blocks.0.attn.pattern": x}
    acc = SaliencyIoU()
    acc.update(record, batch_of(spec, [gt(0), gt(0, 1), gt(empty=True)]))
    res = acc.compute()
    assert res.meta["num_images"] == 2 and res.meta["num_empty"] == 1 and res.meta["sources"] == ["cls", "spatial"]
    torch.testing.assert_close(res["cls_iou"], torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    torch.testing.assert_close(res["cls_best_iou"], torch.tensor([0.75], dtype=torch.float64))  # mean of per-image max
    torch.testing.assert_close(res["cls_best_iou_dataset"], torch.tensor([0.5], dtype=torch.float64))
    assert res["cls_best_head_dataset"].tolist() == [0]
    assert res["cls_best_head_count"].tolist() == [[1.0, 1.0]] and res["cls_most_often_best"].tolist() == [0]
    # spatial-average map is uniform: the 60% rule keeps tokens 0, 1, 2 (ties in index order) -> IoU 1/3, 2/3
    torch.testing.assert_close(res["spatial_iou"], torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    by_dataset = SaliencyIoU(best_head="dataset")
    by_dataset.update(record, batch_of(spec, [gt(0), gt(0, 1), gt(empty=True)]))
    torch.testing.assert_close(by_dataset.compute()["cls_best_iou"], torch.tensor([0.5], dtype=torch.float64))


def test_sixty_percent_mass_rule():
    spec = spec_2x2()
    # head 0 map (0.5, 0.3, 0.15, 0.05): 0.5 + 0.3 reach 60%, so tokens 0 and 1; ground truth 0, 2 -> IoU 1/3
    # head 1 map (0.05, 0.15, 0.3, 0.5): tokens 3 and 2 -> IoU 1/3 as well; mass=0.9 adds one token to each
    x = pattern([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]).unsqueeze(0)
    acc = SaliencyIoU()
    acc.update({"blocks.0.attn.pattern": x}, batch_of(spec, [gt(0, 2)]))
    torch.testing.assert_close(acc.compute()["cls_iou"], torch.tensor([[1 / 3, 1 / 3]], dtype=torch.float64))
    wide = SaliencyIoU(mass=0.9)
    wide.update({"blocks.0.attn.pattern": x}, batch_of(spec, [gt(0, 2)]))
    torch.testing.assert_close(wide.compute()["cls_iou"], torch.tensor([[2 / 3, 1 / 4]], dtype=torch.float64))


def test_models_without_cls_get_the_spatial_source_only():
    spec = spec_2x2(prefix=())
    acc = SaliencyIoU()
    acc.update({"blocks.0.attn.pattern": torch.full((1, 2, 4, 4), 0.25)}, batch_of(spec, [gt(0)]))
    res = acc.compute()
    assert res.meta["sources"] == ["spatial"] and "cls_iou" not in res.tensors
    torch.testing.assert_close(res["spatial_iou"], torch.tensor([[1 / 3, 1 / 3]], dtype=torch.float64))


def test_random_baseline_is_seeded_and_between_0_and_1():
    spec = spec_2x2()
    x = pattern([[1.0, 0, 0, 0]] * 2).unsqueeze(0)

    def baseline(seed):
        acc = SaliencyIoU(seed=seed, random_samples=8)
        acc.update({"blocks.0.attn.pattern": x}, batch_of(spec, [gt(0)]))
        return acc.compute()["random_cls_iou"]

    a, b = baseline(0), baseline(1)
    torch.testing.assert_close(a, baseline(0))
    assert not torch.equal(a, b)
    # a random 60% mask of 4 tokens keeps 2 or 3 of them: IoU with one token is 0, 1/3 or 1/2
    assert bool(((a > 0) & (a <= 0.5)).all())


def test_ground_truth_follows_the_image_geometry():
    spec = ModelSpec(name="m", family="tiny-vit", kind="transformer", num_blocks=1, num_heads=1, embed_dim=8,
                     mlp_dim=16, patch_size=2, grid=(4, 4), num_prefix_tokens=1, prefix_kinds=("cls",),
                     image_size=(8, 8))
    masks = np.zeros((2, 8, 16), dtype=bool)  # an 8 x 16 image: the centre crop keeps columns 4..11
    masks[0, :, :4] = True  # cropped away entirely
    masks[1, 4:, 12:] = True  # cropped away as well
    assert not mask_to_grid(masks, spec, (4, 4)).any()
    masks[1, :4, 4:8] = True  # the crop's top-left quadrant: tokens (0..1, 0..1)
    got = mask_to_grid(masks, spec, (4, 4))
    # bicubic downsampling rings one token beyond the edge, and "> 0" keeps it (docs/methods.md)
    want = np.zeros((4, 4), dtype=bool)
    want[:3, :3] = True
    np.testing.assert_array_equal(got, want)
    assert not mask_to_grid(np.zeros((0, 8, 16), dtype=bool), spec, (4, 4)).any()


def test_under_a_view_the_ground_truth_follows_the_views_geometry(tmp_path):
    """An 8 x 16 image letterboxed (whole, scaled to 8 x 4, padded above and below) is not centre cropped: its
    masks go the view's way (``Batch.frame``), which the engine sets for a run with a view."""
    import vitscope
    from vitscope.analyses.base import Analysis
    from vitscope.models.views import LetterboxView

    spec = ModelSpec(name="m", family="tiny-vit", kind="transformer", num_blocks=1, num_heads=1, embed_dim=8,
                     mlp_dim=16, patch_size=2, grid=(4, 4), num_prefix_tokens=1, prefix_kinds=("cls",),
                     image_size=(8, 8))
    masks = np.zeros((1, 8, 16), dtype=bool)
    masks[0, :, :4] = True  # the left quarter: cropped away by the model's own geometry, kept by the letterbox
    view = LetterboxView()
    batch = batch_of(spec, [masks])
    batch.frame = lambda image, resample: view.transform(image, spec, resample)
    got = SaliencyIoU()._ground_truth(batch).reshape(4, 4)
    from PIL import Image

    framed = view.transform(Image.fromarray(masks[0].astype(np.uint8) * 255), spec, None)
    want = np.asarray(framed.resize((4, 4), Image.Resampling.BICUBIC)) > 0
    assert want.any() and not mask_to_grid(masks, spec, (4, 4)).any()
    np.testing.assert_array_equal(got, want)

    class Frames(Analysis):  # what the engine hands over
        name = "frames"

        def __init__(self):
            super().__init__()
            self.seen = []

        def required_hooks(self, spec):
            return ["blocks.0.resid_post"]

        def update(self, record, batch):
            self.seen.append(batch.frame)

        def compute(self):
            return {}

    images = [np.zeros((16, 32, 3), dtype=np.uint8)]
    for chosen in (None, view):
        frames = Frames()
        vitscope.run(vitscope.load_model("tiny-vit"), images, [frames], view=chosen, progress=False, workers=0)
        assert (frames.seen[0] is None) == (chosen is None)
    assert frames.seen[0](Image.new("L", (32, 16)), None).size == (64, 64)


def test_missing_masks_are_a_clear_error():
    spec = spec_2x2()
    acc = SaliencyIoU()
    batch = batch_of(spec, [gt(0)])
    batch.targets = {"label": [1]}
    with pytest.raises(ValueError, match="needs ground-truth instance masks") as info:
        acc.update({"blocks.0.attn.pattern": pattern([[1.0, 0, 0, 0]] * 2).unsqueeze(0)}, batch)
    assert "\n" not in str(info.value)


def parse_analyses(names: str | None, spec, targets: frozenset[str] = frozenset()) -> list:
    return choose_analyses(names, spec, targets)


def test_suite_and_cli_rules():
    vit = spec_2x2()
    with pytest.raises(NoAttentionError, match="no attention"):
        attention_suite(CNN)
    with pytest.raises(ValueError, match="CNN and has no attention"):
        parse_analyses("attention", CNN)
    with pytest.raises(ValueError, match="hand-cnn is a CNN and has no attention"):
        parse_analyses("aligned_attention", CNN)
    with pytest.raises(ValueError, match="needs ground truth masks"):
        parse_analyses("saliency_iou", vit, frozenset({"label"}))
    plain = [a.name for a in parse_analyses("attention", vit, frozenset())]
    with_masks = [a.name for a in parse_analyses("attention,aligned_attention", vit, frozenset({"masks"}))]
    assert "saliency_iou" not in plain and "saliency_iou" in with_masks
    assert len(with_masks) == len(set(with_masks)) == len(plain) + 1
    suite = parse_analyses("attention_rollout,attention_focus", vit)
    plan = union_plan([a.shared_quantities(vit) for a in suite])  # one reduction per block serves both
    assert plan == {"attention_blocks": frozenset({"entropy", "focus"})}  # rollout folds blocks in update_block
    assert {a.name for a in parse_analyses(None, CNN)}.isdisjoint(plain)


def test_the_loading_thread_makes_the_ground_truth_the_update_would_make() -> None:
    from vitscope.analyses.attention.saliency import MASK_GRID

    spec = spec_2x2()
    analysis = SaliencyIoU()
    (key, (given, fn)), = analysis.target_transforms(spec).items()
    masks = [gt(0, 1), gt(3)]
    assert key == MASK_GRID and given == "masks"
    plain = batch_of(spec, masks)
    ready = batch_of(spec, masks)
    ready.targets[MASK_GRID] = [fn(m) for m in masks]
    assert np.array_equal(analysis._ground_truth(plain), analysis._ground_truth(ready))
    # the prepared grids are used when present: made-up ones change the answer
    ready.targets[MASK_GRID] = [((2, 2), np.ones((2, 2), dtype=bool))] * 2
    assert bool(analysis._ground_truth(ready).all())
    # a grid that is not the batch's (another input size) falls back to the masks
    ready.targets[MASK_GRID] = [((3, 3), np.ones((3, 3), dtype=bool))] * 2
    assert np.array_equal(analysis._ground_truth(ready), analysis._ground_truth(plain))
