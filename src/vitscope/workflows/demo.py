"""``vitscope demo``: the whole tool on a fresh clone, offline: synthetic world -> tiny zoo -> compare -> report.

Steps: generate the synthetic world in COCO format at 64 px (the zoo's input size; labels and object masks
included), compare every tiny-zoo model on it (one pass each: attention distance, saliency IoU, clustering,
k-NN, CKA between models, attention maps; paper 002), explain a few image pairs with the metric-learning model
(paper 000), visualise a few units and measure token mixing (paper 001), measure SIFT interrelation and mask by it
(paper 003) on the supervised model and a small subset (``demo_papers``), and write report.html. The data is
reused when ``out`` already holds the same synthetic world, so re-running after an interruption resumes the
comparison's passes instead of starting over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from vitscope.data.open import as_source
from vitscope.outputs import write_run
from vitscope.outputs.lock import releasing_outputs
from vitscope.workflows.compare import comparison_run
from vitscope.workflows.demo_pairs import paired_similarity_section
from vitscope.workflows.demo_papers import paper_results, paper_settings
from vitscope.workflows.options import CompareOptions, resolve
from vitscope.workflows.state_files import clear_state

__all__ = ["DEMO_SEED", "demo", "demo_models", "demo_settings"]

DEMO_SEED = 7  # the zoo trained on seed 0: the demo looks at images the models never saw
PAIR_MODEL = "tiny-vit-metric"


def demo_models() -> list[str]:
    """Every model of the tiny zoo (names of ``vitscope zoo list``)."""
    from vitscope.zoo.catalog import ZOO

    return [entry.name for entry in ZOO]


def demo_settings(quick: bool) -> dict[str, int]:
    """Images and batch size of the comparison: ``--quick`` keeps the whole demo under 30 s on 2 cores."""
    return {"n": 64, "batch_size": 32} if quick else {"n": 1000, "batch_size": 50}


def _synthetic_world(root: Path, n: int, log: Callable[[str], None]) -> Path:
    """The demo's COCO-format synthetic world under ``root`` (reused when it already matches)."""
    from vitscope.data.synthetic.write import synthesize

    meta = root / "synth.json"
    if meta.exists():
        try:
            old = json.loads(meta.read_text())
        except (OSError, ValueError):
            old = {}
        if (old.get("format"), old.get("n"), old.get("size"), old.get("seed")) == ("coco", n, 64, DEMO_SEED):
            log(f"reusing the synthetic world in {root}")
            return root
    log(f"generating {n} synthetic images (64 px, COCO format with masks) in {root}")
    return synthesize(root, "coco", n=n, size=64, seed=DEMO_SEED)


@releasing_outputs
def demo(out: str | Path = "demo_out", quick: bool = False, progress: bool | None = None,
         log: Callable[[str], None] | None = None) -> Path:
    """Run the demo into ``out``; returns the path of report.html.

    Args:
        out: output folder (data under ``out/data``, results, figures, tables and report.html beside it).
        quick: 64 images instead of 1000, and smaller paper 001 and 003 sections (:func:`paper_settings`).
        progress: force the progress bars on/off.
        log: receives one-line progress messages.
    """
    log = log or (lambda message: None)
    out = Path(out)
    settings = demo_settings(quick)
    root = _synthetic_world(out / "data" / "synthetic-coco", settings["n"], log)
    data = f"{root}::coco"
    options = resolve(CompareOptions, {"models": demo_models(), "data": data, "out": out,
                                       "batch_size": settings["batch_size"]})
    result = comparison_run(options, progress=progress, log=log)
    log(f"explaining image pairs with {PAIR_MODEL}")
    section, pairs = paired_similarity_section(as_source(data), PAIR_MODEL)
    result.sections.insert(1 if result.sections else 0, section)
    papers = paper_settings(quick)
    paper, paper_sections, notes = paper_results(data, papers, settings["batch_size"], progress=progress, log=log)
    result.results.update(paper)
    result.own_sections |= set(paper)  # shown by paper_sections, after the comparison
    result.sections += paper_sections
    result.notes += notes
    result.command = "demo"
    result.title = f"vitscope demo: the tiny zoo on the synthetic world{' (quick)' if quick else ''}"
    result.config["demo"] = {"quick": quick, "images": settings["n"], "seed": DEMO_SEED, "papers": papers.to_dict()}
    result.extra["paired_similarity"] = pairs
    write_run(out, result, progress=progress)
    clear_state(out)
    return out / "report.html"
