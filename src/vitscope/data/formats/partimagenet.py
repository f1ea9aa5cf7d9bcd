"""PartImageNet: COCO-format annotations whose instances are object *parts*.

Layout::

    root/annotations/<split>.json      COCO schema; categories are parts, e.g.
                                       {"id": 0, "name": "Quadruped Head", "supercategory": "Quadruped"}
    root/images/<split>/<file_name>

The object class of a part is its category's ``supercategory``. Reader conventions: classes are the
supercategories in order of first appearance over the categories sorted by id (PartImageNet groups the
part ids by class, so this is the published class order); ``instance_labels`` index the part categories
sorted by id; ``label`` = the class whose non-crowd parts cover the most area in the image (total of the
``area`` fields, crowd parts counted only when there is nothing else; ties go to the first class;
the object class in PartImageNet, where an image shows one object class).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from vitscope.data.formats.coco import CocoDataset
from vitscope.data.formats.coco_writer import write_coco_files
from vitscope.data.formats.common import DatasetFormatError, PathLike, image_suffix
from vitscope.data.items import AnnotatedImage
from vitscope.data.synthetic.scene import ClassSpec, Scene
from vitscope.errors import VitscopeValueError


def part_categories(classes: Sequence[ClassSpec]) -> list[dict]:
    """COCO part categories of ``classes``: ids from 0, class by class in part order, named ``"<Class> <part>"``."""
    cats = []
    for spec in classes:
        if not spec.part_names:
            raise VitscopeValueError(f"class {spec.name!r} has no parts; PartImageNet needs at least one part per "
                                     "class")
        for part in spec.part_names:
            cats.append({"id": len(cats), "name": f"{spec.name} {part}", "supercategory": spec.name})
    return cats


def write_partimagenet(
    scenes: Iterable[Scene],
    root: PathLike,
    classes: Sequence[ClassSpec],
    split: str = "train",
    use_rle: bool = False,
    image_format: str = "jpg",
) -> Path:
    """Write scenes as PartImageNet: one annotation per visible part of every object.

    Args:
        scenes: scenes to write; ``SceneObject.class_id`` indexes ``classes`` and ``part_masks`` follows
            ``ClassSpec.part_names`` (empty part masks are left out).
        root: output folder.
        classes: the class specs (names and part names), in class-id order.
        split: split name.
        use_rle: compressed RLE (exact) instead of polygons (as the published files; lossy at borders).
        image_format: ``"jpg"`` (default) or ``"png"``.

    Returns:
        Path of ``root/annotations/<split>.json``.
    """
    cats = part_categories(classes)
    first_id = np.cumsum([0] + [len(s.part_names) for s in classes])
    suffix = image_suffix(image_format)
    root = Path(root)

    def instances(scene: Scene) -> Iterator[tuple[np.ndarray, int]]:
        for obj in scene.objects:
            n_parts = len(classes[obj.class_id].part_names)
            if len(obj.part_masks) != n_parts:
                raise VitscopeValueError(
                    f"scene {scene.index}: object of class {obj.class_id} has {len(obj.part_masks)} part masks, "
                    f"its class has {n_parts} parts"
                )
            for p, mask in enumerate(obj.part_masks):
                yield mask, int(first_id[obj.class_id] + p)

    return write_coco_files(
        scenes,
        root / "images" / split,
        root / "annotations" / f"{split}.json",
        cats,
        instances,
        use_rle,
        lambda s: f"{int(s.index):08d}{suffix}",
        lambda s: {"background": int(s.background)},  # the scene's background type, as the COCO world writes it
    )


class PartImageNetDataset(CocoDataset):
    """Lazy reader of PartImageNet (conventions in the module docstring).

    Items: ``masks`` ``[n, H, W]`` part masks, ``instance_labels`` ``[n]`` part category indices,
    ``boxes`` ``[n, 4]``, ``label`` = object class index (None without parts), ``meta`` = the COCO meta plus
    ``part_names`` (name of each mask's part category) and ``class_name``.

    Attributes:
        part_names: part category names sorted by id (what ``instance_labels`` index).
        classes: object class names (supercategories).
        part_to_class: ``[num_parts]`` int class index of each part category.
    """

    def __init__(self, root: PathLike, split: str = "train") -> None:
        """Parse ``root/annotations/<split>.json`` (no image is opened).

        Raises:
            DatasetFileNotFoundError: the annotation file is missing.
            DatasetFormatError: as :class:`CocoDataset`, or a category without ``supercategory``.
        """
        root = Path(root)
        super().__init__(
            root, split, ann_file=root / "annotations" / f"{split}.json", image_dir=root / "images" / split
        )
        self.name = f"partimagenet:{split}"
        self.part_names: list[str] = list(self.classes)
        object_classes: list[str] = []
        part_to_class = []
        for cat in self.categories:
            sup = cat.get("supercategory")
            if not isinstance(sup, str) or not sup:
                raise DatasetFormatError(
                    f"{self.ann_file.name}: part category id {cat['id']} has no supercategory (its object class)"
                )
            if sup not in object_classes:
                object_classes.append(sup)
            part_to_class.append(object_classes.index(sup))
        self.classes = object_classes
        self.part_to_class = np.asarray(part_to_class, dtype=np.int64)

    def _image_label(self, anns: list[dict], areas: list[float]) -> int | None:
        """The object class whose non-crowd parts cover the most area (all parts when every one is crowd)."""
        if not anns:
            return None
        area = np.zeros((2, len(self.classes)))  # row 0: non-crowd parts, row 1: all parts (fallback)
        for ann, a in zip(anns, areas):
            area[:, self.part_to_class[self._cat_index[ann["category_id"]]]] += [
                0.0 if ann.get("iscrowd", 0) else a, a]
        totals = area[0] if area[0].any() else area[1]
        return int(np.argmax(totals))

    def _get(self, index: int) -> AnnotatedImage:
        item = super()._get(index)  # its label is the object class (_image_label)
        item.meta["part_names"] = [self.part_names[p] for p in item.instance_labels]
        item.meta["class_name"] = self.classes[item.label] if item.label is not None else None
        return item
