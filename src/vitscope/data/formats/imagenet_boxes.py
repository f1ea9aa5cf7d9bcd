"""ImageNet-style classification images with PASCAL VOC XML boxes (the ILSVRC localisation layout).

Layouts read (vitscope's writer makes the first)::

    root/LOC_synset_mapping.txt            one line per class: "<wnid> <class name>" (defines label order)
    root/<split>/<wnid>/<wnid>_<n>.JPEG    images, one folder per class
    root/boxes/<wnid>/<wnid>_<n>.xml       VOC XML per image (same stem as the image; an image may have none)

    root/LOC_synset_mapping.txt            the ILSVRC localisation release (as Kaggle ships it)
    root/LOC_<split>_solution.csv          labels of a flat split ("ImageId,PredictionString": wnid x1 y1 x2 y2 ...)
    root/ILSVRC/Data/CLS-LOC/<split>/      images: class folders (train) or flat (val)
    root/ILSVRC/Annotations/CLS-LOC/<split>/   VOC XML per image, in class folders or flat like the images

A flat split's label is the wnid of the first object of its row in ``LOC_<split>_solution.csv`` (every object of
an ILSVRC validation image has the image's class). Boxes are read from the XML files only.

VOC XML (``annotation/filename``, ``size/width,height,depth``, ``object/name`` = wnid,
``object/bndbox/xmin,ymin,xmax,ymax``) stores boxes **1-based, inclusive**. vitscope boxes are 0-based with
x2/y2 exclusive (docs/methods.md, Shared rules), so the writer stores ``xmin = x1 + 1, ymin = y1 + 1, xmax = x2,
ymax = y2`` and the reader converts back ``x1 = xmin - 1, y1 = ymin - 1, x2 = xmax, y2 = ymax``: a box
covering pixel columns 0..9 is ``xmin=1, xmax=10`` in VOC and ``[0, 10)`` here.

As in ImageNet, an image without an XML file simply has no boxes (``boxes`` is ``[0, 4]``); a missing box folder
is an error (read such a copy as ``imagefolder``). XML files are parsed when the item is accessed, never at
construction. Boxes are in the pixels of the image their XML's ``size`` names: where the image on disk has
another size (a downscaled copy of ImageNet with the original XMLs), they are scaled to the image on disk.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from vitscope.atomic import write_text_atomic
from vitscope.data.formats.common import (
    DatasetFileNotFoundError,
    DatasetFormatError,
    LazyDataset,
    PathLike,
    image_suffix,
    require_file,
    save_image,
)
from vitscope.data.images import IMAGE_EXTENSIONS
from vitscope.data.items import AnnotatedImage
from vitscope.data.synthetic.scene import Scene
from vitscope.errors import VitscopeValueError

SYNSET_MAPPING = "LOC_synset_mapping.txt"
#: where the ILSVRC release keeps its images and its XML files, one folder per split below each
ILSVRC_IMAGES = Path("ILSVRC", "Data", "CLS-LOC")
ILSVRC_BOXES = Path("ILSVRC", "Annotations", "CLS-LOC")


def default_wnid(class_id: int) -> str:
    """Synthetic WordNet-style id of class ``class_id`` (``"n00000007"``)."""
    return f"n{class_id:08d}"


def _box_xml(filename: str, width: int, height: int, objects: list[tuple[str, np.ndarray]]) -> ET.Element:
    ann = ET.Element("annotation")
    ET.SubElement(ann, "filename").text = filename
    size = ET.SubElement(ann, "size")
    for tag, value in (("width", width), ("height", height), ("depth", 3)):
        ET.SubElement(size, tag).text = str(value)
    for wnid, box in objects:
        obj = ET.SubElement(ann, "object")
        ET.SubElement(obj, "name").text = wnid
        bnd = ET.SubElement(obj, "bndbox")
        x1, y1, x2, y2 = (round(float(v)) for v in box)
        for tag, value in (("xmin", x1 + 1), ("ymin", y1 + 1), ("xmax", x2), ("ymax", y2)):
            ET.SubElement(bnd, tag).text = str(value)
    return ann


def write_imagenet_boxes(
    scenes: Iterable[Scene],
    root: PathLike,
    class_names: Sequence[str],
    split: str = "train",
    wnids: Sequence[str] | None = None,
    image_format: str = "jpg",
) -> list[Path]:
    """Write scenes in the ImageNet localisation layout (module docstring).

    Image ``<wnid>_<scene.index>.JPEG`` goes to the folder of ``scene.label``; its XML lists a box per
    visible object (fully occluded objects are left out), named by the object's wnid.

    Args:
        scenes: scenes to write.
        root: output folder (created); ``LOC_synset_mapping.txt`` is (re)written.
        class_names: class name of each class id.
        split: image sub-folder, e.g. ``"train"`` or ``"val"``.
        wnids: folder id of each class; default ``n%08d`` of the class id.
        image_format: ``"jpg"`` (default, suffix ``.JPEG`` as ImageNet) or ``"png"`` (lossless).

    Returns:
        The written image paths, in the order of ``scenes``.
    """
    suffix = ".JPEG" if image_suffix(image_format) in (".jpg", ".jpeg") else ".png"
    wnids = list(wnids) if wnids is not None else [default_wnid(i) for i in range(len(class_names))]
    if len(wnids) != len(class_names) or len(set(wnids)) != len(wnids):
        raise VitscopeValueError("wnids must be distinct, one per class name")
    for name in class_names:
        if "\n" in name:
            raise VitscopeValueError(f"class name {name!r} must fit on one line")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(root / SYNSET_MAPPING, "".join(f"{w} {n}\n" for w, n in zip(wnids, class_names)))
    paths = []
    for scene in scenes:
        wnid = wnids[scene.label]
        stem = f"{wnid}_{scene.index}"
        path = save_image(scene.image, root / split / wnid / f"{stem}{suffix}")
        objects = [(wnids[o.class_id], o.box) for o in scene.objects if o.mask.any()]
        height, width = scene.image.shape[:2]
        xml = _box_xml(path.name, width, height, objects)
        ET.SubElement(xml, "background").text = str(int(scene.background))  # the scene's type (ground truth)
        ET.indent(xml)
        xml_path = root / "boxes" / wnid / f"{stem}.xml"
        xml_path.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(xml).write(xml_path, encoding="utf-8", xml_declaration=False)
        paths.append(path)
    return paths


def read_synset_mapping(path: PathLike) -> tuple[list[str], list[str]]:
    """Parse ``LOC_synset_mapping.txt`` into ``(wnids, class_names)`` in file order."""
    path = Path(path)
    if not path.is_file():
        raise DatasetFileNotFoundError(f"synset mapping not found: {path} (lines '<wnid> <class name>')")
    wnids, names = [], []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        wnid, _, name = line.strip().partition(" ")
        if wnid in wnids:
            raise DatasetFormatError(f"{path} line {lineno}: duplicate wnid {wnid!r}")
        wnids.append(wnid)
        names.append(name.strip() or wnid)
    if not wnids:
        raise DatasetFormatError(f"{path} lists no classes")
    return wnids, names


def _int_field(node: ET.Element, tag: str, where: str) -> int:
    text = node.findtext(tag)
    try:
        return int(round(float(text)))  # some ImageNet XMLs write "12.0"
    except (TypeError, ValueError):
        raise DatasetFormatError(f"{where}: <{tag}> must be a number, got {text!r}") from None


class ImageNetBoxesDataset(LazyDataset):
    """Reader of the ImageNet localisation layouts (module docstring).

    Items: ``label`` = position of the image's wnid in the synset mapping; ``boxes`` ``[n, 4]`` float32 (0-based,
    exclusive, in the pixels of the image on disk); ``instance_labels`` ``[n]`` = positions of the objects' wnids;
    ``meta`` = ``{"wnid", "class_name", "box_file"}`` (``box_file`` None when the image has no XML) and, for the
    synthetic world, ``"background"`` (the scene's background type).

    Attributes:
        wnids, classes: the synset mapping, in label order.
    """

    def __init__(self, root: PathLike, split: str = "train", boxes_dir: str | None = None) -> None:
        """List the split's images (no image or XML is opened).

        Args:
            root: the folder holding ``LOC_synset_mapping.txt``.
            split: ``root/<split>`` or, in the ILSVRC release, ``ILSVRC/Data/CLS-LOC/<split>``.
            boxes_dir: the XML folder, relative to ``root``; default ``boxes``, or in the ILSVRC release
                ``ILSVRC/Annotations/CLS-LOC/<split>``.

        Raises:
            DatasetFileNotFoundError: the mapping file, the split folder, the box folder or a flat split's
                solution file is missing.
            DatasetFormatError: a class folder or a label is not in the mapping, or the split holds no image.
        """
        super().__init__(root, name=f"imagenet_boxes:{split}")
        #: the synset mapping: class folders to labels
        self.mapping_file = self.root / SYNSET_MAPPING
        self.wnids, self.classes = read_synset_mapping(self.mapping_file)
        self._index = {w: i for i, w in enumerate(self.wnids)}
        release = not (self.root / split).is_dir() and (self.root / ILSVRC_IMAGES / split).is_dir()
        split_dir = self.root / ILSVRC_IMAGES / split if release else self.root / split
        if not split_dir.is_dir():
            raise DatasetFileNotFoundError(
                f"split folder not found: {self.root / split} (nor {self.root / ILSVRC_IMAGES / split}); "
                f"name the split with --data {self.root}::imagenet-boxes:SPLIT (library: split=)")
        self._boxes_dir = self.root / (boxes_dir or (ILSVRC_BOXES / split if release else "boxes"))
        if not self._boxes_dir.is_dir():
            raise DatasetFileNotFoundError(
                f"box folder not found: {self._boxes_dir}; name it with boxes_dir=, or read images without boxes "
                f"as --data {self.root}::imagefolder")
        self.samples: list[tuple[Path, int]] = []
        folders = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        for folder in folders:
            if folder.name not in self._index:
                raise DatasetFormatError(f"class folder {folder} is not listed in {SYNSET_MAPPING}")
            self.samples.extend((folder / f, self._index[folder.name]) for f in _image_names(folder))
        #: whether the split's images lie in one folder, labelled by LOC_<split>_solution.csv
        self.flat = not folders
        #: the labels of a flat split (None for class folders)
        self.solution_file = self.root / f"LOC_{split}_solution.csv" if self.flat else None
        if self.solution_file is not None:
            self.samples = self._flat_samples(split_dir, self.solution_file)
        if not self.samples:
            raise DatasetFormatError(f"no images found under {split_dir}: expected <split>/<wnid>/<image>, or "
                                     f"images labelled by LOC_{split}_solution.csv")

    def _flat_samples(self, split_dir: Path, solution: Path) -> list[tuple[Path, int]]:
        """The images of a flat split with the labels of its solution file."""
        names = _image_names(split_dir)
        if names and not solution.is_file():
            raise DatasetFileNotFoundError(f"the images of {split_dir} are in no class folder and their labels, "
                                           f"{solution}, are missing")
        labels = {}
        for lineno, line in enumerate(solution.read_text(encoding="utf-8-sig").splitlines() if names else [], 1):
            image_id, _, prediction = line.partition(",")
            if lineno == 1 and image_id.strip() == "ImageId" or not line.strip():
                continue
            wnid = prediction.split()[0] if prediction.split() else ""
            if wnid not in self._index:
                raise DatasetFormatError(f"{solution.name} line {lineno}: {wnid!r} is not a wnid of {SYNSET_MAPPING}")
            labels[image_id.strip()] = self._index[wnid]
        unlabelled = [n for n in names if Path(n).stem not in labels]
        if unlabelled:
            raise DatasetFormatError(f"{solution.name} has no row for {len(unlabelled)} image(s) of {split_dir}, "
                                     f"e.g. {unlabelled[0]}")
        return [(split_dir / n, labels[Path(n).stem]) for n in names]

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def labels(self) -> np.ndarray:
        """``[N]`` int64 class index of every image (from the listing: no image is opened)."""
        return np.asarray([label for _, label in self.samples], dtype=np.int64)

    def _read_boxes(self, xml_path: Path) -> tuple[np.ndarray, np.ndarray, ET.Element]:
        try:
            tree = ET.parse(xml_path)
        except ET.ParseError as e:
            raise DatasetFormatError(f"malformed VOC XML in {xml_path}: {e}") from None
        boxes, labels = [], []
        for k, obj in enumerate(tree.getroot().iter("object")):
            where = f"{xml_path} object {k}"
            name = (obj.findtext("name") or "").strip()
            if name not in self._index:
                raise DatasetFormatError(f"{where}: name {name!r} is not a wnid of {SYNSET_MAPPING}")
            bnd = obj.find("bndbox")
            if bnd is None:
                raise DatasetFormatError(f"{where}: missing <bndbox>")
            xmin, ymin, xmax, ymax = (_int_field(bnd, t, where) for t in ("xmin", "ymin", "xmax", "ymax"))
            if xmax < xmin or ymax < ymin:
                raise DatasetFormatError(
                    f"{where}: box ({xmin}, {ymin}, {xmax}, {ymax}) has xmax < xmin or ymax < ymin"
                )
            boxes.append([xmin - 1, ymin - 1, xmax, ymax])
            labels.append(self._index[name])
        return np.asarray(boxes, dtype=np.float32).reshape(-1, 4), np.asarray(labels, dtype=np.int64), tree.getroot()

    def annotation_file(self, index: int) -> Path:
        """Where the boxes of image ``index`` are: ``<boxes_dir>/<wnid>/<image stem>.xml``, or beside the other XML
        files in a flat box folder; nothing is read (an image without boxes has no file there)."""
        path, label = self.samples[index]
        in_class = self._boxes_dir / self.wnids[label] / f"{path.stem}.xml"
        flat = self._boxes_dir / f"{path.stem}.xml"
        first, second = (flat, in_class) if self.flat else (in_class, flat)
        return second if not first.is_file() and second.is_file() else first

    def _get(self, index: int) -> AnnotatedImage:
        path, label = self.samples[index]
        require_file(path, f"{self.name} item {index}")
        meta = {"wnid": self.wnids[label], "class_name": self.classes[label], "box_file": None}
        boxes, labels = np.zeros((0, 4), np.float32), np.zeros(0, np.int64)
        xml_path = self.annotation_file(index)
        if xml_path.is_file():
            boxes, labels, xml = self._read_boxes(xml_path)
            boxes = _to_image_pixels(boxes, xml, path)
            meta["box_file"] = str(xml_path)
            background = xml.findtext("background")
            if background is not None and background.strip().isdigit():  # vitscope's synthetic world writes it
                meta["background"] = int(background)
        return AnnotatedImage(image_path=str(path), label=label, boxes=boxes, instance_labels=labels, meta=meta)


def _image_names(folder: Path) -> list[str]:
    """The image files of ``folder``, sorted by name (hidden files left out)."""
    return sorted(p.name for p in folder.iterdir()
                  if p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".") and p.is_file())


def _to_image_pixels(boxes: np.ndarray, xml: ET.Element, image: Path) -> np.ndarray:
    """``[n, 4]`` boxes scaled from the size their XML names to the size of the image on disk (only its header is
    read); unchanged where the XML names no size or the same one."""
    try:
        width, height = (int(float(xml.findtext(f"size/{tag}") or 0)) for tag in ("width", "height"))
    except ValueError:
        return boxes
    if width <= 0 or height <= 0 or not len(boxes):
        return boxes
    from PIL import Image

    try:
        with Image.open(image) as im:
            actual = im.size
    except OSError:  # unreadable: the image loader reports it
        return boxes
    if actual == (width, height):
        return boxes
    scale = np.asarray([actual[0] / width, actual[1] / height] * 2, dtype=np.float32)
    return boxes * scale
