"""Top-k most-activating images per unit (paper 001 figs. 2 and 5): exact merge, brute-force agreement."""

from __future__ import annotations

import pytest
import torch

import vitscope
from vitscope.analyses import get_analysis
from vitscope.analyses.activations.top import TopActivations
from vitscope.analyses.base import Batch
from vitscope.featviz import FFNChannel, evaluate
from vitscope.models.spec import ModelSpec

SPEC = ModelSpec(name="fake", family="tiny-vit", kind="transformer", num_blocks=2, num_heads=2, embed_dim=4,
                 mlp_dim=6, patch_size=4, grid=(2, 3), num_prefix_tokens=1, prefix_kinds=("cls",), image_size=(8, 12))
HOOK = "blocks.1.mlp.post"


def _batches(n: int, size: int, seed: int, ties: bool = False) -> list[tuple[dict, Batch]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, n, size):
        b = min(size, n - start)
        x = torch.randn(b, SPEC.num_tokens, SPEC.mlp_dim, generator=gen)
        if ties:  # few distinct values: many equal scores, the index must break the ties
            x = torch.randint(0, 2, (b, SPEC.num_tokens, SPEC.mlp_dim), generator=gen).float()
        idx = list(range(start, start + b))
        out.append(({HOOK: x}, Batch(pixels=torch.zeros(b, 3, 8, 12), indices=idx, paths=[f"img{i}.png" for i in idx],
                                     spec=SPEC, grid=(2, 3))))
    return out


def _run(acc: TopActivations, batches) -> TopActivations:
    for rec, batch in batches:
        acc.update(rec, batch)
    return acc


@pytest.mark.parametrize("ties", [False, True])
def test_merge_equals_whole_exactly(ties: bool) -> None:
    batches = _batches(23, 4, seed=0, ties=ties)
    whole = _run(TopActivations(hooks=[HOOK], k=5), batches).compute()
    for cut in (1, 3, 5):
        a = _run(TopActivations(hooks=[HOOK], k=5), batches[:cut])
        b = _run(TopActivations(hooks=[HOOK], k=5), batches[cut:])
        for merged in (a.fresh().merge(a).merge(b).compute(), b.fresh().merge(b).merge(a).compute()):
            for key in whole.tensors:
                assert torch.equal(merged[key], whole[key]), key
            assert merged.meta == whole.meta


def test_matches_brute_force_top_k_with_maps() -> None:
    batches = _batches(17, 5, seed=1)
    res = _run(TopActivations(hooks=[HOOK], k=3, channels=[0, 4]), batches).compute()
    acts = torch.cat([rec[HOOK] for rec, _ in batches])[:, 1:]  # [17, 6, C]
    for row, c in enumerate([0, 4]):
        scores = acts[:, :, c].double().mean(1)
        top = torch.argsort(-scores, stable=True)[:3]
        assert res[f"{HOOK}.indices"][row].tolist() == top.tolist()
        torch.testing.assert_close(res[f"{HOOK}.scores"][row], scores[top])
        torch.testing.assert_close(res[f"{HOOK}.maps"][row], acts[top, :, c].reshape(3, 2, 3))
    assert res.meta["channels"] == {HOOK: [0, 4]}
    assert set(res.meta["paths"]) == {str(i) for i in res[f"{HOOK}.indices"].flatten().tolist()}


def test_channel_mapping_and_errors() -> None:
    acc = TopActivations(hooks=[HOOK], channels={HOOK: [5]})
    res = _run(acc, _batches(4, 4, seed=2)).compute()
    assert res[f"{HOOK}.maps"].shape == (1, 4, 2, 3)
    with pytest.raises(ValueError, match="do not exist"):
        _run(TopActivations(hooks=[HOOK], channels=[99]), _batches(2, 2, seed=2))
    with pytest.raises(ValueError, match="k must be"):
        TopActivations(k=0)
    assert get_analysis("top_activations", k=2)._cfg_k == 2


def test_maps_kept_for_the_first_channels_only_and_merge_stays_exact() -> None:
    batches = _batches(19, 4, seed=3)
    everything = _run(TopActivations(hooks=[HOOK], k=4, maps_for=None), batches).compute()
    few = _run(TopActivations(hooks=[HOOK], k=4, maps_for=2), batches).compute()
    assert everything[f"{HOOK}.maps"].shape == (6, 4, 2, 3) and few[f"{HOOK}.maps"].shape == (2, 4, 2, 3)
    assert torch.equal(few[f"{HOOK}.maps"], everything[f"{HOOK}.maps"][:2])  # same images, same order
    assert torch.equal(few[f"{HOOK}.indices"], everything[f"{HOOK}.indices"])  # every channel keeps its top-k
    assert few.meta["mapped"] == {HOOK: [0, 1]} and few.meta["channels"] == {HOOK: list(range(6))}
    a = _run(TopActivations(hooks=[HOOK], k=4, maps_for=2), batches[:2])
    b = _run(TopActivations(hooks=[HOOK], k=4, maps_for=2), batches[2:])
    merged = a.merge(b).compute()
    assert all(torch.equal(merged[key], few[key]) for key in few.tensors)
    listed = _run(TopActivations(hooks=[HOOK], k=4, channels=[1, 3, 5], maps_for=1), batches).compute()
    assert listed[f"{HOOK}.maps"].shape[0] == 3  # listed channels always keep their maps
    with pytest.raises(ValueError, match="maps_for"):
        TopActivations(maps_for=-1)


