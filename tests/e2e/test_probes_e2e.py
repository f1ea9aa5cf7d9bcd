"""Probes and representation analyses end to end on small synthetic datasets written here, with tiny-vit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vitscope
from vitscope.analyses.probes.clustering import Clustering, clustering_probe
from vitscope.analyses.probes.knn import KnnProbe
from vitscope.analyses.probes.result import best_block_table
from vitscope.analyses.representation.cka import BlockCKA
from vitscope.analyses.representation.residual import ResidualCKA
from vitscope.cache import FeatureCache, FeatureRequest
from vitscope.data import load_dataset
from vitscope.data.annotated_source import AnnotatedSource
from vitscope.data.synthetic.write import synthesize
from vitscope.downstream.davis import davis_probe
from vitscope.downstream.keypoints import keypoint_probe
from vitscope.downstream.retrieval import retrieval_probe
from vitscope.downstream.sweep import probe_sweep
from vitscope.engine.extract import extract_features
from vitscope.errors import VitscopeValueError
from vitscope.functional import knn_classify, revisited_map
from vitscope.models.views import LongSideView
from vitscope.viz.probe_figures import models_probe_curves

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("probes")
    plan = {"train": ("imagefolder", 30, 0), "test": ("imagefolder", 15, 1), "coco": ("coco", 6, 2),
            "revisitop": ("revisitop", 12, 3), "davis": ("davis", 1, 4), "spair": ("spair", 4, 5)}
    return {k: synthesize(root / k, fmt, n=n, size=48, seed=seed, num_classes=3) for k, (fmt, n, seed) in plan.items()}


@pytest.fixture(scope="module")
def backbone():
    return vitscope.load_model("tiny-vit")


def _count_forwards(backbone) -> list[int]:
    calls: list[int] = []
    plain = type(backbone).forward

    def forward(pixels, **kwargs):
        calls.append(int(pixels.shape[0]))
        return plain(backbone, pixels, **kwargs)

    backbone.forward = forward
    return calls


def test_sweep_runs_one_pass_per_image_then_none(data, tmp_path: Path) -> None:
    model = vitscope.load_model("tiny-vit")
    calls = _count_forwards(model)
    cache = FeatureCache(tmp_path)
    kw = {"train": load_dataset(data["train"]), "test": load_dataset(data["test"]), "batch_norm": (False,),
          "batch_size": 64}
    first = probe_sweep(model, cache, **kw)
    assert calls == [30, 15]  # cls and spatial_mean of every block from one pass over each set
    assert set(first) == {"knn_cls", "knn_spatial_mean", "linear_cls", "linear_spatial_mean", "clustering_cls",
                          "clustering_spatial_mean"}
    second = probe_sweep(model, cache, **kw)
    assert calls == [30, 15]
    for name, res in first.items():
        torch.testing.assert_close(res.tensors, second[name].tensors)
        assert res[res.metrics[0]].shape == (6,) and f"random_{res.metrics[0]}" in res.tensors
    table = best_block_table({"tiny-vit": first})
    assert len(table) == 4 + 2 * 3 and table.best_block.between(0, 5).all()
    assert table.score.between(-1, 1).all()
    figures = models_probe_curves({"a": first, "b": second}, tmp_path / "figures")
    assert figures and all(p.stat().st_size > 0 for p in figures)


def test_knn_probe_equals_a_direct_computation(data, backbone, tmp_path: Path) -> None:
    res = probe_sweep(backbone, FeatureCache(tmp_path), train=load_dataset(data["train"]),
                      test=load_dataset(data["test"]), tokens=("cls",), batch_norm=(False,))["knn_cls"]
    train, test = AnnotatedSource(load_dataset(data["train"])), AnnotatedSource(load_dataset(data["test"]))
    feats = []
    with torch.inference_mode(), backbone.record(["blocks.4.resid_post"]) as rec:
        for src in (train, test):
            backbone(backbone.preprocess([src.load(i) for i in range(len(src))]))
            feats.append(rec["blocks.4.resid_post"][:, 0].clone())
    pred = knn_classify(feats[0], torch.as_tensor(train.labels()), feats[1], k=20, temperature=0.07)
    assert res["accuracy"][4].item() == pytest.approx((pred.numpy() == test.labels()).mean())


def test_retrieval_probe(data, backbone, tmp_path: Path) -> None:
    dataset = load_dataset(data["revisitop"])
    cache = FeatureCache(tmp_path)
    res = retrieval_probe(backbone, dataset, cache, blocks=(2, 5))
    assert res.meta["blocks"] == [2, 5] and res.metrics == ["mAP_medium", "mAP_hard", "mAP_easy"]
    for m in res.metrics:
        values = res[m][~torch.isnan(res[m])]
        assert ((values >= 0) & (values <= 1)).all()
    entry = extract_features(backbone, AnnotatedSource(dataset), [FeatureRequest(blocks=(2, 5))], cache,
                             LongSideView())[FeatureRequest(blocks=(2, 5))]
    x = F.normalize(torch.from_numpy(np.array(entry.block(5))), dim=1)
    nq = len(dataset.queries)
    assert res["mAP_medium"][1].item() == pytest.approx(revisited_map(x[:nq] @ x[nq:].T, dataset.gnd, "medium"))


def test_retrieval_of_a_model_without_cls_ranks_the_spatial_mean(data, tmp_path: Path) -> None:
    """The sweep's retrieval pools as its k-NN requests do: the spatial mean where the model has no CLS token."""
    from helpers.hf_factories import make

    make("ijepa").save_pretrained(tmp_path / "ijepa")
    model = vitscope.load_model(str(tmp_path / "ijepa"))
    dataset, cache = load_dataset(data["revisitop"]), FeatureCache(tmp_path / "cache")
    res = probe_sweep(model, cache, retrieval=dataset, random_kind=None)["retrieval"]
    assert res.meta["pooling"] == "spatial_mean"
    direct = retrieval_probe(model, dataset, cache, pooling="spatial_mean", random_kind=None)
    torch.testing.assert_close(res.tensors, direct.tensors, equal_nan=True)


