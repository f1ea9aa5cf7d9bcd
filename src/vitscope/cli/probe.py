"""``vitscope probe``: per-block downstream probes of one model on one benchmark (paper 002 section 6).

The data format picks the probe: ``revisitop`` -> retrieval (revisited mAP), ``davis`` -> label propagation
(J, F, J&F), ``spair`` -> keypoint correspondence (PCK), ``coco`` / ``partimagenet`` -> region clustering,
any labelled image set (``imagefolder``...) -> k-NN, linear probes and clustering (a second labelled set
with ``--test-data``, else a seeded hold-out of ``--test-fraction``). Everything runs through
:func:`vitscope.workflows.probe.run_probe`; this module only parses and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from vitscope.cli.choices import echo_choices
from vitscope.cli.errors import one_line_errors
from vitscope.cli.help_text import (
    CONFIG_HELP,
    DEVICE_HELP,
    FIGURE_FILES_HELP,
    IMAGE_SIZE_HELP,
    JPEG_DRAFT_HELP,
    KEEP_ASPECT_HELP,
    WORKERS_HELP,
)
from vitscope.cli.resolve import resolve_or_exit
from vitscope.cli.terminal import say

__all__ = ["probe"]


def _check_paths(options: Any) -> None:
    """Refuse, before the model loads, a --data or --test-data that names nothing and a --cache that cannot be a
    folder, naming the option."""
    from vitscope.cli.paths import missing_data_root, writable_folder
    from vitscope.data.load import FORMATS

    missing_data_root("--data", options.data, FORMATS)
    missing_data_root("--test-data", options.test_data, FORMATS)
    if options.cache is not None:
        writable_folder("--cache", Path(options.cache))


@one_line_errors
def probe(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", "-m", help="Registered name, hf:<id or dir>, or a directory. "
                                     "Required (here or in --config)."),
    data: str | None = typer.Option(None, "--data", "-d", help="ROOT::FORMAT[:SPLIT] (revisitop, davis, spair, "
                                    "coco, partimagenet, imagefolder...; e.g. davis::davis:test-dev) or ROOT (format "
                                    "detected). Required (here or in --config)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output directory. Required (here or in --config)."),
    test_data: str | None = typer.Option(None, "--test-data", help="Labelled test set for k-NN and linear probes "
                                         "(default: hold out --test-fraction of --data)."),
    test_fraction: float | None = typer.Option(None, "--test-fraction", min=0.01, max=0.99,
                                               help="Share of a labelled --data held out for testing [0.2]."),
    tiling: float | None = typer.Option(None, "--tiling", help="Dense features by tiling for spatial probes: frame "
                                        "side / model input (the paper: 2); 0 = off [0]."),
    blocks: str | None = typer.Option(None, "--blocks", help="Comma-separated blocks, negative from the end, or "
                                      "all [all]."),
    site: str | None = typer.Option(None, "--site", help="Block site: resid_post, norm1, norm2, ... [resid_post]."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N items of --data and "
                                     "--test-data (images; DAVIS: sequences; SPair: pairs; not revisitop)."),
    batch_size: int | None = typer.Option(None, "--batch-size", "-b", min=1, help="Images per batch [16]."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 (default), bf16 or fp16 autocast."),
    strict: bool | None = typer.Option(None, "--strict/--no-strict", help="Stop at the first unreadable image."),
    resume: bool | None = typer.Option(None, "--resume/--no-resume", help="Continue a feature extraction that an "
                                       "interrupted run left in the cache (default: on); off: start it over."),
    checkpoint_seconds: float | None = typer.Option(None, "--checkpoint-seconds", min=0,
                                                    help="Least seconds between state saves [60]."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the split, the probes and the random baselines "
                                    "[0]."),
    cache: Path | None = typer.Option(None, "--cache", help="Feature-cache folder [$VITSCOPE_CACHE/features or "
                                      "~/.cache/vitscope/features]."),
    davis_void: str | None = typer.Option(None, "--davis-void", help="DAVIS void pixels (255): background (the "
                                          "official evaluation: predictions on them count) or ignore (masked out of "
                                          "both masks) [background]."),
    figure_files: bool | None = typer.Option(None, "--figure-files/--no-figure-files", help=FIGURE_FILES_HELP),
    image_size: int | None = typer.Option(None, "--image-size", min=1, help=IMAGE_SIZE_HELP),
    keep_aspect: bool | None = typer.Option(None, "--keep-aspect/--no-keep-aspect", help=KEEP_ASPECT_HELP),
    workers: int | None = typer.Option(None, "--workers", min=0, help=WORKERS_HELP),
    jpeg_draft: bool | None = typer.Option(None, "--jpeg-draft/--no-jpeg-draft", help=JPEG_DRAFT_HELP),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
) -> None:
    """Per-block probes (retrieval, DAVIS, SPair keypoints, k-NN / linear, clustering) with random chance.

    \b
    The format of --data picks the probes:
      revisitop               retrieval: revisited Oxford/Paris mAP (easy, medium, hard)
      davis                   video label propagation: J, F, J&F (test-dev: masks written, no score)
      spair                   keypoint correspondence: PCK
      coco, partimagenet      region clustering of object / part masks (purity, NMI, ARI)
      imagefolder and other   k-NN and linear probes, image clustering (held-out part,
      labelled image sets     or --test-data)
    """
    import json

    from vitscope.cli.numbers import shown
    from vitscope.workflows.options import ProbeOptions
    from vitscope.workflows.probe import probe_command

    # the parameters are named as ProbeOptions' fields: ctx.params holds them all, --config too
    options = resolve_or_exit(ProbeOptions, ctx.params)
    _check_paths(options)
    path = probe_command(options, log=say)
    if path is None:
        return
    doc = json.loads(path.read_text())
    echo_choices(doc)
    if "davis" in doc and not doc["davis"]["scored"]:
        typer.echo(f"davis: {doc['davis']['frames']} propagated masks -> {path.parent / 'predictions'}")
    for row in doc.get("best_blocks", {}).get("rows", []):
        head = f"{row['task']:<24} {row['metric']:<10}"
        if row["best_block"] < 0:  # e.g. hard mAP when no query has a hard positive
            typer.echo(f"{head} no score (nothing to evaluate at any block)")
        else:
            typer.echo(f"{head} best block {row['best_block']:>2}: {shown(row['score'])} "
                       f"(random {shown(row['random'])})")
    typer.echo(f"-> {path}")
    typer.echo(f"report: {path.parent / 'report.html'}")
