"""The demo's sections for papers 001 and 003, on the tiny supervised ViT and a small subset of the demo world.

Paper 001: feature visualisation of a few FFN units with their most-activating images, and last-layer token
mixing (the results and sections of ``vitscope featviz --token-mixing``). Paper 003: SIFT patch interrelation per
block and head with its stages, and Top / Bottom masking by interrelation score (the results of ``vitscope analyze
--analyses interrelation,interrelation_masking``). Each keeps its own Result objects, figures and captions, so the
report shows them as those commands do. Token mixing and the paper 003 analyses share one pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from vitscope.analyses.result import Result
from vitscope.report.model import Section

__all__ = ["PAPER_MODEL", "PAPER_SECTIONS", "PaperSettings", "paper_results", "paper_settings"]

#: the classifier of the zoo: token mixing and masking read its head
PAPER_MODEL = "tiny-vit-sup"
#: an early, two middle and the last block; on the demo world each unit's optimised image (chunks of one unit,
#: seed 0, 100 steps) activates it more than its best image among the first 200
UNITS = ("blocks.0.mlp.post:172", "blocks.2.mlp.post:242", "blocks.3.mlp.post:510", "blocks.5.mlp.post:431")
#: the results the paper sections add to results.json ``analyses``, in report order
PAPER_SECTIONS = ("featviz", "token_mixing", "interrelation", "interrelation_masking")


@dataclass(frozen=True)
class PaperSettings:
    """How much of each paper section the demo runs.

    Attributes:
        units: FFN units to visualise (``blocks.L.mlp.post:C``); steps: optimisation steps per unit.
        images: the first images of the demo world used for the top images, token mixing, interrelation and
            masking.
        ratios: mask ratios of the interrelation masking.
    """

    units: tuple[str, ...]
    steps: int
    images: int
    ratios: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"model": PAPER_MODEL, **asdict(self)}


def paper_settings(quick: bool) -> PaperSettings:
    """The default demo runs every section at a size worth reading; ``--quick`` runs each one small."""
    from vitscope.analyses.masking.interrelation import DEFAULT_RATIOS

    if quick:
        return PaperSettings(units=UNITS[:1], steps=30, images=16, ratios=(0.2, 0.5))
    return PaperSettings(units=UNITS, steps=100, images=200, ratios=DEFAULT_RATIOS)


def paper_results(data: str, settings: PaperSettings, batch_size: int, progress: bool | None = None,
                  log: Callable[[str], None] | None = None) -> tuple[dict[str, Result], list[Section], list[str]]:
    """Run the paper 001 and 003 sections on ``data`` (``ROOT::coco``: labels for the head, masks for the
    background share of the masked patches).

    Returns:
        The results (keys :data:`PAPER_SECTIONS`), their report sections in that order, and the notes (units whose
        optimised image stays below their best dataset image).
    """
    from vitscope.featviz.report_section import featviz_sections

    log = log or (lambda message: None)
    log(f"paper 001: feature visualisation of {len(settings.units)} unit(s) of {PAPER_MODEL} ({settings.steps} "
        "steps each)")
    featviz = _feature_visualisation(data, settings, batch_size)
    log(f"papers 001 and 003: token mixing, SIFT interrelation and masking by it on {settings.images} images")
    passed = _one_pass(data, settings, batch_size, progress)
    results = {"featviz": featviz.results["featviz"], **passed}
    sections = [_said(section, settings) for section in featviz_sections(results)]  # featviz, token mixing
    sections += [_result_section(name, passed[name], settings.images) for name in PAPER_SECTIONS[2:]]
    return results, sections, list(featviz.notes)


@contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread, restored afterwards: every optimisation step is a batch of 8 images of 64 px, which
    gains nothing from a second thread, and on a busy machine each parallel region waits for a descheduled worker
    (100 steps measured 7x slower with 2 threads than with 1 under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _feature_visualisation(data: str, settings: PaperSettings, batch_size: int) -> Any:
    """``vitscope featviz --unit ... --data DATA`` as a RunResult (its top-activations result is left out: the
    featviz panels show the same images)."""
    from vitscope.featviz.workflow import FeatvizOptions, featviz_run

    options = FeatvizOptions(model=PAPER_MODEL, out=Path("."), units=list(settings.units), steps=settings.steps,
                             data=data, limit=settings.images, batch_size=batch_size,
                             chunk=1)  # one unit at a time: each forward stops after its own block
    with _one_thread():
        return featviz_run(options)


def _one_pass(data: str, settings: PaperSettings, batch_size: int, progress: bool | None) -> dict[str, Result]:
    """Token mixing (paper 001) and the paper 003 analyses in one pass over the first ``settings.images`` images."""
    from vitscope.analyses.attention.interrelation import Interrelation
    from vitscope.analyses.masking.interrelation import InterrelationMasking
    from vitscope.data.open import as_source
    from vitscope.engine.run import run
    from vitscope.experiments.token_mixing import TokenMixing
    from vitscope.models.load import load_model

    analyses = [TokenMixing(), Interrelation(), InterrelationMasking(ratios=settings.ratios)]
    results = run(load_model(PAPER_MODEL), as_source(data), analyses, batch_size=batch_size, limit=settings.images,
                  progress=progress)
    return {a.name: results[a.name] for a in analyses}


def _said(section: Section, settings: PaperSettings) -> Section:
    """A featviz section whose intro says what the demo ran (fewer steps than the paper's 400)."""
    what = {"featviz": f"Here: {len(settings.units)} unit(s) of {PAPER_MODEL}, {settings.steps} steps each (the "
                       f"paper: 400), with their most-activating images among the first {settings.images} of the demo "
                       "world.",
            "token-mixing": f"Here: {PAPER_MODEL} on the first {settings.images} images of the demo world."}
    return replace(section, intro=f"{section.intro} {what[section.id]}") if section.id in what else section


def _result_section(name: str, result: Result, images: int) -> Section:
    """The section ``analyze`` gives a result (intro, figures, tables of its summary), saying what it ran on."""
    from vitscope.report.sections import slug
    from vitscope.report.tables import summary_tables
    from vitscope.viz.labels import display_name

    summary: Mapping[str, Any] = result.to_json()
    intro = f"{result.intro} Here: {PAPER_MODEL} on the first {images} images of the demo world."
    return Section(slug(name), display_name(name), intro.strip(), [f.stem for f in result.figures()],
                   summary_tables(name, summary))