@pytest.mark.parametrize("tiling", [False, True])
def test_davis_probe(data, backbone, tmp_path: Path, tiling: bool) -> None:
    res = davis_probe(backbone, load_dataset(data["davis"]), FeatureCache(tmp_path), blocks=(0, 5), tiling=tiling)
    assert res.meta["blocks"] == [0, 5] and res.meta["num_sequences"] == 1
    jf, j, f = res["J&F"], res["J"], res["F"]
    torch.testing.assert_close(jf, (j + f) / 2)
    assert ((j >= 0) & (j <= 1)).all() and ((f >= 0) & (f <= 1)).all()
    assert res.meta["view"]["view"] == ("tiled" if tiling else "frame")
    assert 0 <= res["random_J&F"].item() <= 1


def test_probes_read_every_entry_they_use_from_a_cache_with_room_for_one(data, backbone, tmp_path: Path) -> None:
    """A bounded cache keeps the entries a probe reads together (DAVIS's sequences; the train and test features)
    until the probe is done, then fits its bound: the scores are those of an unbounded cache."""
    davis = load_dataset(synthesize(tmp_path / "davis2", "davis", n=2, size=48, seed=4))
    free = FeatureCache(tmp_path / "free")
    want = davis_probe(backbone, davis, free, blocks=(5,), random_kind=None)
    bound = free.size_bytes() * 3 // 4  # one of the two sequences
    got = davis_probe(backbone, davis, FeatureCache(tmp_path / "bounded", max_bytes=bound), blocks=(5,),
                      random_kind=None)
    torch.testing.assert_close(got.tensors, want.tensors)
    assert 0 < FeatureCache(tmp_path / "bounded").size_bytes() <= bound
    kw = {"train": load_dataset(data["train"]), "test": load_dataset(data["test"]), "tokens": ("cls",),
          "batch_norm": (False,), "blocks": (5,), "random_kind": None}
    want = probe_sweep(backbone, FeatureCache(tmp_path / "free2"), **kw)
    got = probe_sweep(backbone, FeatureCache(tmp_path / "bounded2", max_bytes=1), **kw)
    for name, res in want.items():
        torch.testing.assert_close(got[name].tensors, res.tensors)
    assert FeatureCache(tmp_path / "bounded2").keys() == []


def test_keypoint_probe(data, backbone, tmp_path: Path) -> None:
    dataset = load_dataset(data["spair"])
    res = keypoint_probe(backbone, dataset, FeatureCache(tmp_path), blocks=(1, 3), pairs_per_category=3)
    categories = {dataset[i].category for i in range(len(dataset))}
    assert res.meta["num_pairs"] == 3 * len(categories)
    p1, p05, p01 = res["PCK@0.1"], res["PCK@0.05"], res["PCK@0.01"]
    assert (p1 >= p05).all() and (p05 >= p01).all() and ((p1 >= 0) & (p1 <= 1)).all()
    again = keypoint_probe(backbone, dataset, FeatureCache(tmp_path), blocks=(1, 3), pairs_per_category=3)
    torch.testing.assert_close(again.tensors, res.tensors)  # seeded pair sampling