def test_engine_pass_agrees_with_the_featviz_objective(tmp_path) -> None:
    from vitscope.data.synthetic.write import synthesize

    root = synthesize(tmp_path / "data", "imagefolder", n=12, size=64, seed=0)
    tiny = vitscope.load_model("tiny-vit-sup")
    acc = TopActivations(hooks=["blocks.2.mlp.post", "blocks.1.attn.k"], k=3, channels={"blocks.2.mlp.post": [7, 9]})
    res = vitscope.run(tiny, root, [acc], batch_size=5, device="cpu", progress=False)["top_activations"]
    assert res["blocks.1.attn.k.scores"].shape == (128, 3)
    ds = __import__("vitscope.data.open", fromlist=["as_source"]).as_source(root)
    images = torch.stack([tiny.preprocess([ds.get(i).image])[0] for i in range(len(ds))])
    pixels01 = images * torch.tensor(tiny.spec.std).view(1, 3, 1, 1) + torch.tensor(tiny.spec.mean).view(1, 3, 1, 1)
    want = evaluate(tiny, [FFNChannel(2, 7), FFNChannel(2, 9)], pixels01)  # [12, 2]
    for row in range(2):
        top = torch.argsort(-want[:, row], stable=True)[:3]
        assert res["blocks.2.mlp.post.indices"][row].tolist() == top.tolist()
        torch.testing.assert_close(res["blocks.2.mlp.post.scores"][row], want[top, row], rtol=1e-4, atol=1e-5)
    saved = res.save(tmp_path / "out")
    assert {p.suffix for p in saved} == {".csv", ".json", ".npz"}  # the patch maps go to .npz, written once
    import numpy as np

    with np.load(next(p for p in saved if p.suffix == ".npz")) as arrays:
        np.testing.assert_array_equal(arrays["blocks.2.mlp.post.maps"], res["blocks.2.mlp.post.maps"].numpy())
    assert all(p.stat().st_size > 0 for p in res.plot(tmp_path / "figs"))


def test_paths_and_pictures_are_pruned_by_snapshots_that_arrive_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the heaps' indices reach the host a batch late (a copy never waited for): what is kept meanwhile
    stays bounded by the heaps plus the newest batches, and the result is the one of snapshots read at once."""
    from vitscope.cache import host_copy

    class LateEvent:  # finished once another snapshot has been queued after it
        made: list = []

        def __init__(self) -> None:
            self.after = len(LateEvent.made)
            LateEvent.made.append(self)

        def query(self) -> bool:
            return len(LateEvent.made) > self.after + 2  # two copies a snapshot: done one snapshot later

    batches = _batches(60, 4, seed=2)
    at_once = _run(TopActivations(hooks=[HOOK], k=2), batches)
    monkeypatch.setattr(host_copy, "_copy_event", lambda cuda, device=None: LateEvent())
    late = TopActivations(hooks=[HOOK], k=2)
    held = []
    for rec, batch in batches:
        late.update(rec, batch)
        held.append(len(late.paths))
    kept = {i for t in late.top.values() for i in t["indices"].flatten().tolist()}
    assert max(held) <= len(kept) + 3 * 4 < 60, held  # the heaps' images and at most three batches
    assert max(held) > max(len(at_once.paths), 1)  # the snapshots did arrive late
    first, second = at_once.compute(), late.compute()
    assert first.meta == second.meta
    for key in first.tensors:
        assert torch.equal(first[key], second[key]), key


def test_kept_paths_are_spelt_from_the_root(tmp_path, monkeypatch) -> None:
    """Paths kept as the data was spelt (relative to the working folder) and a resume from another folder mixed
    two spellings in one list, the first ones naming no file from there."""
    import os

    from vitscope.data.synthetic.write import synthesize

    synthesize(tmp_path / "data", "imagefolder", n=4, size=32, seed=0)
    monkeypatch.chdir(tmp_path)
    res = vitscope.run(vitscope.load_model("tiny-vit"), "data", [TopActivations(hooks=["blocks.1.mlp.post"], k=2)],
                       batch_size=2, progress=False, workers=0)["top_activations"]
    paths = list(res.meta["paths"].values())
    assert paths and all(os.path.isabs(p) and os.path.isfile(p) for p in paths), paths
