"""Paper 000's experiments on the metric zoo, in one call: table 2 and figures 5 to 10, plus faithfulness.

Data: held-out scenes of the zoo's test world (seed ``HELDOUT_OFFSET``, never trained on) whose main
object is an unseen identity; labels are the identities (SOP's protocol). Optionally an SOP-format dataset
(``vitscope synth --format sop``) for table 2. Run ``python -m vitscope.explain.zoo_study --out DIR``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitscope.strict_json import dumps, write_json_atomic

__all__ = ["zoo_study"]

VIT, P16, RESNET = "tiny-vit-metric", "tiny-vit-metric-p16", "tiny-resnet-metric"


def _heldout(num_scenes: int) -> tuple[Any, list, torch.Tensor, torch.Tensor]:
    from vitscope.data.synthetic.world import SyntheticWorld
    from vitscope.zoo.heldout import HELDOUT_OFFSET, is_training_identity

    world = SyntheticWorld(size=64, seed=HELDOUT_OFFSET)
    scenes = [world.scene(i) for i in range(num_scenes)]
    inst = torch.tensor([max(s.objects, key=lambda o: int(o.mask.sum())).instance_id for s in scenes])
    keep = (~is_training_identity(inst)).nonzero().flatten().tolist()
    scenes = [scenes[i] for i in keep]
    images = torch.from_numpy(np.stack([s.image for s in scenes])).permute(0, 3, 1, 2).contiguous()
    return world, scenes, images, inst[keep]


def zoo_study(out: str | os.PathLike, num_scenes: int = 400, k: int = 4, num_queries: int = 4,
              transpose: bool = True, sop_root: str | os.PathLike | None = None, faithfulness_pairs: int = 16,
              steps: int = 16) -> dict[str, Any]:
    """Run the study and write figures and ``results.json`` into ``out``.

    Args:
        out: output folder.
        num_scenes: held-out scenes rendered (about half show an unseen identity and are kept).
        k: retrieved images shown per query (pose similarity uses the top 10, as the paper).
        num_queries: queries drawn in the figures (the first images that have a match).
        transpose: redistribute ViT maps with ``R^T`` (sum-preserving) rather than the published ``R``.
        sop_root: an SOP-format dataset for table 2 (its test split), or None.
        faithfulness_pairs: matching pairs whose deletion and insertion curves are measured.
        steps: curve steps.

    Returns:
        The ``results.json`` document.
    """
    from vitscope.explain.across_models import explain_pairs_across_models, retrieve_across_models
    from vitscope.explain.class_maps import class_similarity_maps
    from vitscope.explain.explained_retrieval import explain_retrieval, sop_tensors
    from vitscope.explain.faithfulness import faithfulness_curves
    from vitscope.explain.paired import PairedSimilarity
    from vitscope.explain.semantic import pose_similarity_at_k, scene_segmentations
    from vitscope.functional.similarity import redistribute
    from vitscope.models.load import load_model
    from vitscope.viz import explain_figures as ef
    from vitscope.zoo import checkpoints

    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    world, scenes, images, labels = _heldout(num_scenes)
    counts = torch.bincount(labels)[labels]
    queries = (counts > 1).nonzero().flatten()[:num_queries].tolist()

    def make(b: Any) -> PairedSimilarity:
        return PairedSimilarity(b, projection="head", transpose=transpose)

    explainers = {n: make(load_model(n)) for n in (VIT, P16, RESNET)}
    encoded = {n: ps.encode(images) for n, ps in explainers.items()}
    top = max(k, 10)
    ranked = {n: explain_retrieval(ps, encoded[n], labels, k=top) for n, ps in explainers.items()}
    doc: dict[str, Any] = {"config": {"num_scenes": num_scenes, "images": len(images), "k": k, "transpose": transpose,
                                      "models": list(explainers)}, "analyses": {}}
    table = {"heldout-unseen": {n: r.metrics for n, r in ranked.items()}}
    if sop_root is not None:
        for n, ps in explainers.items():
            sop = sop_tensors(sop_root, ps.backbone.spec)
            table.setdefault("sop", {})[n] = explain_retrieval(ps, ps.encode(sop.images), sop.labels, k=1).metrics
    doc["analyses"]["retrieval"] = table

    def top_k(r: Any) -> Any:  # the first k of the top 10, for the figures
        sub = {f: getattr(r, f)[queries, :k] for f in ("indices", "scores", "correct", "query_maps", "gallery_maps")}
        return type(r)(queries=r.queries[queries], query_rollout=None, metrics=r.metrics, **sub)

    ef.retrieval_figure(images, {VIT: top_k(ranked[VIT]), RESNET: top_k(ranked[RESNET])}, outdir / "fig9_retrieval.png")
    maps, n_maps = class_similarity_maps(explainers[VIT], encoded[VIT], labels, queries)
    ef.class_maps_figure(images, queries, maps, outdir / "fig5_class_maps.png")
    q, g = queries[0], int(ranked[VIT].indices[queries[0], 0])
    pair = explainers[VIT].explain_indices(encoded[VIT], [q], encoded[VIT], [g])
    ef.pair_figure(images[q], images[g], pair.map_a[0], pair.map_b[0], float(pair.score[0]),
                   outdir / "fig8_pair_vs_rollout.png", pair.rollout_a[0], pair.rollout_b[0])
    steps_ranked = retrieve_across_models(checkpoints(VIT), images, labels, [q], k=3, make=make)
    ef.models_figure(images[q], {m: images[r.indices[0]] for m, r in steps_ranked.items()},
                     {m: r.gallery_maps[0] for m, r in steps_ranked.items()}, outdir / "fig6_checkpoints.png",
                     {m: r.scores[0].tolist() for m, r in steps_ranked.items()})
    partners = ranked[VIT].indices[q, :3]
    by_patch = explain_pairs_across_models([explainers[VIT].backbone, explainers[P16].backbone],
                                           images[[q] * 3], images[partners], make=make)
    ef.models_figure(images[q], list(images[partners]), {m: e.map_b for m, e in by_patch.items()},
                     outdir / "fig7_patch_size.png", {m: e.score.tolist() for m, e in by_patch.items()})
    seg = scene_segmentations(scenes, world.num_classes)  # objects by class, backgrounds by type
    num_segments = world.num_classes + world.num_backgrounds
    pose = {n: pose_similarity_at_k(r.indices[:, :10], r.queries, seg, num_segments) for n, r in ranked.items()}
    ef.pose_similarity_figure({n: p["per_rank"] for n, p in pose.items()}, outdir / "fig10_pose_similarity.png")
    doc["analyses"]["pose_similarity"] = {n: {"mean": p["mean"], "per_rank": p["per_rank"]} for n, p in pose.items()}
    doc["analyses"]["class_maps"] = {"queries": queries, "maps_summed": n_maps.tolist()}

    # faithfulness on matching pairs: the top-1 when it is correct
    correct = ranked[VIT].correct[:, 0].nonzero().flatten()[:faithfulness_pairs]
    fa, fb = correct, ranked[VIT].indices[correct, 0]
    faith = {}
    for n, ps in explainers.items():
        ex = ps.explain_indices(encoded[n], fa, encoded[n], fb)
        orders = {"paired": ex.map_a}
        if ex.rollout_a is not None:
            enc = encoded[n].select(fa)
            orders.update({"published R gamma": redistribute(ex.raw_a.flatten(1), enc.rollout).view_as(ex.raw_a),
                           "raw": ex.raw_a, "rollout": ex.rollout_a})
        curves = faithfulness_curves(ps, images[fa], images[fb], orders, steps=steps)
        ef.faithfulness_figure(curves.fractions, curves.curves, outdir / f"faithfulness_{n}.png")
        faith[n] = curves.summary()
    doc["analyses"]["faithfulness"] = {"pairs": len(fa), "steps": steps, "areas": faith}
    write_json_atomic(outdir / "results.json", doc)
    return doc


def main() -> None:  # pragma: no cover - manual entry point
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenes", type=int, default=400)
    parser.add_argument("--sop", default=None, help="an SOP-format dataset root (vitscope synth --format sop)")
    parser.add_argument("--published-rollout", action="store_true", help="use R instead of R^T for ViT maps")
    args = parser.parse_args()
    doc = zoo_study(args.out, args.scenes, sop_root=args.sop, transpose=not args.published_rollout)
    print(dumps({k: doc["analyses"][k] for k in ("retrieval", "pose_similarity", "faithfulness")}, indent=1))


if __name__ == "__main__":  # pragma: no cover
    main()