def _stored_turned(original: Path, root: Path, orientations: tuple[int, ...]) -> tuple[Path, Path]:
    """Two copies of an SPair folder that show the same pictures: ``plain`` stores each image (cropped to 48x40, so
    that a quarter turn changes its letterbox) as shown, ``tagged`` stores it turned back with an EXIF orientation
    tag, its keypoints annotated on those stored pixels. Keypoints are whole pixels, images lossless PNG bytes."""
    import json
    import shutil

    from PIL import Image

    from vitscope.data.orientation import orient_array, orient_points

    plain, tagged = root / "plain", root / "tagged"
    for copy in (plain, tagged):
        shutil.copytree(original, copy)
    shown, turns = {}, {}
    for k, jpg in enumerate(sorted((original / "JPEGImages").rglob("*.jpg"))):
        rel, o = jpg.relative_to(original), orientations[k % len(orientations)]
        shown[rel.name] = pixels = np.asarray(Image.open(jpg).convert("RGB"))[:, :40]
        turns[rel.name] = o
        Image.fromarray(pixels).save(plain / rel, format="PNG")
        stored = orient_array(pixels.transpose(2, 0, 1), o, inverse=True).transpose(1, 2, 0)
        exif = Image.Exif()
        exif[0x0112] = o
        Image.fromarray(np.ascontiguousarray(stored)).save(tagged / rel, format="PNG", exif=exif.tobytes())
    inverse = {6: 8, 8: 6}
    for pair in (original / "PairAnnotation").rglob("*.json"):
        ann = json.loads(pair.read_text())
        src, trg = np.rint(ann["src_kps"]), np.rint(ann["trg_kps"])
        keep = (src[:, 0] < 40) & (trg[:, 0] < 40)
        src, trg = src[keep], trg[keep]
        (plain / pair.relative_to(original)).write_text(json.dumps({**ann, "src_kps": src.tolist(),
                                                                    "trg_kps": trg.tolist()}))
        moved = {side: orient_points(xy, shown[ann[f"{side}_imname"]].shape[:2],
                                     inverse.get(turns[ann[f"{side}_imname"]], turns[ann[f"{side}_imname"]]))
                 for side, xy in (("src", src), ("trg", trg))}
        (tagged / pair.relative_to(original)).write_text(json.dumps({**ann, "src_kps": moved["src"].tolist(),
                                                                     "trg_kps": moved["trg"].tolist()}))
    return plain, tagged


def test_keypoints_annotated_on_stored_pixels_follow_the_exif_orientation(data, backbone, tmp_path: Path) -> None:
    """Images stored turned with an EXIF tag (keypoints on the stored pixels) score as the same pictures stored
    upright: the model sees the oriented pictures, and the keypoints are taken where those show them."""
    plain, tagged = _stored_turned(data["spair"], tmp_path, (6, 3, 8, 5, 2, 7, 4))
    kw = {"blocks": (1, 5), "pairs_per_category": None, "random_kind": None}
    want = keypoint_probe(backbone, load_dataset(plain, "spair"), FeatureCache(tmp_path / "a"), **kw)
    got = keypoint_probe(backbone, load_dataset(tagged, "spair"), FeatureCache(tmp_path / "b"), **kw)
    torch.testing.assert_close(got.tensors, want.tensors)
    assert want["PCK@0.1"].max() > 0


