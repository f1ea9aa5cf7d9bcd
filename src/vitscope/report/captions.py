"""The text beside every figure: what it shows, how to read it, and the paper figure it corresponds to.

Papers (``papers/`` in the project): 000 = paired image similarity for ViTs, 002 = "Teaching Matters"
(how supervision shapes ViTs), 003 = SIFT patch interrelation (attention focus index).
"""

from __future__ import annotations

import fnmatch
import re

__all__ = ["ANALYSIS_TEXT", "caption_for", "section_intro"]

#: One paragraph per analysis, shown at the top of its section.
ANALYSIS_TEXT: dict[str, str] = {
    "mean_activation": "Mean activation and token norm of the recorded sites, per token position.",
    "attention_stats": "Entropy of every attention row over all keys and the largest attention weight, per "
                       "block and head: low entropy means focused heads.",
    "cls_attention_maps": "Where the CLS token looks: its attention over the image patches, for every head of "
                          "every block, averaged over the dataset and for single images.",
    "spatial_average_maps": "Where the image tokens look on average: the attention of all spatial queries "
                            "summed over queries and normalised, per head and block (works without a CLS token).",
    "aligned_attention": "Aligned aggregated attention maps: every query's attention re-centred on the query and "
                         "averaged, so local heads show a bright centre and offset-local heads a shifted peak.",
    "attention_distance": "Average attention distance: how far (in image-width units) each head looks from its "
                          "query. Local processing has small distances, global processing large ones.",
    "saliency_iou": "Attention alignment with the ground-truth object masks: IoU between the smallest set of "
                    "patches holding 60% of a map's mass and the mask, per block (best head and per head).",
    "attention_focus": "Attention entropy and the focus index of paper 003 (entropy of min-max normalised spatial "
                       "rows): lower means more focused attention.",
    "attention_rollout": "Attention rollout: attention propagated through the residual stream from the input "
                         "patches to the output, averaged over the dataset and for single images.",
    "cka": "Linear CKA between the outputs of every pair of blocks: bright blocks compute similar "
           "representations.",
    "residual_cka": "Residual analysis: CKA between the skip input and each attention / MLP branch output, and the "
                    "norm ratio skip / branch. High CKA and ratio mean the branch changes little.",
    "clustering": "k-means of each block's image features scored against the class labels (purity, NMI, ARI); "
                  "the dashed line is random chance.",
    "knn_probe": "k-NN classification accuracy of each block's CLS features on held-out images (k = 20, cosine, "
                 "temperature 0.07); the dashed line is random chance.",
    "linear_probe": "Linear probe accuracy of each block's CLS features on held-out images; the dashed line is "
                    "random chance.",
    "top_activations": "The dataset images that activate each unit most (a top-k kept in one streaming pass), "
                       "with the unit's activation over their patches.",
    "interrelation": "SIFT patch interrelation: how much of each head's attention from keypoint (K) and "
                     "non-keypoint (N) patches goes to keypoint patches (KK, NK), the focus index, and the "
                     "retrieval / capture / coach stages read from those curves.",
    "interrelation_masking": "Accuracy when the patches with the highest (Top) or lowest (Bottom) interrelation "
                             "score are masked, against a random order, at growing mask ratios.",
    "foreground_masking": "Accuracy on the full image, the foreground only and the background only (ground-truth "
                          "boxes or masks), normalised by the full-image accuracy.",
    "frequency_filtering": "Accuracy after low-pass and high-pass filtering in the Fourier domain, over a sweep "
                           "of cut-off radii.",
}

