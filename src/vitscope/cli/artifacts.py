"""``vitscope artifacts``: high-norm tokens, sinks, massive activations, register neurons, and what they do;
parsing and printing only."""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.choices import echo_choices
from vitscope.cli.errors import one_line_errors
from vitscope.cli.terminal import say

__all__ = ["artifacts"]


@one_line_errors
def artifacts(
    model: str = typer.Option(..., "--model", "-m", help="Registered name, hf:<id or dir>, or a directory."),
    data: str = typer.Option(..., "--data", "-d", help="Images: a folder or ROOT::FORMAT (labels for the ablations' "
                                                        "k-NN probe)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    param: list[str] = typer.Option([], "--param", "-p", help="artifacts.KEY=VALUE (repeatable), e.g. "
                                                              "artifacts.threshold=150."),
    ablations: bool = typer.Option(True, "--ablations/--no-ablations", help="Ablate the outliers and registers "
                                                                            "(zero, mean, another image's) and try "
                                                                            "the test-time register."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N images."),
    batch_size: int = typer.Option(16, "--batch-size", "-b", min=1, help="Images per batch."),
    images: int = typer.Option(32, "--images", min=1, help="Images the ablations' output change is measured on."),
) -> None:
    """Diagnose a model's artifacts in one pass, then ablate them beside their controls: results.json, tables,
    figures, report.html."""
    from vitscope.analyses.params import ParameterError, parse_param_assignments
    from vitscope.workflows.artifacts import run_artifacts
    from vitscope.workflows.options import ConfigError

    try:
        params = parse_param_assignments(param)
    except ParameterError as err:
        raise ConfigError(str(err)) from None
    other = sorted(set(params) - {"artifacts"})
    if other:
        raise ConfigError(f"--param sets artifacts.KEY=VALUE here, not {', '.join(other)}")
    doc = run_artifacts(model, data, out, params, ablations=ablations, limit=limit, batch_size=batch_size,
                        images=images, log=say)
    echo_choices(doc)
    found = doc["analyses"]["artifacts"]["summary"]
    by = f" (by {found['sink_criterion']})" if "sink_criterion" in found else ""
    first = found.get("first_block")
    outliers = "no outlier tokens" if first is None else f"outliers from {first}"
    typer.echo(f"{outliers}; sink heads {len(found.get('sink_heads', []))}{by}; -> {out / 'results.json'}")
