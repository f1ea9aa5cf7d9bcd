"""In-memory training sets: uint8 image tensors with labels, from the synthetic world or an ImageFolder.

Tiny-zoo training sets are small (tens of thousands of 64 px images, about 12 KB each), so they are
rendered once into one ``uint8`` tensor and every recipe samples batches from it; augmentations run
batched on tensors (:mod:`vitscope.train.augment`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from vitscope.errors import VitscopeValueError, VitscopeWarning
from vitscope.models.spec import ModelSpec

__all__ = ["TensorImages", "image_folder_tensors", "normalise", "synthetic_split"]


@dataclass
class TensorImages:
    """A labelled image set held in memory.

    Attributes:
        images: ``[N, 3, H, W]`` uint8.
        labels: ``[N]`` int64 class labels.
        instances: ``[N]`` int64 identity labels (the synthetic main object's instance id), or None.
        class_names: names of the classes, indexed by label.
        foreground: ``[N, H, W]`` bool masks of the objects (the synthetic world's ground truth), or None;
            background augmentation (``SelfDistillConfig.background_swap``) needs them.
    """

    images: torch.Tensor
    labels: torch.Tensor
    instances: torch.Tensor | None = None
    class_names: tuple[str, ...] = ()
    foreground: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4 or self.images.shape[1] != 3:
            raise VitscopeValueError(f"images must be uint8 [N, 3, H, W], got {self.images.dtype} "
                                     f"{tuple(self.images.shape)}")
        if len(self.images) == 0:
            raise VitscopeValueError("the image set is empty")
        if not isinstance(self.labels, torch.Tensor) or self.labels.dim() != 1 or self.labels.is_floating_point() \
                or self.labels.is_complex() or self.labels.dtype == torch.bool:
            raise VitscopeValueError(f"labels must be an integer tensor [N], got "
                                     f"{getattr(self.labels, 'dtype', type(self.labels).__name__)} "
                                     f"{tuple(getattr(self.labels, 'shape', ()))}")
        if len(self.labels) != len(self.images):
            raise VitscopeValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        if int(self.labels.min()) < 0:
            raise VitscopeValueError(f"labels must be >= 0, got {int(self.labels.min())}")
        if self.foreground is not None and self.foreground.shape != (len(self.images), *self.images.shape[2:]):
            raise VitscopeValueError(f"foreground must be [N, H, W] = {(len(self.images), *self.images.shape[2:])}, "
                                     f"got {tuple(self.foreground.shape)}")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def num_classes(self) -> int:
        return len(self.class_names) or int(self.labels.max()) + 1

    def subset(self, keep: torch.Tensor) -> TensorImages:
        """The images where the boolean ``keep [N]`` is True (or at the given indices)."""
        inst = None if self.instances is None else self.instances[keep]
        fg = None if self.foreground is None else self.foreground[keep]
        return TensorImages(self.images[keep], self.labels[keep], inst, self.class_names, fg)

    def relabel_by_instance(self) -> TensorImages:
        """Labels become the instance ids, renumbered ``0..K-1`` in increasing order (metric learning)."""
        if self.instances is None:
            raise VitscopeValueError("this set has no instance labels")
        _, labels = torch.unique(self.instances, return_inverse=True)
        return TensorImages(self.images, labels, self.instances, (), self.foreground)


def synthetic_split(
    n: int, seed: int, size: int = 64, num_classes: int = 10, start: int = 0, spurious: float | None = None,
    progress: bool = False,
) -> TensorImages:
    """Render ``n`` scenes of the synthetic world (``seed``, indices ``start..start+n-1``) into tensors.

    The label is the scene's main object class, the instance the main (largest visible) object's id, the
    foreground the union of every object's mask.
    """
    from vitscope.data.synthetic.world import SyntheticWorld

    world = SyntheticWorld(num_classes=num_classes, size=size, seed=seed, spurious=spurious)
    images = np.empty((n, size, size, 3), dtype=np.uint8)
    labels = np.empty(n, dtype=np.int64)
    instances = np.empty(n, dtype=np.int64)
    foreground = np.zeros((n, size, size), dtype=bool)
    scenes = world.scenes(n, start=start)
    if progress:
        from rich.progress import track

        scenes = track(scenes, total=n, description=f"rendering {n} scenes (seed {seed})")
    for i, scene in enumerate(scenes):
        images[i] = scene.image
        labels[i] = scene.label
        areas = [int(o.mask.sum()) for o in scene.objects]
        instances[i] = scene.objects[int(np.argmax(areas))].instance_id
        for obj in scene.objects:
            foreground[i] |= obj.mask
    return TensorImages(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels),
                        torch.from_numpy(instances), tuple(c.name for c in world.classes), torch.from_numpy(foreground))


def image_folder_tensors(root: str | os.PathLike, spec: ModelSpec) -> TensorImages:
    """Load an ImageFolder (``root/<class>/<image>``) with the model's resize and centre crop.

    Unreadable images are skipped with a warning, as the analysis engine does.
    """
    import warnings

    from vitscope.data.formats.imagefolder import ImageFolderDataset
    from vitscope.data.images import ImageLoadError, load_rgb
    from vitscope.models.preprocess import resize_crop

    ds = ImageFolderDataset(root)
    images, labels, skipped = [], [], []
    for path, label in ds.samples:
        try:
            img = load_rgb(path)
        except ImageLoadError as err:
            skipped.append(f"{path}: {err}")
            continue
        images.append(np.asarray(resize_crop(img, spec), dtype=np.uint8))
        labels.append(label)
    if skipped:
        warnings.warn(f"skipped {len(skipped)} unreadable image(s), first: {skipped[0]}", VitscopeWarning, stacklevel=2)
    if not images:
        raise VitscopeValueError(f"no readable images in {root}")
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    return TensorImages(x, torch.tensor(labels, dtype=torch.int64), None, tuple(ds.classes))


def normalise(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """``[B, 3, H, W]`` uint8 or float in [0, 1] -> float32 normalised with the model's mean and std."""
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - m) / s
