"""A synthetic COCO world whose images have several aspect ratios (the generator draws squares): some images are
stretched, their annotations with them, so a run that keeps each image's aspect ratio sees several token grids."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from vitscope.data.synthetic.write import synthesize

#: (height, width) factors by image position, repeating: squares, wide, tall and very wide images
STRETCH = ((1.0, 1.0), (1.0, 1.75), (1.5, 1.0), (1.0, 1.0), (1.0, 2.5), (1.0, 1.75))


def stretched_coco(out: Path, n: int = 12, size: int = 64, seed: int = 3) -> str:
    """``ROOT::coco`` of ``n`` images whose shapes follow :data:`STRETCH` (masks, boxes and areas stretched too)."""
    root = synthesize(out, "coco", n=n, size=size, seed=seed)
    path = root / "annotations" / "instances_val2017.json"
    doc = json.loads(path.read_text())
    factors = {}
    for k, image in enumerate(sorted(doc["images"], key=lambda im: im["id"])):
        fy, fx = STRETCH[k % len(STRETCH)]
        h, w = round(image["height"] * fy), round(image["width"] * fx)
        file = root / "val2017" / image["file_name"]
        with Image.open(file) as im:
            im.convert("RGB").resize((w, h), Image.Resampling.BILINEAR).save(file, quality=95)
        factors[image["id"]] = (h / image["height"], w / image["width"])
        image["height"], image["width"] = h, w
    for a in doc["annotations"]:
        fy, fx = factors[a["image_id"]]
        a["segmentation"] = [[v * (fx if j % 2 == 0 else fy) for j, v in enumerate(poly)] for poly in a["segmentation"]]
        x, y, bw, bh = a["bbox"]
        a["bbox"] = [x * fx, y * fy, bw * fx, bh * fy]
        a["area"] = a["area"] * fx * fy
    path.write_text(json.dumps(doc))
    return f"{root}::coco"
