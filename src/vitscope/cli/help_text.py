"""Help text of ``vitscope analyze`` that lists the analyses (from the registry's metadata, without importing torch
for the built-ins), and help shared by several commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from vitscope.analyses.catalog import AnalysisInfo

#: ``--figure-files`` of every command whose report draws charts
FIGURE_FILES_HELP = ("Also write curves and heat maps as PNG and SVG in figures/ (the report draws them in the "
                     "browser, with PNG and SVG downloads; default: off, as drawing each takes a few tenths of a "
                     "second).")

#: ``--config`` of every command that reads its options from a YAML file
CONFIG_HELP = "YAML file of options (keys as the long options); command-line options override it."

#: ``--device`` of every command that runs a model
DEVICE_HELP = "cpu, cuda or cuda:N (default: cuda when there is one)."

#: ``--resume`` of every command whose pass keeps resumable state
RESUME_HELP = "Continue from the state saved by an interrupted run of the same command (default: on)."

#: ``--image-size`` of every command that loads a model
IMAGE_SIZE_HELP = ("Input side in pixels (a multiple of the patch size): the resize, centre crop and token grid "
                   "follow, position embeddings are interpolated [the model's preprocessing: an alias's paper "
                   "settings, else its preprocessor_config.json, else its family's defaults at config.json's size].")

#: ``--keep-aspect`` of every command that makes passes over a dataset
KEEP_ASPECT_HELP = ("Keep each image's aspect ratio (no centre crop): resize it to the most patches that fit the "
                    "model's square input, each side a multiple of the patch size (SigLIP 2 NaFlex's rule); images "
                    "then have token grids of their own, listed in results.json [off; NaFlex models always keep it].")

#: ``--jpeg-draft`` of every command that makes passes over a dataset
JPEG_DRAFT_HELP = ("Decode JPEGs at libjpeg's reduced scales (1/2, 1/4, 1/8) down to the size the model's resize "
                   "needs: faster on images far larger than the input, slightly different pixels (recorded in "
                   "results.json) [off].")

#: ``--compile-stats`` of the commands that run the attention analyses
COMPILE_STATS_HELP = ("Compute the attention analyses' per-block statistics through torch.compile: several times "
                      "faster on a GPU and on CPUs after one compilation (tens of seconds), numbers within float32 "
                      "rounding of the default's (recorded in results.json) [off].")

#: ``--workers`` of every command that makes passes over a dataset
WORKERS_HELP = ("Processes that decode and preprocess images, batches ahead of the model; no number depends on it "
                "(0: a thread of this process) [one per CPU less one, at most 8; 0 under 256 images].")



def analysis_line(info: AnalysisInfo, width: int) -> str:
    """``  name  summary [needs ...; opt-in] (from module)``: one analysis in ``analyze --help``."""
    tags = [f"needs {', '.join(info.needs())}"] if info.needs() else []
    tags += [] if info.default else ["opt-in"]
    plugin = f" (from {info.module})" if info.plugin else ""
    return f"  {info.name:<{width}} {info.summary}" + (f" [{'; '.join(tags)}]" if tags else "") + plugin


def analyses_epilog() -> str:
    """The list of analyses and groups for ``analyze --help``, built-in and plug-in, from the registry's metadata
    (:func:`vitscope.analyses.catalog.analysis_catalog`: without plug-ins, read without importing torch). Each
    paragraph starts with click's \\b, which keeps its lines as written."""
    from vitscope.analyses.catalog import analysis_catalog, declared_catalog
    from vitscope.errors import VitscopeError

    paragraphs = ["\b\nAnalyses (--analyses NAME,GROUP,...). Without --analyses, every analysis runs that the\n"
                  "model and the data support (the others are listed with the reason); the opt-in ones run\n"
                  "only when named. Their parameters (-p NAME.KEY=VALUE), with defaults and meaning:\n"
                  "--params-of NAME. More analyses: --import MODULE, or a package's vitscope.analyses entry point\n"
                  "(vitscope analyses lists them all)."]
    try:
        infos = analysis_catalog()
    except VitscopeError as err:  # a plug-in that cannot be imported: list the built-ins and say why
        infos = declared_catalog()
        paragraphs.append(f"\b\nPlug-in analyses are not listed: {err}")
    by_group: dict[str, list[AnalysisInfo]] = {}
    for info in infos:  # each under its first group, in the registry's order; the ungrouped ones last
        by_group.setdefault(info.groups[0] if info.groups else "", []).append(info)
    width = max(len(info.name) for info in infos)
    for group in sorted(by_group, key=lambda g: g == ""):
        lines = ["\b", f"{group} group:" if group else "not in a group:"]
        paragraphs.append("\n".join(lines + [analysis_line(info, width) for info in by_group[group]]))
    return "\n\n".join(paragraphs)
