"""``vitscope zoo list`` and ``vitscope zoo build``."""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.errors import one_line_errors
from vitscope.cli.imports import CommandLine
from vitscope.cli.paths import existing_folder, writable_folder
from vitscope.errors import VitscopeValueError
from vitscope.strict_json import dumps

zoo_app = CommandLine(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                      help="The tiny model zoo (trained offline).")


def zoo_rows(directory: Path | None = None) -> list[dict]:
    """One row per zoo model: recipe, data seed, parameters, held-out score and baselines (None if not built).

    ``checkpoints`` lists only the training checkpoints whose weights this folder holds.
    """
    from vitscope.zoo.catalog import ZOO
    from vitscope.zoo.store import is_built, read_manifest, zoo_dir

    d = zoo_dir(directory)
    models = read_manifest(d)["models"]
    rows = []
    for e in ZOO:
        rec = models.get(e.name) if is_built(e.name, d) else None
        rows.append({"name": e.name, "recipe": e.recipe, "arch": e.arch, "data_seed": e.data_seed,
                     "params": rec["params"] if rec else None, "score_kind": e.score,
                     "score": rec["score"] if rec else None,
                     "random_init": rec["baselines"]["random_init"] if rec else None,
                     "raw_pixels": rec["baselines"]["raw_pixels"] if rec else None,
                     "checkpoints": [f"{e.name}@step{s}" for s in e.snapshot_steps if is_built(f"{e.name}@step{s}", d)],
                     "built": rec is not None,
                     "description": e.description})
    return rows


@zoo_app.command("list")
@one_line_errors
def list_models(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    directory: Path | None = typer.Option(None, "--dir", help="Zoo directory (default: the shipped weights)."),
) -> None:
    """Every zoo model with its recipe, data seed, parameter count and held-out score."""
    if directory is not None:  # a wrong folder would list every model as not built
        existing_folder("--dir", directory)
    rows = zoo_rows(directory)
    if as_json:
        typer.echo(dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    table = Table(title="vitscope tiny zoo (held-out synthetic data)")
    for col in ("name", "recipe", "seed", "params", "score", "held-out", "untrained", "pixels"):
        table.add_column(col, justify="left" if col in ("name", "recipe", "score") else "right")
    for r in rows:
        table.add_row(r["name"], r["recipe"], str(r["data_seed"]), "-" if r["params"] is None else f"{r['params']:,}",
                      r["score_kind"], num(r["score"]) if r["built"] else "not built", num(r["random_init"]),
                      num(r["raw_pixels"]))
    Console(width=140).print(table)
    built = [c for r in rows for c in r["checkpoints"]]
    typer.echo("Training checkpoints: " + (", ".join(built) if built else "none built"))


@zoo_app.command("build")
@one_line_errors
def build(
    name: str | None = typer.Argument(None, help="Zoo model to rebuild (default: all)."),
    directory: Path | None = typer.Option(None, "--dir", help="Where to write weights (default: the zoo dir)."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Override the recipe's steps (quick checks)."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, help="Models built in parallel (one thread each)."),
    core: bool = typer.Option(False, "--core", help="Only the core zoo, not the masking/robustness extras."),
) -> None:
    """Retrain zoo models from their recipes (deterministic for a seed on CPU); resumes if interrupted."""
    from vitscope.zoo.build import build_many
    from vitscope.zoo.cards import meets_bar
    from vitscope.zoo.catalog import ZOO, get_entry

    if name and core:
        raise typer.BadParameter("give a model name or --core, not both")
    try:
        names = [get_entry(name).name] if name else [e.name for e in ZOO if not (core and e.extra)]
    except KeyError as err:
        raise VitscopeValueError(err.args[0]) from None
    if directory is not None:  # before the first model trains
        writable_folder("--dir", directory)
    for rec in build_many(names, directory, jobs=jobs, steps=steps):
        n = rec["entry"]["name"]
        verdict = "meets" if meets_bar(rec) else "misses"
        typer.echo(f"{n}: {rec['score_kind']} {rec['score']:.3f} (untrained {rec['baselines']['random_init']:.3f}, "
                   f"pixels {rec['baselines']['raw_pixels']:.3f}; {verdict} the bar) in {rec['train_seconds']:.0f} s")