# (glob on the figure file stem, caption, paper figure); first match wins
_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("cls_attention_maps_mean", "Dataset-average CLS attention maps: rows are blocks, columns heads.",
     "paper 002, fig. 2 and 17"),
    ("cls_attention_maps_random", "The same maps for random attention (the baseline every map is compared with).",
     "paper 002, fig. 17 (baseline)"),
    ("cls_attention_maps_image*", "CLS attention maps of one image, every block and head.",
     "paper 002, fig. 11 to 13"),
    ("spatial_average_maps_mean", "Dataset-average spatial-average attention maps: rows are blocks, columns heads.",
     "paper 002, fig. 17 (models without CLS)"),
    ("spatial_average_maps_random", "Spatial-average maps of random attention (baseline).", "paper 002, fig. 17"),
    ("spatial_average_maps_image*", "Spatial-average attention maps of one image.", "paper 002, fig. 11 to 13"),
    ("aligned_attention*", "Aligned aggregated attention maps per block and head; a bright centre marks a local "
     "head, an off-centre peak an offset-local head.", "paper 002, fig. 3 and 18 (offset heads: fig. 14)"),
    ("attention_distance*", "Average attention distance of every head per block (dots), the per-block mean (line) "
     "and random attention (dashed).", "paper 002, fig. 4 and 15"),
    ("saliency_iou_*heads", "Saliency IoU of every head per block.", "paper 002, fig. 16"),
    ("saliency_iou*", "Best-head saliency IoU per block against the object masks, with random attention.",
     "paper 002, fig. 5 and 16"),
    ("attention_focus*", "Attention entropy / focus index per block (and per head); lower is more focused.",
     "paper 003, focus index (eq. 5)"),
    ("attention_rollout*", "Attention rollout maps (dataset mean and single images).",
     "paper 000, section 3.2 (rollout redistribution)"),
    ("attention_stats*", "Attention entropy / maximum attention per block and head.", ""),
    ("top_activations*", "Top-k most activating images of each unit with their patch activation maps.",
     "paper 001, fig. 2 and 5"),
    ("interrelation_keypoints*", "SIFT keypoints on sample images with the patch grid; keypoint patches marked.",
     "paper 003, fig. 3"),
    ("interrelation_kk_nk*", "Weighted interrelation KK and NK per block (mean over heads and images).",
     "paper 003, fig. 5 and 6"),
    ("interrelation_focus*", "Attention focus index per block and head.", "paper 003, fig. 7a"),
    ("interrelation_stages*", "Retrieval, capture and coach stages found from the interrelation curves.",
     "paper 003, fig. 7a"),
    ("interrelation_masking*", "Accuracy against the ratio of masked patches: Top, Bottom and random order.",
     "paper 003, fig. 8"),
    ("foreground_masking*", "Full, foreground-only and background-only accuracy, normalised by full-image "
     "accuracy.", "paper 001, tables 2 and 3"),
    ("frequency_filtering*", "Accuracy against the cut-off radius of low-pass and high-pass filters.",
     "paper 001, section 5"),
    ("residual_cka*", "CKA between the skip path and the attention / MLP branches per block, and their norm ratio.",
     "paper 002, fig. 23"),
    ("cka", "Block-by-block linear CKA of this model.", "paper 002, fig. 20 to 22"),
    ("clustering*", "Clustering score per block (k-means on image features), random chance dashed.",
     "paper 002, fig. 7 and 24, 25"),
    ("knn_probe*", "k-NN accuracy per block, random chance dashed.", "paper 002, fig. 9 (left) and 28"),
    ("linear_probe*", "Linear-probe accuracy per block, random chance dashed.", "paper 002, fig. 9"),
    ("compare_attention_distance", "Mean attention distance per block for every model (relative depth on the "
     "x axis so models of different depth share it).", "paper 002, fig. 4"),
    ("compare_saliency_iou", "Best-head saliency IoU per block for every model.", "paper 002, fig. 5"),
    ("compare_clustering_purity", "Clustering purity of image features per block for every model.",
     "paper 002, fig. 7"),
    ("compare_knn_accuracy", "k-NN accuracy per block for every model.", "paper 002, fig. 9 (left)"),
    ("compare_cka_curve", "CKA of every model's blocks with the first model's block at the same relative depth.",
     "paper 002, fig. 6 (per block)"),
    ("compare_cka_matrix", "CKA between the final-block features of every pair of models.",
     "paper 002, fig. 6 and 19"),
    ("paired_similarity*", "Paired similarity maps: which patches of each image make the pair similar, for the "
     "metric-learning model (the contributions of each image sum to the cosine similarity).", "paper 000, fig. 4"),
)


def _pretty(stem: str) -> str:
    return re.sub(r"_+", " ", stem).strip().capitalize()


def caption_for(stem: str) -> tuple[str, str, str]:
    """``(title, caption, paper figure)`` of a figure file stem such as ``attention_distance``."""
    for pattern, caption, paper in _FIGURES:
        if fnmatch.fnmatchcase(stem, pattern):
            return _pretty(stem), caption, paper
    return _pretty(stem), "", ""


def section_intro(name: str) -> str:
    """The paragraph at the top of an analysis's section (empty when none is known)."""
    return ANALYSIS_TEXT.get(name, "")
