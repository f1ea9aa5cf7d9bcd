"""``vitscope explain-pair``: why two images are similar (paper 000); parsing and printing only."""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.choices import echo_choices
from vitscope.cli.errors import one_line_errors, require_choice
from vitscope.cli.help_text import IMAGE_SIZE_HELP, KEEP_ASPECT_HELP
from vitscope.cli.numbers import shown
from vitscope.cli.paths import image_files
from vitscope.errors import VitscopeUsageError, VitscopeValueError

#: the library's advice for a pooling the model cannot take, and the option a command line user changes
_LIBRARY_POOLING, _CLI_POOLING = "use pooling='mean'", "use --pooling mean"

__all__ = ["explain_pair"]


@one_line_errors
def explain_pair(
    image_a: Path = typer.Argument(..., help="First image file."),
    image_b: Path = typer.Argument(..., help="Second image file."),
    model: str = typer.Option(..., "--model", "-m", help="Registered name, hf:<id or dir>, or a directory."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    projection: str = typer.Option("auto", "--projection", help="auto (the head of metric zoo models), head, none."),
    pooling: str = typer.Option("auto", "--pooling", help="auto, mean or cls (transformers). auto: the model's own "
                                "(timm's global_pool), else the CLS token of a model without head (what attribute and "
                                "explanations explain), else the mean of the spatial tokens."),
    rollout: bool = typer.Option(True, "--rollout/--no-rollout", help="Redistribute with attention rollout."),
    transpose: bool = typer.Option(False, "--transpose", help="Use R^T (preserves the sum) instead of R."),
    fmt: str = typer.Option("npy", "--format", help="Raw maps as npy or csv."),
    image_size: int | None = typer.Option(None, "--image-size", min=1, help=IMAGE_SIZE_HELP),
    keep_aspect: bool = typer.Option(False, "--keep-aspect/--no-keep-aspect", help=KEEP_ASPECT_HELP),
) -> None:
    """Paired similarity maps of two images: overlays, raw maps, score and results.json."""
    from vitscope.explain.pair_report import write_pair_report

    require_choice("--pooling", pooling, ("auto", "mean", "cls"))
    require_choice("--projection", projection, ("auto", "head", "none"))  # bad usage before the files are looked at
    require_choice("--format", fmt, ("npy", "csv"))
    image_files([image_a, image_b])
    try:
        doc = write_pair_report(model, image_a, image_b, out, projection, pooling, rollout, transpose, fmt,
                                image_size=image_size, keep_aspect=keep_aspect)
    except VitscopeValueError as err:  # --pooling cls on a model without a CLS token: bad usage, in CLI words
        if _LIBRARY_POOLING not in str(err):
            raise
        raise VitscopeUsageError(f"--pooling cls: {err}".replace(_LIBRARY_POOLING, _CLI_POOLING)) from None
    echo_choices(doc)
    s = doc["analyses"]["paired_similarity"]["summary"]
    grids = {f"{g[0]}x{g[1]}": None for g in (s["grid"], s.get("grid_b", s["grid"]))}  # images at their own aspect
    typer.echo(f"similarity {shown(s['score'])} ({doc['config']['pooling']} pooling, projection "
               f"{doc['config']['projection']}, map grid {' and '.join(grids)}) -> {out / 'results.json'}")
    typer.echo(f"report: {out / 'report.html'}")
