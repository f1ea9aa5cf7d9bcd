"""Smoke test of the zoo study (paper 000 table 2 and figures 5 to 10) on a handful of held-out scenes."""

import json


def test_zoo_study_writes_every_figure_and_result(tmp_path):
    from vitscope.explain.zoo_study import zoo_study

    doc = zoo_study(tmp_path, num_scenes=40, k=2, num_queries=2, faithfulness_pairs=2, steps=2)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"fig5_class_maps.png", "fig6_checkpoints.png", "fig7_patch_size.png", "fig8_pair_vs_rollout.png",
            "fig9_retrieval.png", "fig10_pose_similarity.png", "results.json"} <= names
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(doc))
    table = doc["analyses"]["retrieval"]["heldout-unseen"]
    assert set(table) == {"tiny-vit-metric", "tiny-vit-metric-p16", "tiny-resnet-metric"}
    assert all(0.0 <= v <= 1.0 for scores in table.values() for v in scores.values())
    pose = doc["analyses"]["pose_similarity"]["tiny-vit-metric"]
    assert len(pose["per_rank"]) == 10 and 0.0 < pose["mean"] <= 1.0
    areas = doc["analyses"]["faithfulness"]["areas"]
    assert set(areas["tiny-vit-metric"]) == {"paired", "published R gamma", "raw", "rollout", "random"}
    assert set(areas["tiny-resnet-metric"]) == {"paired", "random"}
    assert all(-1.0 <= a <= 1.0 for model in areas.values() for modes in model.values() for a in modes.values())
