"""On a CUDA device: which analyses make the host wait for the GPU in their hot loop, counted by CUDA itself.

tests/contract/test_no_host_sync.py watches, on the CPU, for the calls that would synchronise on a GPU; this script
asks CUDA (``torch.cuda.set_sync_debug_mode("warn")``: a warning for every synchronising operation) during every
registered analysis's ``update``, ``update_hook`` and ``end_batch`` in a real pass (the tiny zoo, a synthetic COCO
world, three batches). Prints one JSON line: ``{analysis: [warning texts with their counts]}``, empty lists when
clean. Non-blocking copies from pageable host memory and row-store copies into pinned memory do not warn.

Run: ``python benchmarks/gpu_sync_check.py`` (needs CUDA).
"""

from __future__ import annotations

import collections
import json
import tempfile
import warnings
from pathlib import Path


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 1
    import vitscope
    from vitscope.analyses import ANALYSES
    from vitscope.data.synthetic.write import synthesize

    hits: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def watch(owner, method: str, name: str) -> None:
        original = getattr(owner, method)

        def wrapped(*args, _original=original, _name=name, **kwargs):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    return _original(*args, **kwargs)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                    for w in caught:
                        if "synchroniz" in str(w.message):
                            hits[_name][f"{Path(w.filename).name}:{w.lineno}"] += 1
        setattr(owner, method, wrapped)

    def watched(analysis) -> None:
        for method in ("update", "update_hook", "end_batch"):
            watch(analysis, method, analysis.name)

    # the shared per-block attention statistics run during the forward, outside every analysis's methods
    from vitscope.analyses.batch import SharedQuantities

    watch(SharedQuantities, "add_block", "shared attention statistics")
    hits.setdefault("shared attention statistics", collections.Counter())

    light = {"head_importance": {"blocks": (5,), "reference_images": 4}, "cka": {"batch": 8},
             "residual_cka": {"batch": 4}}
    with tempfile.TemporaryDirectory() as tmp:
        root = synthesize(Path(tmp) / "world", "coco", n=12, size=64, seed=3)
        for model in ("tiny-vit-sup", "tiny-resnet-sup"):
            backbone = vitscope.load_model(model)
            made = [ANALYSES[n](**light.get(n, {})) for n in sorted(ANALYSES)]
            made = [a for a in made if a.supports(backbone.spec)]
            for a in made:
                watched(a)
                hits.setdefault(a.name, collections.Counter())
            vitscope.run(backbone, f"{root}::coco", made, batch_size=4, progress=False, workers=0, device="cuda")
    print(json.dumps({name: [f"{where} ({n}x)" for where, n in sorted(c.items())] for name, c in sorted(hits.items())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
