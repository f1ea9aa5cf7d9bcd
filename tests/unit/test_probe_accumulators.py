"""The label-hungry accumulators (clustering, k-NN, linear probe) on fake records with planted structure."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from contract.fake_records import fake_record, fake_spec
from vitscope.analyses.probes.clustering import Clustering
from vitscope.analyses.probes.knn import KnnProbe
from vitscope.analyses.probes.linear import LinearProbe

CENTRES = torch.tensor([[6.0, 0, 0, 0, 0, 0, 0, 0], [0, 6.0, 0, 0, 0, 0, 0, 0], [0, 0, 6.0, 0, 0, 0, 0, 0]])


def _batches(acc, sizes: list[int], seed: int = 0, start: int = 0) -> list[tuple]:
    """Fake batches whose block-1 CLS token sits at its label's centre (plus noise); labels = index % 3."""
    spec = fake_spec()
    gen = torch.Generator().manual_seed(seed)
    out = []
    for size in sizes:
        record, batch = fake_record(spec, acc.required_hooks(spec), size, gen, start_index=start)
        labels = torch.tensor(batch.targets["label"])
        record["blocks.1.resid_post"][:, 0] = CENTRES[labels] + 0.3 * record["blocks.1.resid_post"][:, 0]
        out.append((record, batch))
        start += size
    return out


def _run(acc, batches):
    for record, batch in batches:
        acc.update(record, batch)
    return acc


@pytest.mark.parametrize("cls", [Clustering, KnnProbe, LinearProbe])
def test_planted_block_scores_perfectly_and_beats_random(cls) -> None:
    res = _run(cls(), _batches(cls(), [30, 30, 30])).compute()
    metric = res.metrics[0]
    assert res.meta["blocks"] == [0, 1, 2]
    assert res[metric][1].item() == pytest.approx(1.0)
    assert res.best() == (1, pytest.approx(1.0))
    assert res[f"random_{metric}"].item() < 0.75
    assert res[metric][0].item() < 0.75  # the other blocks hold noise


def test_knn_split_is_held_out() -> None:
    res = _run(KnnProbe(test_fraction=0.3), _batches(KnnProbe(), [40, 40])).compute()
    assert res.meta["num_train"] + res.meta["num_test"] == 80
    assert 10 <= res.meta["num_test"] <= 40


def test_merge_of_spilled_states_equals_whole(tmp_path: Path) -> None:
    batches = _batches(Clustering(), [20, 20, 20], seed=3)
    whole = _run(Clustering(workdir=tmp_path / "w"), batches).compute()
    a = Clustering(workdir=tmp_path / "a")
    a.store.spill_bytes = 10  # force rows to disk
    b = Clustering(workdir=tmp_path / "b")
    _run(a, batches[:1])
    _run(b, batches[1:])
    merged = a.merge(b).compute()
    assert list(tmp_path.glob("a/shard-*"))
    for key, value in whole.tensors.items():
        torch.testing.assert_close(merged.tensors[key], value)


def test_missing_labels_are_reported() -> None:
    spec = fake_spec()
    acc = Clustering()
    record, batch = fake_record(spec, acc.required_hooks(spec), 4, torch.Generator().manual_seed(0))
    batch.targets = {}
    with pytest.warns(UserWarning, match="images without a class label are left out of the probe"):
        acc.update(record, batch)  # not "the data has no labels": other batches may have them
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not per batch
        acc.update(record, batch)
    res = acc.compute()
    assert res.tensors == {} and "no image labels" in res.meta["error"] and res.meta["unlabelled_images"] == 8
    assert Clustering.required_targets == ("label",)


def test_object_level_rows_pool_the_masks() -> None:
    """Region features = mask-weighted mean of the spatial tokens; tokens planted with the region's label."""
    spec = fake_spec()
    acc = Clustering(level="object")
    gen = torch.Generator().manual_seed(0)
    h, w = spec.image_size
    for start in (0, 6):
        record, batch = fake_record(spec, acc.required_hooks(spec), 6, gen, start_index=start)
        masks, labels = [], []
        for j, i in enumerate(batch.indices):
            m = np.zeros((2, h, w), dtype=bool)
            m[0, :, : w // 2] = True  # left half: label i % 3
            m[1, :, w // 2 :] = True  # right half: label (i + 1) % 3
            masks.append(m)
            labels.append(np.array([i % 3, (i + 1) % 3]))
            grid = record["blocks.2.resid_post"][j, 1:].reshape(*spec.grid, -1)
            grid[:, : spec.grid[1] // 2] = CENTRES[i % 3]
            grid[:, spec.grid[1] // 2 :] = CENTRES[(i + 1) % 3]
        batch.targets = {"masks": masks, "instance_labels": labels}
        acc.update(record, batch)
    res = acc.compute()
    assert res.meta["num_rows"] == 24 and res.meta["level"] == "object"
    assert res["purity"][2].item() == pytest.approx(1.0) and res["nmi"][2].item() == pytest.approx(1.0)
    plain = Clustering(level="part")
    record, batch = fake_record(spec, plain.required_hooks(spec), 2, gen)
    batch.targets = {"label": [0, 1]}
    with pytest.warns(UserWarning, match="region masks"):
        plain.update(record, batch)


def test_every_registered_analysis_is_importable_from_vitscope_analyses() -> None:
    import vitscope.analyses as public
    import vitscope.downstream as downstream
    from vitscope.analyses.registry import ANALYSES

    for name, cls in ANALYSES.items():
        assert getattr(public, cls.__name__, None) is cls and cls.__name__ in public.__all__, name
    for fn in ("best_block_table", "knn_probe", "linear_probe", "clustering_probe", "cross_model_cka", "cka_between"):
        assert callable(getattr(public, fn)) and fn in public.__all__
    for fn in ("probe_sweep", "retrieval_probe", "davis_probe", "keypoint_probe"):  # they drive the engine: a floor up
        assert callable(getattr(downstream, fn)) and fn in downstream.__all__ and not hasattr(public, fn)
