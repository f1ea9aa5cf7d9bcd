"""``vitscope attribute``: attribution maps of a few images; parsing and printing only."""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.choices import echo_choices
from vitscope.cli.errors import one_line_errors, require_choice
from vitscope.cli.help_text import IMAGE_SIZE_HELP
from vitscope.cli.paths import image_files
from vitscope.cli.terminal import say
from vitscope.errors import VitscopeUsageError

__all__ = ["attribute"]


@one_line_errors
def attribute(
    images: list[Path] = typer.Argument(..., help="Image files."),
    model: str = typer.Option(..., "--model", "-m", help="Registered name, hf:<id or dir>, or a directory."),
    method: str | None = typer.Option(None, "--method",
                                      help="Comma-separated methods: attention, rollout, chefer, token_gradcam, "
                                           "input_x_gradient, integrated_gradients, gradcam (CNNs) "
                                           "[chefer,rollout,token_gradcam; a CNN: gradcam,input_x_gradient]."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    target: int | None = typer.Option(None, "--target", min=0, help="A classifier's class [each image's "
                                                                    "predicted class]."),
    like: Path | None = typer.Option(None, "--like", help="An image to compare with: an embedding model's target "
                                                          "(the cosine to its embedding)."),
    upsample: bool = typer.Option(False, "--upsample", help="Maps at the image's size."),
    image_size: int | None = typer.Option(None, "--image-size", min=1, help=IMAGE_SIZE_HELP),
) -> None:
    """Attribution maps of images by several methods: results.json, raw arrays, a figure, report.html."""
    from vitscope.workflows.attribute import write_attributions

    if target is not None and like is not None:
        raise VitscopeUsageError("--target and --like exclude each other: give --target CLASS (a classifier's "
                                 "class) or --like IMAGE (an image to compare with)")
    from vitscope.attribution import METHODS

    methods = None if method is None else [m.strip() for m in method.split(",") if m.strip()]
    for name in methods or ():  # bad usage before the files are looked at
        require_choice("--method", name, tuple(METHODS))
    image_files([*images, *([like] if like is not None else [])])
    doc = write_attributions(model, images, methods, out, target=target,
                             like=like, image_size=image_size, upsample=upsample,
                             log=say)
    echo_choices(doc)
    summary = doc["analyses"]["attributions"]["summary"]
    typer.echo(f"{len(images)} image(s), methods {', '.join(summary['methods'])} ({summary['score']}) -> "
               f"{out / 'results.json'}")
    typer.echo(f"report: {out / 'report.html'}")
