"""Dataset items shared by every format reader: small dataclasses, arrays as numpy.

Conventions (docs/methods.md, Shared rules): boxes ``[x1, y1, x2, y2]`` float pixels, 0-based, x2/y2
exclusive; keypoints ``[K, 3]`` rows ``(x, y, visible)`` in pixels; masks ``[n, H, W]`` bool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class AnnotatedImage:
    """One image and its ground truth (fields a format lacks stay None).

    Attributes:
        image_path: absolute path of the image file.
        label: class index of the image, or None.
        masks: ``[n, H, W]`` bool, one per instance (or part, for part datasets).
        instance_labels: ``[n]`` int category of each mask / box.
        boxes: ``[n, 4]`` float32.
        keypoints: ``[K, 3]`` float32 ``(x, y, visible)``.
        keypoint_names: names of the K keypoints.
        instance_ids: ``[n]`` int identity of each instance (synthetic world, retrieval sets).
        meta: anything else the format carries (e.g. COCO image id, super-class).
    """

    image_path: str
    label: int | None = None
    masks: np.ndarray | None = None
    instance_labels: np.ndarray | None = None
    boxes: np.ndarray | None = None
    keypoints: np.ndarray | None = None
    keypoint_names: list[str] | None = None
    instance_ids: np.ndarray | None = None
    meta: dict = field(default_factory=dict)


@dataclass
class ImagePair:
    """SPair-style pair with corresponding keypoints (row k of ``src_kps`` matches row k of ``trg_kps``)."""

    src_path: str
    trg_path: str
    src_kps: np.ndarray  # [K, 2] float32 (x, y)
    trg_kps: np.ndarray  # [K, 2] float32
    src_box: np.ndarray  # [4]
    trg_box: np.ndarray  # [4]
    category: str
    meta: dict = field(default_factory=dict)


@dataclass
class VideoSequence:
    """DAVIS-style sequence: frame paths and per-frame instance-index masks (0 = background, k = object k)."""

    name: str
    frame_paths: list[str]
    mask_paths: list[str]

    def masks(self) -> np.ndarray:
        """``[T, H, W]`` uint8 object indices, decoded on demand."""
        from PIL import Image

        return np.stack([np.asarray(Image.open(p)) for p in self.mask_paths])


@dataclass
class RetrievalGroundTruth:
    """Revisited Oxford/Paris ground truth of one query (indices into the database)."""

    bbx: np.ndarray | None
    easy: np.ndarray
    hard: np.ndarray
    junk: np.ndarray
