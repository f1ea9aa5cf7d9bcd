"""Tiled backbone (dense features by tiling for engine analyses, paper 002 appendix B.4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitscope
from vitscope.analyses.attention.stats import AttentionStats
from vitscope.analyses.probes.clustering import Clustering, clustering_probe
from vitscope.analyses.probes.knn import KnnProbe
from vitscope.analyses.registry import get_analysis
from vitscope.analyses.representation.cka import BlockCKA
from vitscope.cache import FeatureCache, FeatureRequest
from vitscope.data import load_dataset
from vitscope.data.annotated_source import AnnotatedSource
from vitscope.data.synthetic.write import synthesize
from vitscope.engine.extract import extract_features
from vitscope.engine.tiling import run_tiled
from vitscope.models.tiled import TilingError, wrap_tiled
from vitscope.models.views import TiledView

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vit():
    return vitscope.load_model("tiny-vit")


def _placed(per_tile: dict[tuple[int, int], torch.Tensor], frame: tuple[int, int], stride: int) -> torch.Tensor:
    """Each tile's map ``[B, D, h, w]`` written at its origin, later tiles only where nothing was written yet."""
    first = next(iter(per_tile.values()))
    out = torch.full((first.shape[0], first.shape[1], frame[0] // stride, frame[1] // stride), float("nan"))
    for (top, left), m in per_tile.items():
        r, c = top // stride, left // stride
        window = out[:, :, r : r + m.shape[2], c : c + m.shape[3]]
        out[:, :, r : r + m.shape[2], c : c + m.shape[3]] = torch.where(torch.isnan(window), m, window)
    return out


def test_stitched_tokens_equal_each_tiles_tokens_in_place(vit) -> None:
    """A 128 x 160 frame on a 64 px model: tiles at left 0, 64 and 96 (shifted back; its first 4 columns are
    already covered), top 0 and 64. Every per-token record equals the tiles' own forwards placed in the grid."""
    tiled = wrap_tiled(vit)
    hooks = ["embed", "blocks.1.norm1", "blocks.3.mlp.post", "blocks.5.resid_post", "final_norm"]
    pixels = torch.randn(2, 3, 128, 160, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), tiled.record(hooks) as rec:
        tiled(pixels)
        stitched = {h: rec[h].clone() for h in hooks}
    origins = [(0, 0), (0, 64), (0, 96), (64, 0), (64, 64), (64, 96)]
    for h in hooks:
        per_tile = {}
        with torch.inference_mode(), vit.record([h]) as rec:
            for top, left in origins:
                vit(pixels[:, :, top : top + 64, left : left + 64])
                tokens = rec[h][:, 1:]  # drop CLS: [B, 64, D]
                per_tile[(top, left)] = tokens.reshape(2, 8, 8, -1).permute(0, 3, 1, 2)
        expected = _placed(per_tile, (128, 160), 8)  # [B, D, 16, 20]
        assert stitched[h].shape == (2, 16 * 20, expected.shape[1])
        got = stitched[h].reshape(2, 16, 20, -1).permute(0, 3, 1, 2)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_cnn_maps_are_stitched_at_their_own_stride() -> None:
    cnn = vitscope.load_model("tiny-resnet-metric")
    tiled = wrap_tiled(cnn)
    hooks = ["embed", "stages.0", "stages.3", "features"]
    pixels = torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode(), tiled.record(hooks) as rec:
        tiled(pixels)
        stitched = {h: rec[h].clone() for h in hooks}
    assert stitched["features"].shape[-2:] == tiled.spec.grid == (8, 8)
    with torch.inference_mode(), cnn.record(hooks) as rec:
        for h in hooks:
            per_tile = {}
            for top in (0, 64):
                for left in (0, 64):
                    cnn(pixels[:, :, top : top + 64, left : left + 64])
                    per_tile[(top, left)] = rec[h].clone()
            stride = 64 // per_tile[(0, 0)].shape[-1]
            torch.testing.assert_close(stitched[h], _placed(per_tile, (128, 128), stride), rtol=1e-5, atol=1e-5)


def test_tiled_spec_and_preprocessing(vit) -> None:
    tiled = wrap_tiled(vit, scale=2)
    spec = tiled.spec
    assert spec.image_size == (128, 128) and spec.grid == (16, 16) and spec.grid_for(128, 160) == (16, 20)
    assert spec.num_prefix_tokens == 0 and spec.patch_size == vit.spec.patch_size and not spec.has_head
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8))
    assert tuple(tiled.preprocess([image]).shape) == (1, 3, 128, 128)
    assert wrap_tiled(vit, scale=1.5).spec.image_size == (96, 96)  # 1.5 * 64, a multiple of the patch (8)
    with pytest.raises(TilingError, match="scale must be >= 1"):
        wrap_tiled(vit, scale=0.5)
    with pytest.raises(TilingError, match="already tiled"):
        wrap_tiled(tiled)
    with pytest.raises(TilingError, match="staged execution"):
        tiled.embed(torch.zeros(1, 3, 64, 64))