def test_davis_annotations_on_stored_frames_follow_the_exif_orientation(backbone, tmp_path: Path) -> None:
    """Frames stored turned with an EXIF tag, their masks on the stored pixels (as DAVIS annotates), give the masks
    the same pictures stored upright give, written on the stored pixels, and score as them."""
    import io
    import shutil

    from PIL import Image

    from vitscope.data.formats.davis import palette_png, read_davis_mask
    from vitscope.data.orientation import orient_array
    from vitscope.downstream.davis import davis_predictions

    original = synthesize(tmp_path / "davis", "davis", n=2, size=48, seed=4)
    plain, tagged = tmp_path / "plain", tmp_path / "tagged"
    for copy in (plain, tagged):
        shutil.copytree(original, copy)
    turns = {}
    for frame in sorted((original / "JPEGImages").rglob("*.jpg")):
        rel = frame.relative_to(original)
        turn = turns.setdefault(rel.parent.name, (6, 3)[len(turns) % 2])  # one orientation per sequence
        pixels = np.asarray(Image.open(frame).convert("RGB"))[:, :40]  # 48x40: a quarter turn changes the grid
        mask = read_davis_mask(original / "Annotations" / rel.parent.relative_to("JPEGImages") / f"{frame.stem}.png")
        Image.fromarray(pixels).save(plain / rel, format="PNG")  # lossless, under the .jpg name
        palette_png(mask[:, :40], plain / "Annotations" / rel.parent.relative_to("JPEGImages") / f"{frame.stem}.png")
        exif = Image.Exif()
        exif[0x0112] = turn
        stored = orient_array(pixels.transpose(2, 0, 1), turn, inverse=True).transpose(1, 2, 0)
        Image.fromarray(stored).save(tagged / rel, format="PNG", exif=exif.tobytes())
        palette_png(orient_array(mask[:, :40], turn, inverse=True),
                    tagged / "Annotations" / rel.parent.relative_to("JPEGImages") / f"{frame.stem}.png")
    kw = {"blocks": (1, 5), "random_kind": None}
    want = davis_probe(backbone, load_dataset(plain, "davis"), FeatureCache(tmp_path / "a"), **kw)
    got = davis_probe(backbone, load_dataset(tagged, "davis"), FeatureCache(tmp_path / "b"), **kw)
    torch.testing.assert_close(got["J"], want["J"])  # F's boundaries are found on the stored pixels: close, not equal
    torch.testing.assert_close(got["F"], want["F"], atol=0.01, rtol=0)
    assert want["J"].min() > 0
    upright = davis_predictions(backbone, load_dataset(plain, "davis"), 5, FeatureCache(tmp_path / "a"))
    stored = davis_predictions(backbone, load_dataset(tagged, "davis"), 5, FeatureCache(tmp_path / "b"))
    assert upright.keys() == stored.keys() and len(turns) == 2
    for name, png in upright.items():
        shown, written = (np.asarray(Image.open(io.BytesIO(b))) for b in (png, stored[name]))
        np.testing.assert_array_equal(written, orient_array(shown, turns[name.split("/")[0]], inverse=True))
    frame = next((tagged / "JPEGImages").rglob("00001.jpg"))
    Image.open(frame).save(frame, format="PNG")  # untagged now: one frame shown another way than the others
    with pytest.raises(VitscopeValueError, match="different EXIF orientations"):
        davis_probe(backbone, load_dataset(tagged, "davis"), FeatureCache(tmp_path / "b"), **kw)


def test_region_clustering_with_tiled_features(data, backbone, tmp_path: Path) -> None:
    dataset = load_dataset(data["coco"])
    res = probe_sweep(backbone, FeatureCache(tmp_path), regions=dataset, tiling=True)["clustering_regions"]
    assert res.meta["view"] == "tiled" and res["purity"].shape == (6,)
    labels = np.concatenate([dataset[i].instance_labels for i in range(len(dataset))])
    assert res.meta["k"] == len(np.unique(labels)) and res.meta["num_rows"] <= labels.size
    assert ((res["purity"] > 0) & (res["purity"] <= 1)).all()


def test_engine_run_with_representation_analyses(data, backbone) -> None:
    dataset = AnnotatedSource(load_dataset(data["coco"]), regions=True)
    analyses = [BlockCKA(batch=4), ResidualCKA(estimator="full"), Clustering(level="object"), KnnProbe()]
    results = vitscope.run(backbone, dataset, analyses, batch_size=4, device="cpu", progress=False)
    cka = results["cka"]["cka"]
    assert cka.shape == (6, 6) and torch.allclose(cka.diagonal(), torch.ones(6, dtype=torch.float64))
    assert results["residual_cka"]["attn_cka"].shape == (6,)
    regions = results["clustering"]
    assert regions.meta["level"] == "object" and regions["purity"].shape == (6,)
    # the same rows through the cache path give the same scores (engine and extraction agree)
    entry = extract_features(backbone, AnnotatedSource(load_dataset(data["coco"])), [FeatureRequest(pooling="mask")],
                             FeatureCache(Path(dataset.dataset.root) / "cache"))[FeatureRequest(pooling="mask")]
    torch.testing.assert_close(clustering_probe(entry)["purity"], regions["purity"])


def test_object_level_clustering_reads_the_regions_of_data_opened_as_analyze_opens_it(data, backbone) -> None:
    """`analyze -p clustering.level=object --data ROOT::coco` opens the data plainly: the engine loads its region
    masks and labels, so the rows are those of a source opened with regions=True; data without regions is refused."""
    from vitscope.errors import VitscopeError

    def clustered(source):
        return vitscope.run(backbone, source, [Clustering(level="object")], batch_size=4, device="cpu",
                            progress=False)["clustering"]

    plain = clustered(f"{data['coco']}::coco")
    regions = clustered(AnnotatedSource(load_dataset(data["coco"]), regions=True))
    assert plain.meta["level"] == "object" and plain.meta["num_rows"] == regions.meta["num_rows"] > 6
    for metric in ("purity", "nmi", "ari"):
        assert torch.equal(plain[metric], regions[metric]), metric
    with pytest.raises(VitscopeError, match=r"object-level rows need region masks .* \(--data ROOT::coco"):
        clustered(f"{data['train']}::imagefolder")
