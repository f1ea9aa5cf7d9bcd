"""Write the synthetic world in any supported on-disk format (``vitscope synth``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vitscope.atomic import remove_leftovers_under, write_text_atomic
from vitscope.data.synthetic.world import SyntheticWorld
from vitscope.errors import VitscopeUsageError

SYNTH_FORMATS = ("imagefolder", "imagenet-boxes", "coco", "partimagenet", "davis", "spair", "revisitop", "sop",
                 "list")


def synthesize(out: str | Path, format: str, n: int = 100, size: int = 224, seed: int = 0,
               spurious: float | None = None, num_classes: int = 10, progress: Any = None,
               max_objects: int = 3) -> Path:
    """Generate ``n`` items of the synthetic world and write them in ``format`` under ``out``.

    ``n`` counts images, except for ``davis`` (sequences of 8 frames), ``spair`` (pairs) and
    ``revisitop`` (database images; ``max(2, n // 10)`` queries are added). Retrieval formats use
    few instances per class (4) so that queries have matches; below about 100 database images a query's instance
    may appear in none (its positives are empty).

    ``max_objects`` bounds the objects per scene (1 gives single-object scenes, as saliency benchmarks).

    Returns:
        ``out``, which also receives ``synth.json`` recording the generator settings.
    """
    if format not in SYNTH_FORMATS:
        raise VitscopeUsageError(f"--format: unknown format '{format}'; choose one of {', '.join(SYNTH_FORMATS)}")
    if n < 1:
        raise VitscopeUsageError("--n must be at least 1")
    if spurious is not None and not 0.0 <= spurious <= 1.0:
        raise VitscopeUsageError("--spurious must be a probability in [0, 1]")
    retrieval = format in ("revisitop", "sop", "list")
    world = SyntheticWorld(num_classes=num_classes, size=size, seed=seed, spurious=spurious,
                           num_instances_per_class=4 if retrieval else 20, max_objects=max_objects)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    # a killed run's temporary images would otherwise be read as images by a plain folder source
    remove_leftovers_under(root, stale_pids=frozenset({os.getpid()}))  # this process has written nothing yet
    names = [c.name for c in world.classes]
    tick = progress or (lambda k: None)

    def scenes(count: int, start: int = 0):
        for s in world.scenes(count, start):
            tick(1)
            yield s

    if format == "imagefolder":
        from vitscope.data.formats.imagefolder import write_imagefolder
        write_imagefolder(scenes(n), root, names)
    elif format == "imagenet-boxes":
        from vitscope.data.formats.imagenet_boxes import write_imagenet_boxes
        write_imagenet_boxes(scenes(n), root, names)
    elif format == "coco":
        from vitscope.data.formats.coco_writer import write_coco
        write_coco(scenes(n), root, names)
    elif format == "partimagenet":
        from vitscope.data.formats.partimagenet import write_partimagenet
        write_partimagenet(scenes(n), root, world.classes)
    elif format == "davis":
        from vitscope.data.formats.davis import write_davis
        write_davis([world.video(i) for i in range(n)], root)
    elif format == "spair":
        from vitscope.data.formats.spair import write_spair
        write_spair([world.pair(i, same_instance=False) for i in range(n)], root, world.classes)
    elif format == "revisitop":
        from vitscope.data.formats.revisitop import write_revisitop
        queries = list(scenes(max(2, n // 10), start=10 * n))
        write_revisitop(queries, list(scenes(n)), root)
    elif format == "sop":
        from vitscope.data.formats.sop import write_sop
        write_sop(list(scenes(n)), root, class_specs=world.classes)
    else:
        from vitscope.data.formats.path_list import write_path_list
        write_path_list(list(scenes(n)), root)
    settings = {"format": format, "n": n, "size": size, "seed": seed, "spurious": spurious,
                "num_classes": num_classes, "max_objects": max_objects, "classes": names,
                "backgrounds": list(world.background_names)}
    write_text_atomic(root / "synth.json", json.dumps(settings, indent=1, allow_nan=False))
    return root
