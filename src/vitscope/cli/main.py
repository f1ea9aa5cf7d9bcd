"""The ``vitscope`` command line (thin: parsing and printing only)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from vitscope.cli.errors import one_line_errors
from vitscope.cli.explain import explain_pair
from vitscope.cli.zoo import zoo_app

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Put vision transformers under a microscope.")
app.add_typer(zoo_app, name="zoo")
app.command("explain-pair")(explain_pair)


@app.command()
@one_line_errors
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List every registered model: family, blocks, heads, width, patch, prefix tokens, offline."""
    from vitscope.models.load import describe_models

    rows = describe_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="vitscope models")
    for col in ("name", "family", "blocks", "heads", "width", "patch", "prefix", "offline", "source"):
        table.add_column(col, justify="right" if col in ("blocks", "heads", "width", "patch") else "left")
    for r in rows:
        table.add_row(*[("yes" if r[c] else "no") if c == "offline" else str(r[c]) for c in
                        ("name", "family", "blocks", "heads", "width", "patch", "prefix", "offline", "source")])
    Console(width=140).print(table)
    typer.echo("Also: hf:<hub id>, hf:<save_pretrained directory>, or a vitscope checkpoint directory.")


@app.command()
@one_line_errors
def analyze(
    model: str = typer.Option(..., "--model", "-m", help="Registered name, hf:<id or dir>, or a directory."),
    data: str = typer.Option(..., "--data", "-d", help="Image folder, file list (.txt), image, or 'skimage'."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    analyses: str | None = typer.Option(None, "--analyses", "-a", help="Comma-separated analysis names."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N images."),
    batch_size: int = typer.Option(16, "--batch-size", "-b", min=1),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, mps (default: best available)."),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 (default), bf16 or fp16 autocast."),
    strict: bool = typer.Option(False, "--strict", help="Stop at the first unreadable image."),
) -> None:
    """Run analyses over a dataset in one pass; write results.json, tables and figures."""
    from vitscope.cli.analyze import analyze as run_analyze

    path = run_analyze(model, data, out, analyses, limit, batch_size, device, dtype, strict)
    doc = json.loads(path.read_text())
    typer.echo(f"{doc['num_images']} images, {len(doc['analyses'])} analyses -> {path}")
    if doc["skipped"]:
        typer.echo(f"skipped {len(doc['skipped'])} unreadable file(s); listed in results.json")


@app.command()
@one_line_errors
def synth(
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    format: str = typer.Option(..., "--format", "-f", help="imagefolder|coco|partimagenet|davis|spair|revisitop|"
                               "sop|list|imagenet-boxes"),
    n: int = typer.Option(100, "--n", min=1, help="Images (davis: sequences, spair: pairs)."),
    size: int = typer.Option(224, "--size", min=16, help="Image side in pixels."),
    seed: int = typer.Option(0, "--seed"),
    spurious: float | None = typer.Option(None, "--spurious", help="P(background agrees with class)."),
    num_classes: int = typer.Option(10, "--classes", min=2),
    max_objects: int = typer.Option(3, "--max-objects", min=1, help="Objects per scene (1 to this)."),
) -> None:
    """Generate the synthetic world with ground truth in a real dataset format."""
    from vitscope.data.synthetic.write import synthesize

    root = synthesize(out, format, n=n, size=size, seed=seed, spurious=spurious, num_classes=num_classes,
                      max_objects=max_objects)
    typer.echo(f"wrote {format} ({n} items, {size} px, seed {seed}) -> {root}")


def main() -> None:  # pragma: no cover - console entry point
    app()
