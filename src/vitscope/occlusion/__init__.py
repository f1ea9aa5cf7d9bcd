"""The masking API: hide parts of an image from a model, in pixel space or by dropping ViT tokens.

* masks: :func:`~vitscope.functional.score_patch_mask` (Top/Bottom by a patch score),
  :func:`~vitscope.functional.random_patch_mask`, :func:`~vitscope.functional.boxes_pixel_mask`,
  :func:`foreground_pixel_mask` (boxes or segmentation masks of a dataset item, in model geometry);
* applying them: :func:`masked_logits` with ``mode="pixel"`` (fill with zero, the dataset mean or a blurred
  copy) or ``mode="drop"`` (remove the masked patch tokens from the sequence; transformers only).

Example::

    import vitscope
    from vitscope.functional import random_patch_mask
    from vitscope.occlusion import masked_logits

    backbone = vitscope.load_model("tiny-vit-sup")
    mask = random_patch_mask(len(pixels), backbone.spec.grid, 0.5, torch.Generator().manual_seed(0))
    logits = masked_logits(backbone, pixels, mask, mode="drop")
"""

from vitscope.occlusion.forward import MODES, logits_of, masked_logits
from vitscope.occlusion.regions import foreground_pixel_mask, instance_masks_to_model

__all__ = ["MODES", "foreground_pixel_mask", "instance_masks_to_model", "logits_of", "masked_logits"]