def test_a_model_keeping_aspect_ratios_is_tiled_in_square_tiles() -> None:
    """SigLIP 2 NaFlex (a token budget): the tiled frame is one square, cut into square tiles the model runs on."""
    from helpers.hf_factories import make

    naflex = vitscope.wrap(make("siglip2"), name="siglip2")
    tiled = wrap_tiled(naflex, scale=2)
    assert naflex.spec.max_tokens == 16 and tiled.spec.max_tokens is None and tiled.spec.grid == (8, 8)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8))
    with torch.no_grad(), tiled.record("blocks.1.resid_post") as rec:
        tiled(tiled.preprocess([image]))
    assert tuple(rec["blocks.1.resid_post"].shape) == (1, 64, naflex.spec.embed_dim)


def test_attention_cannot_be_recorded_and_hooks_are_removed(vit) -> None:
    tiled = wrap_tiled(vit)
    with pytest.raises(TilingError, match="attention over the stitched grid"):
        with tiled.record(["blocks.*.attn.pattern"]):
            pass
    with tiled.record(["blocks.0.resid_post"]):
        assert len(tiled._active) == 1
    assert not tiled._active
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in vit.model.modules())


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize(tmp_path_factory.mktemp("tiled") / "coco", "coco", n=6, size=48, seed=2, num_classes=3)


def test_attention_or_cls_analyses_with_tiling_name_the_analysis(vit, coco) -> None:
    dataset = AnnotatedSource(load_dataset(coco), regions=True)
    with pytest.raises(TilingError, match="analysis 'attention_stats' reads attention"):
        run_tiled(vit, dataset, [AttentionStats()], device="cpu", progress=False)
    with pytest.raises(TilingError, match="analysis 'knn_probe' reads the CLS token"):
        run_tiled(vit, dataset, [KnnProbe(tokens="cls")], device="cpu", progress=False)
    with pytest.raises(TilingError, match="analysis 'attention_stats' reads attention"):  # by name, as run takes it
        run_tiled(vit, dataset, ["attention_stats"], device="cpu", progress=False)
    # straight through vitscope.run the wrapper itself refuses: attention hooks, and CLS readers by name
    with pytest.raises(TilingError, match="attention"):
        vitscope.run(wrap_tiled(vit), dataset, [AttentionStats()], device="cpu", progress=False)
    with pytest.raises(ValueError, match="knn_probe"):
        vitscope.run(wrap_tiled(vit), dataset, [KnnProbe(tokens="cls")], device="cpu", progress=False)


def test_spatial_analyses_run_tiled_end_to_end(vit, coco, tmp_path: Path) -> None:
    """Object-level clustering, spatial-mean k-NN and CKA through the engine on tiled features; the
    clustering equals the feature-cache path with a TiledView (square images: the same 128 x 128 frame)."""
    dataset = AnnotatedSource(load_dataset(coco), regions=True)
    analyses = [Clustering(level="object"), KnnProbe(tokens="spatial_mean", k=3), BlockCKA(tokens="spatial_mean",
                                                                                           estimator="full")]
    results = run_tiled(vit, dataset, analyses, batch_size=4, device="cpu", progress=False)
    regions = results["clustering"]
    assert regions.meta["model"] == "tiny-vit+tiled2" and regions["purity"].shape == (6,)
    assert ((regions["purity"] > 0) & (regions["purity"] <= 1)).all()
    assert results["knn_probe"]["accuracy"].shape == (6,)
    cka = results["cka"]["cka"]
    assert cka.shape == (6, 6) and torch.allclose(cka.diagonal(), torch.ones(6, dtype=torch.float64))
    request = FeatureRequest(pooling="mask")
    entry = extract_features(vit, AnnotatedSource(load_dataset(coco)), [request], FeatureCache(tmp_path),
                             TiledView())[request]
    assert entry.meta["grid"] == [16, 16] and regions.meta["num_rows"] == len(entry)
    torch.testing.assert_close(clustering_probe(entry)["purity"], regions["purity"])


def test_run_tiled_takes_registered_names_as_vitscope_run_does(vit, coco) -> None:
    dataset = AnnotatedSource(load_dataset(coco), regions=True)
    by_name = run_tiled(vit, dataset, ["mean_activation"], batch_size=4, device="cpu", progress=False)
    by_instance = run_tiled(vit, dataset, [get_analysis("mean_activation")], batch_size=4, device="cpu",
                            progress=False)
    got, want = by_name["mean_activation"].tensors, by_instance["mean_activation"].tensors
    assert by_name.num_images == 6 and want and set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
