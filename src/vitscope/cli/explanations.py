"""``vitscope explanations``: attribution methods scored against ground truth; parsing and printing only."""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.choices import echo_choices
from vitscope.cli.errors import one_line_errors, require_choice
from vitscope.cli.terminal import say
from vitscope.errors import VitscopeUsageError

__all__ = ["explanations"]


@one_line_errors
def explanations(
    models: str = typer.Option(..., "--models", "-M", help="Comma-separated models (classifiers score their label's "
                                                            "logit; metric-learning nets and models without a head "
                                                            "the cosine to the next image's embedding)."),
    data: str = typer.Option(..., "--data", "-d", help="A dataset with object masks and labels, e.g. WORLD::coco, or "
                                                        "the ImageNet segmentation benchmark's gtsegs_ijcv.mat."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    methods: str = typer.Option("all", "--methods", help="Comma-separated attribution methods, or all."),
    limit: int = typer.Option(32, "--limit", min=2, help="Images scored."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Points of the deletion and insertion curves "
                                                                  "[8]; at most every model's number of patches "
                                                                  "(checked before any model is scored)."),
    sanity: bool | None = typer.Option(None, "--sanity/--no-sanity", help="The cascading randomisation check "
                                                                         "[on]."),
    batch_size: int = typer.Option(16, "--batch-size", "-b", min=1, help="Images explained at a time (memory, not "
                                                                          "numbers)."),
) -> None:
    """Score attribution methods against ground truth, every number beside its control: results.json, a table,
    example maps, curves, report.html."""
    from vitscope.attribution import METHODS
    from vitscope.workflows.explanations import run_explanations

    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    for name in chosen:  # before any model loads
        require_choice("--methods", name, ("all", *METHODS))
    if "all" in chosen and len(chosen) > 1:
        raise VitscopeUsageError(f"--methods all stands alone (every method); got {methods!r}")
    doc = run_explanations([m.strip() for m in models.split(",") if m.strip()], data, out, chosen, limit=limit,
                           steps=steps, sanity=sanity, batch_size=batch_size, log=say)
    echo_choices(doc)
    summary = doc["analyses"]["explanations"]["summary"]
    typer.echo(f"{len(summary['models'])} model(s), {len(summary['methods'])} method(s), {len(summary['rows'])} "
               f"scores -> {out / 'results.json'}")
    typer.echo(f"report: {out / 'report.html'}")
