"""Help text of ``vitscope analyze`` that lists the analyses (static, so ``--help`` does not import torch;
``tests/unit/test_cli_help.py`` keeps it in step with the registry), and help shared by several commands."""

from __future__ import annotations

#: ``--figure-files`` of every command whose report draws charts
FIGURE_FILES_HELP = ("Also write curves and heat maps as PNG and SVG in figures/ (the report draws them in the "
                     "browser, with PNG and SVG downloads; default: off, as drawing each takes a few tenths of a "
                     "second).")

#: ``--config`` of every command that reads its options from a YAML file
CONFIG_HELP = "YAML file of options (keys as the long options); command-line options override it."

#: ``--resume`` of every command whose pass keeps resumable state
RESUME_HELP = "Continue from the state saved by an interrupted run of the same command (default: on)."

#: ``--image-size`` of every command that loads a model
IMAGE_SIZE_HELP = ("Input side in pixels (a multiple of the patch size): the resize, centre crop and token grid "
                   "follow, position embeddings are interpolated [the model's preprocessing: an alias's paper "
                   "settings, else its preprocessor_config.json, else its family's defaults at config.json's size].")

#: group -> (member, what it measures, needs), in the order ``--help`` shows them; members of several groups
#: appear under their first
ANALYSES_BY_GROUP: dict[str, list[tuple[str, str, str]]] = {
    "attention": [
        ("cls_attention_maps", "CLS attention maps", "a CLS token"),
        ("spatial_average_maps", "spatial-average attention maps", ""),
        ("aligned_attention", "dataset-aligned attention map and head types", ""),
        ("attention_distance", "mean attention distance (unit square)", ""),
        ("saliency_iou", "IoU of attention maps with object masks", "masks (e.g. ::coco)"),
        ("attention_focus", "entropy and focus index", ""),
        ("attention_rollout", "attention rollout maps", ""),
    ],
    "representation": [
        ("cka", "linear CKA between every pair of blocks", ""),
        ("residual_cka", "CKA of skip and branch per sublayer", "a transformer"),
        ("clustering", "per-block k-means against labels", "labels"),
    ],
    "probes": [
        ("knn_probe", "per-block k-NN accuracy", "labels"),
        ("linear_probe", "per-block linear-probe accuracy", "labels"),
    ],
    "masking": [
        ("interrelation_masking", "accuracy when masking by SIFT interrelation", "a classifier, labels; opt-in"),
        ("foreground_masking", "foreground-only / background-only accuracy", "a classifier, labels, masks; opt-in"),
        ("frequency_filtering", "accuracy under low/high-pass filtering", "a classifier, labels; opt-in"),
    ],
    "": [
        ("attention_stats", "entropy and max attention per block and head", ""),
        ("interrelation", "SIFT keypoint interrelation per block and head", "a transformer"),
        ("mean_activation", "mean and variance of every token position", ""),
        ("top_activations", "most-activating images of every unit", ""),
    ],
}


def analyses_epilog() -> str:
    """The list of analyses and groups for ``analyze --help`` (each paragraph starts with click's \\b, which
    keeps its lines as written)."""
    paragraphs = ["\b\nAnalyses (--analyses NAME,GROUP,...). Without --analyses, every analysis runs that the\n"
                  "model and the data support (the others are listed with the reason); the masking ones are\n"
                  "opt-in: they run only when named.\n"
                  "Their parameters (-p NAME.KEY=VALUE), with defaults and meaning: --params-of NAME."]
    for group, members in ANALYSES_BY_GROUP.items():
        lines = ["\b", f"{group} group:" if group else "not in a group:"]
        lines += [f"  {name:<22} {what}" + (f" [needs {needs}]" if needs else "") for name, what, needs in members]
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)
