"""Issue 7's validation on the metric zoo: the map of a matching pair puts its mass on the shared object.

Setting: held-out scenes (world seed ``data_seed + HELDOUT_OFFSET``, never trained on), matching pairs =
two scenes whose main object is the same *unseen* identity (metric models train on the other half of the
identities), each scene in one pair only. Object tokens are the tokens covered more than half by the
shared object's mask, background tokens those covered more than half by no object (other objects belong
to neither). A map "favours the object" when its mean over object tokens exceeds its mean over background
tokens. That comparison is what the displayed overlay shows (it is unchanged by the min-max normalisation
and by any value shared by all tokens) and it does not reward large objects.

Why this measurement, and which map (measured on these models; see the issue-7 report for all numbers):

* The premise holds: every model's similarity comes from the object. Occluding the shared object with the
  background's mean colour drops the mean score from 0.82 / 0.77 / 0.86 (tiny-vit-metric, p16, resnet) to
  0.46 / 0.44 / 0.42; occluding as many background pixels leaves it unchanged (within 0.005).
* Backgrounds are independent of identity (``spurious=None``): matching pairs share the background type no
  more often than chance (1 in 5), so background similarity is not real signal here.
* The raw token decomposition of the ViTs lives in *output* token space, not on the input image: after six
  blocks of mixing, the background output tokens are the ones most aligned with the partner's embedding
  (they aggregate the object's identity), so the raw map favours the background in nearly every pair, even
  when the backgrounds differ. Comparing it with input-space masks is the wrong measurement, which is why
  paper 000 redistributes with the rollout before display.
* Redistribution ``R^T gamma`` (``transpose=True``) credits every input patch with its share of every output
  token's contribution and conserves the sum, so "mass on the object" is well defined: it favours the object
  in every pair (58/58 maps for both ViTs). It is the measurement this test asserts for the ViTs. The
  ResNet's raw map is already in input space (local receptive fields), as the paper uses it (58/58 maps).
* Two honest shortfalls stay visible as strict xfails: the published redistribution ``R gamma`` (rows are
  outputs, so it averages contributions over each output's sources) still favours the background, and the
  pair-specific part of the ViT maps, ``R^T (gamma - mean gamma)``, favours the background too: the object
  focus of ``R^T gamma`` comes from the output-agnostic rollout (``score * rollout`` is its mean part).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitscope
from vitscope.data.synthetic.world import SyntheticWorld
from vitscope.explain import PairedSimilarity
from vitscope.functional.similarity import redistribute
from vitscope.zoo.heldout import HELDOUT_OFFSET, is_training_identity

NUM_SCENES = 200
MODELS = ("tiny-vit-metric", "tiny-vit-metric-p16", "tiny-resnet-metric")
VITS = MODELS[:2]


@pytest.fixture(scope="module")
def pairs():
    """Held-out images, the shared-object and any-object masks, and matching pairs of unseen identities."""
    world = SyntheticWorld(size=64, seed=0 + HELDOUT_OFFSET)  # the zoo's metric models use data seed 0
    scenes = [world.scene(i) for i in range(NUM_SCENES)]
    mains = [max(s.objects, key=lambda o: int(o.mask.sum())) for s in scenes]
    inst = torch.tensor([m.instance_id for m in mains])
    unseen = (~is_training_identity(inst)).nonzero().flatten().tolist()
    first: dict[int, int] = {}
    a, b = [], []
    for i in unseen:
        j = first.pop(int(inst[i]), None)
        if j is None:
            first[int(inst[i])] = i
        else:
            a.append(j)
            b.append(i)
    assert len(a) >= 25, f"only {len(a)} matching pairs of unseen identities"
    used = a + b  # only the paired scenes are kept (and encoded): pair i is (i, i + len(a))
    images = torch.from_numpy(np.stack([scenes[i].image for i in used])).permute(0, 3, 1, 2).contiguous()
    obj = torch.from_numpy(np.stack([mains[i].mask for i in used]))
    anything = torch.from_numpy(np.stack([np.any([o.mask for o in scenes[i].objects], 0) for i in used]))
    n = len(a)
    return {"images": images, "obj": obj, "any": anything, "a": list(range(n)), "b": list(range(n, 2 * n)),
            "same_background": float(np.mean([scenes[i].background == scenes[j].background for i, j in zip(a, b)]))}


@pytest.fixture(scope="module")
def explained(pairs):
    """Per model: the pair explanation (R^T when a rollout exists) and the token masks of image a and b."""
    out = {}
    for name in MODELS:
        ps = PairedSimilarity(vitscope.load_model(name), projection="head", transpose=True)
        enc = ps.encode(pairs["images"])
        ex = ps.explain_indices(enc, pairs["a"] + pairs["b"], enc, pairs["b"] + pairs["a"])  # both directions
        idx = pairs["a"] + pairs["b"]
        cover = torch.nn.functional.adaptive_avg_pool2d
        obj = cover(pairs["obj"][idx, None].float(), enc.grid).flatten(1) > 0.5
        bg = cover(1 - pairs["any"][idx, None].float(), enc.grid).flatten(1) > 0.5
        out[name] = {"ps": ps, "enc": enc, "ex": ex, "obj": obj, "bg": bg, "idx": idx}
    return out


def favours_object(maps: torch.Tensor, obj: torch.Tensor, bg: torch.Tensor) -> torch.Tensor:
    """``[M]`` bool: mean map value over object tokens > mean over background tokens."""
    m = maps.flatten(1).double()
    mean_obj = (m * obj).sum(1) / obj.sum(1).clamp_min(1)
    mean_bg = (m * bg).sum(1) / bg.sum(1).clamp_min(1)
    return (mean_obj > mean_bg) & (obj.sum(1) > 0) & (bg.sum(1) > 0)


def test_matching_pairs_share_backgrounds_no_more_than_chance(pairs):
    """Background similarity is not signal here: 5 background types, drawn independently of identity."""
    assert pairs["same_background"] < 0.35, f"{pairs['same_background']:.2f} of matching pairs share a background"


@pytest.mark.parametrize("name", MODELS)
def test_similarity_comes_from_the_shared_object(pairs, explained, name):
    """The premise: hiding the shared object breaks the match, hiding as much background does not."""
    e = explained[name]
    ps, a, b = e["ps"], pairs["a"], pairs["b"]
    images, obj, anything = pairs["images"][a].clone(), pairs["obj"][a], pairs["any"][a]
    hide_obj, hide_bg = images.clone(), images.clone()
    gen = torch.Generator().manual_seed(0)
    for i in range(len(a)):
        fill = images[i][:, ~anything[i]].float().mean(1).round().to(torch.uint8)[:, None]
        hide_obj[i][:, obj[i]] = fill
        bg_pixels = (~anything[i]).flatten().nonzero().flatten()
        chosen = bg_pixels[torch.randperm(len(bg_pixels), generator=gen)[:int(obj[i].sum())]]
        hide_bg[i].view(3, -1)[:, chosen] = fill
    partner = e["enc"].select(b).embeddings
    score = torch.cosine_similarity(e["enc"].select(a).embeddings, partner).mean()
    no_obj = torch.cosine_similarity(ps.embed(hide_obj), partner).mean()
    no_bg = torch.cosine_similarity(ps.embed(hide_bg), partner).mean()
    assert score - no_obj > 0.2, f"{name}: score {score:.3f}, object hidden {no_obj:.3f}"
    assert abs(score - no_bg) < 0.05, f"{name}: score {score:.3f}, background hidden {no_bg:.3f}"


@pytest.mark.parametrize("name", MODELS)
def test_matching_pair_maps_favour_the_shared_object(explained, name):
    """ViTs: R^T-redistributed maps; ResNet: the feature-map decomposition (no rollout)."""
    e = explained[name]
    hits = favours_object(e["ex"].map_a, e["obj"], e["bg"])
    assert hits.float().mean() >= 0.9, f"{name}: {int(hits.sum())}/{len(hits)} maps favour the object"


SHORTFALLS = {  # measured on the 29 pairs (58 maps) of this setting
    "raw": "raw ViT decomposition (output-token space) favours the background: 2/58 maps (tiny-vit-metric) and "
           "3/58 (p16) favour the object; background output tokens carry the identity after token mixing",
    "published": "published R gamma favours the background: 14/58 (tiny-vit-metric) and 5/58 (p16) maps favour "
                 "the object",
    "pair-specific": "pair-specific part R^T (gamma - mean gamma) favours the background: 9/58 (tiny-vit-metric) "
                     "and 9/58 (p16); the object focus of R^T gamma comes from the output-agnostic rollout",
}


@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.xfail(strict=True, reason=r))
                                     for v, r in SHORTFALLS.items()])
@pytest.mark.parametrize("name", VITS)
def test_vit_map_variants_that_do_not_favour_the_object(explained, name, variant):
    e = explained[name]
    ex, enc = e["ex"], e["enc"].select(e["idx"])
    gamma = ex.raw_a.flatten(1)
    maps = {
        "raw": gamma,
        "published": redistribute(gamma, enc.rollout, transpose=False),
        "pair-specific": redistribute(gamma - gamma.mean(1, keepdim=True), enc.rollout, transpose=True),
    }[variant]
    hits = favours_object(maps, e["obj"], e["bg"])
    assert hits.float().mean() >= 0.9, f"{name} {variant}: {int(hits.sum())}/{len(hits)} maps favour the object"
