"""Pure functions on tensors: no I/O, no plotting, no global state (docs/architecture.md, "Layers")."""

from vitscope.functional.attention import (
    attention_entropy,
    cls_attention_map,
    focus_index,
    mass_mask,
    random_attention,
    spatial_attention,
    spatial_average_map,
)
from vitscope.functional.attention_geometry import (
    HEAD_TYPES,
    aligned_attention,
    aligned_offset,
    attention_distance,
    local_head_type,
)
from vitscope.functional.attention_stats import max_attention
from vitscope.functional.cka import features_for_cka, hsic, linear_cka, minibatch_cka, minibatch_hsic_terms
from vitscope.functional.cka_grams import hsic_matrix
from vitscope.functional.cluster import cluster_scores, kmeans_labels
from vitscope.functional.correspondence import letterbox_geometry, transfer_keypoints
from vitscope.functional.faithfulness import (
    curve_area,
    patch_order,
    patch_pixel_mask,
    perturbation_schedule,
    random_order,
)
from vitscope.functional.frequency import frequency_filter
from vitscope.functional.guided_mask import curriculum_rho, guided_mask, guided_visible_ids
from vitscope.functional.interrelation import (
    interrelation,
    interrelation_patch_scores,
    patch_interrelation,
    random_interrelation,
)
from vitscope.functional.interrelation_stages import interrelation_stages, outside_baseline
from vitscope.functional.keypoints import pck
from vitscope.functional.knn import knn_classify
from vitscope.functional.linear_probe import linear_probe_accuracy, train_linear_probe
from vitscope.functional.occlusion import (
    boxes_pixel_mask,
    fill_pixels,
    masks_bounding_boxes,
    patch_to_pixel_mask,
    pixel_to_patch_mask,
    random_patch_mask,
    score_patch_mask,
)
from vitscope.functional.pooling import mask_pool, mask_weights, random_features
from vitscope.functional.propagation import propagate_labels
from vitscope.functional.retrieval_scores import recall_at_k_map_at_r, revisited_map
from vitscope.functional.rollout import rollout
from vitscope.functional.semantic import class_histograms, pose_similarity
from vitscope.functional.sift import sift_keypoint_counts
from vitscope.functional.similarity import (
    cosine_topk,
    decomposed_similarity,
    display_map,
    frozen_layer_norm,
    paired_similarity,
    project_tokens,
    redistribute,
    retrieval_metrics,
)
from vitscope.functional.tiling import stitch_tiles, tiling_plan
from vitscope.functional.total_variation import total_variation
from vitscope.functional.video import davis_f, davis_j

__all__ = [
    "HEAD_TYPES", "aligned_attention", "aligned_offset", "attention_distance", "attention_entropy",
    "cls_attention_map", "cluster_scores", "davis_f", "davis_j", "features_for_cka", "focus_index", "hsic",
    "kmeans_labels", "knn_classify", "linear_cka", "local_head_type", "mass_mask", "max_attention",
    "minibatch_cka", "minibatch_hsic_terms", "pck", "random_attention", "recall_at_k_map_at_r", "revisited_map",
    "rollout", "spatial_attention", "spatial_average_map",
    # representations and probes
    "hsic_matrix", "letterbox_geometry", "linear_probe_accuracy", "mask_pool", "mask_weights", "propagate_labels",
    "random_features", "stitch_tiles", "tiling_plan", "train_linear_probe", "transfer_keypoints",
    # paired similarity and explanations
    "class_histograms", "cosine_topk", "curve_area", "decomposed_similarity", "display_map", "frozen_layer_norm",
    "paired_similarity",
    "patch_order", "patch_pixel_mask", "perturbation_schedule", "pose_similarity", "project_tokens",
    "random_order", "redistribute", "retrieval_metrics",
    # SIFT interrelation and masking
    "boxes_pixel_mask", "curriculum_rho", "fill_pixels", "frequency_filter", "guided_mask", "guided_visible_ids",
    "interrelation", "interrelation_patch_scores", "interrelation_stages", "masks_bounding_boxes",
    "outside_baseline", "patch_interrelation", "patch_to_pixel_mask", "pixel_to_patch_mask", "random_interrelation",
    "random_patch_mask", "score_patch_mask", "sift_keypoint_counts",
    # feature visualisation
    "total_variation",
]
