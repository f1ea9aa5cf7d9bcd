"""The demo's sections for papers 001 and 003, on the tiny supervised ViT and a small subset of the demo world.

Paper 001: feature visualisation of a few FFN units with their most-activating images, and last-layer token
mixing (``vitscope featviz --token-mixing``'s results and sections). Paper 003: SIFT patch interrelation per block
and head with its stages, and Top / Bottom masking by interrelation score (``vitscope analyze --analyses
interrelation,interrelation_masking``'s results). Each keeps its own Result objects, figures and captions, so the
report shows them as those commands do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
        return PaperSettings(units=UNITS[:1], steps=50, images=32, ratios=(0.1, 0.5, 0.9))
    return PaperSettings(units=UNITS, steps=100, images=200, ratios=DEFAULT_RATIOS)


def paper_results(data: str, settings: PaperSettings, batch_size: int, progress: bool | None = None,
                  log: Callable[[str], None] | None = None) -> tuple[dict[str, Result], list[Section], list[str]]:
    """Run the paper 001 and 003 sections on ``data`` (``ROOT::coco``: labels for the head, masks for the
    background share of the masked patches).

    Returns:
        The results (keys :data:`PAPER_SECTIONS`), their report sections in that order, and the notes (units whose
        optimised image stays below their best dataset image).
    """
    log = log or (lambda message: None)
    log(f"paper 001: feature visualisation of {len(settings.units)} unit(s) of {PAPER_MODEL} ({settings.steps} "
        f"steps) and token mixing on {settings.images} images")
    featviz = _feature_visualisation(data, settings, batch_size)
    log(f"paper 003: SIFT interrelation and masking by interrelation score on {settings.images} images")
    attention = _interrelation(data, settings, batch_size, progress)
    results = {"featviz": featviz.results["featviz"], "token_mixing": featviz.results["token_mixing"], **attention}
    sections = [_said(section, settings) for section in featviz.sections]
    sections += [_result_section(name, result, settings.images) for name, result in attention.items()]
    return results, sections, list(featviz.notes)


def _said(section: Section, settings: PaperSettings) -> Section:
    """A featviz section whose intro says what the demo ran (fewer steps than the paper's 400)."""
    what = {"featviz": f"Here: {len(settings.units)} unit(s) of {PAPER_MODEL}, {settings.steps} steps each (the "
                       f"paper: 400), with their most-activating images among the first {settings.images} of the demo "
                       "world.",
            "token-mixing": f"Here: {PAPER_MODEL} on the first {settings.images} images of the demo world."}
    return replace(section, intro=f"{section.intro} {what[section.id]}") if section.id in what else section


def _feature_visualisation(data: str, settings: PaperSettings, batch_size: int) -> Any:
    """``vitscope featviz --unit ... --data DATA --token-mixing`` as a RunResult (its top-activations result is left
    out: the featviz panels show the same images)."""
    from vitscope.featviz.workflow import FeatvizOptions, featviz_run

    options = FeatvizOptions(model=PAPER_MODEL, out=Path("."), units=list(settings.units), steps=settings.steps,
                             data=data, limit=settings.images, batch_size=batch_size, token_mixing=True,
                             chunk=1)  # one unit at a time: each forward stops after its own block
    return featviz_run(options)


def _interrelation(data: str, settings: PaperSettings, batch_size: int,
                   progress: bool | None) -> dict[str, Result]:
    """One pass of the paper 003 analyses over the first ``settings.images`` images."""
    from vitscope.analyses.attention.interrelation import Interrelation
    from vitscope.analyses.masking.interrelation import InterrelationMasking
    from vitscope.data.open import as_source
    from vitscope.engine.run import run
    from vitscope.models.load import load_model

    analyses = [Interrelation(), InterrelationMasking(ratios=settings.ratios)]
    results = run(load_model(PAPER_MODEL), as_source(data), analyses, batch_size=batch_size, limit=settings.images,
                  progress=progress)
    return {a.name: results[a.name] for a in analyses}


def _result_section(name: str, result: Result, images: int) -> Section:
    """The section ``analyze`` gives a result (intro, figures, tables of its summary), saying what it ran on."""
    from vitscope.report.sections import slug
    from vitscope.report.tables import summary_tables
    from vitscope.viz.labels import display_name

    summary: Mapping[str, Any] = result.to_json()
    intro = f"{result.intro} {PAPER_MODEL} on the first {images} images of the demo world."
    return Section(slug(name), display_name(name), intro.strip(), [f.stem for f in result.figures()],
                   summary_tables(name, summary))
