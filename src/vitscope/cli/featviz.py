"""``vitscope featviz``: feature visualisation (paper 001); parsing and printing only."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from vitscope.cli.choices import echo_choices
from vitscope.cli.errors import one_line_errors, require_choice, require_finite
from vitscope.cli.help_text import DEVICE_HELP, FIGURE_FILES_HELP, IMAGE_SIZE_HELP
from vitscope.cli.numbers import counted, shown
from vitscope.cli.terminal import say

__all__ = ["featviz"]


def _refuse_without_data(**given: int | bool | None) -> None:
    """Refuse, before the optimisation, the options that read --data when it is not given.

    Raises:
        VitscopeUsageError: one of them is set (bad usage: it would be ignored, or fail after the work).
    """
    from vitscope.errors import VitscopeUsageError

    named = [f"--{name.replace('_', '-')}" for name, value in given.items() if value not in (None, False, 0)]
    if named:
        raise VitscopeUsageError(f"{' and '.join(named)} need{'s' if len(named) == 1 else ''} --data (images for "
                                 "the most-activating panels and the experiments, e.g. --data ROOT::imagefolder)")


@one_line_errors
def featviz(
    model: str = typer.Option(..., "--model", "-m", help="Registered name, hf:<id or dir>, or a directory."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    unit: list[str] = typer.Option([], "--unit", "-u", help="SITE:CHANNEL[@TOKEN] (blocks.5.mlp.post:31, "
                                   "blocks.2.attn.k:5, stages.2:7) or logit:CLASS; repeatable."),
    grid: int = typer.Option(0, "--grid", min=0, help="Also visualise N random FFN channels of every block (at most "
                             "all of a block's channels: a larger N is capped, and says so)."),
    steps: int = typer.Option(400, "--steps", min=1, help="Optimisation steps."),
    seed: int = typer.Option(0, "--seed", help="Seed of the optimisation (start, noise, shifts) and of --grid's "
                             "channels."),
    lambda_tv: float = typer.Option(4e-4, "--lambda-tv", min=0.0, help="Total-variation weight (a finite number)."),
    noise: str = typer.Option("channel", "--noise", help="channel (the published code) | pixel (paper text) | none."),
    color_shift: str = typer.Option("code", "--color-shift", help="code: (x-mu)/sigma | paper: sigma*x+mu | none."),
    data: str | None = typer.Option(None, "--data", "-d", help="Images for the most-activating panels "
                                    "(folder, list, ROOT::FORMAT)."),
    top_k: int | None = typer.Option(None, "--top-k", min=1, help="Most-activating images per unit (with --data) "
                                     "[5]."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N images of --data."),
    token_mixing: bool = typer.Option(False, "--token-mixing", help="Also run the last-layer token-mixing "
                                      "experiments (needs labelled --data, e.g. ROOT::imagefolder)."),
    spatial_information: int = typer.Option(0, "--spatial-information", min=0, help="Also run the appendix-F "
                                            "spatial-information test on N random FFN channels per block (needs "
                                            "--data)."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    figure_files: bool = typer.Option(False, "--figure-files/--no-figure-files", help=FIGURE_FILES_HELP),
    image_size: int | None = typer.Option(None, "--image-size", min=1, help=IMAGE_SIZE_HELP),
) -> None:
    """Optimise images that maximise units; with --data, their top images and activation maps.

    Name the units with --unit (repeatable) or --grid N (N random FFN channels of every block); one of the two
    is required. A unit named twice, or named and drawn by --grid, is optimised once.
    """
    from vitscope.featviz.workflow import FeatvizOptions, run_featviz

    require_choice("--noise", noise, ("channel", "pixel", "none"))
    require_choice("--color-shift", color_shift, ("code", "paper", "none"))
    require_finite("--lambda-tv", lambda_tv, ">= 0")  # either infinity or NaN makes the loss NaN
    if data is None:
        _refuse_without_data(top_k=top_k, limit=limit, token_mixing=token_mixing,
                             spatial_information=spatial_information)
    options = FeatvizOptions(model=model, out=out, units=list(unit), grid=grid, steps=steps, seed=seed,
                             lambda_tv=lambda_tv, noise=noise, color_shift=color_shift, data=data,
                             top_k=5 if top_k is None else top_k, limit=limit, token_mixing=token_mixing,
                             spatial_information=spatial_information, device=device, figure_files=figure_files,
                             image_size=image_size)
    path = run_featviz(options, log=say)
    doc = json.loads(path.read_text())
    echo_choices(doc)
    units = doc["analyses"]["featviz"]["summary"]["units"]
    for name, u in units.items():
        best = f", best dataset image {shown(u['best_dataset_score'], '.3f')}" if "best_dataset_score" in u else ""
        typer.echo(f"{name}: activation {shown(u['activation'], '.3f')}{best}")
    typer.echo(f"{counted(len(units), 'unit')} -> {path}")
    typer.echo(f"report: {path.parent / 'report.html'}")
