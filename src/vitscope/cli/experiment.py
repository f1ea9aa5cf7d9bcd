"""``vitscope experiment``: experiments that train models or compare several (thin: parsing and printing)."""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.choices import echo_choices
from vitscope.cli.errors import one_line_errors
from vitscope.cli.help_text import DEVICE_HELP, FIGURE_FILES_HELP, IMAGE_SIZE_HELP
from vitscope.cli.imports import CommandLine
from vitscope.cli.numbers import shown
from vitscope.cli.terminal import say
from vitscope.errors import VitscopeUsageError, VitscopeValueError

experiment_app = CommandLine(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                             help="Experiments: guided MAE pretraining, robustness of several classifiers.")


@experiment_app.command("guided-mae")
@one_line_errors
def guided_mae(
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    steps: int = typer.Option(1200, "--steps", min=1, help="Training steps per twin (the training length)."),
    batch_size: int = typer.Option(128, "--batch-size", "-b", min=1, help="Images per step."),
    train_images: int = typer.Option(4000, "--train-images", min=1, help="Synthetic training scenes."),
    eval_points: int = typer.Option(6, "--eval-points", min=1, help="Probe evaluations after step 0."),
    bank_images: int = typer.Option(1000, "--bank-images", min=1, help="k-NN bank (training scenes)."),
    test_images: int = typer.Option(500, "--test-images", min=1, help="Held-out test scenes."),
    every_epochs: int = typer.Option(2, "--every-epochs", min=1, help="Epochs per curriculum level (E)."),
    mask_ratio: float = typer.Option(0.75, "--mask-ratio", help="MAE mask ratio: the share of each training "
                                     "image's patches hidden, in (0, 1)."),
    depth: int = typer.Option(6, "--depth", min=1, help="Blocks of the tiny ViT."),
    embed_dim: int = typer.Option(128, "--embed-dim", min=8, help="Width of the tiny ViT."),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic world, the initial weights, batch order, "
                             "crops and masks (both twins share it)."),
    figure_files: bool = typer.Option(False, "--figure-files/--no-figure-files", help=FIGURE_FILES_HELP),
) -> None:
    """Pretrain random-mask and guided-mask MAE twins; plot k-NN probe accuracy against epochs (paper 003 fig. 9)."""
    from vitscope.experiments.guided_mae import GuidedMAEConfig, run_guided_mae

    try:  # the settings' own checks; a value they refuse is bad usage
        cfg = GuidedMAEConfig(steps=steps, batch_size=batch_size, train_images=train_images,
                              eval_points=eval_points, bank_images=bank_images, test_images=test_images,
                              every_epochs=every_epochs, mask_ratio=mask_ratio, depth=depth, embed_dim=embed_dim,
                              seed=seed)
    except VitscopeValueError as err:
        raise VitscopeUsageError(str(err)) from None
    doc = run_guided_mae(cfg, out, figure_files=figure_files)
    entry = doc["analyses"]["guided_mae"]["summary"]
    for twin, acc in entry["accuracy"].items():
        typer.echo(f"{twin:>7}: " + " ".join(shown(a, ".3f") for a in acc))
    conv = entry["convergence"]
    typer.echo(f"first to {conv['target']:.3f} k-NN accuracy: {conv['faster']} -> {out / 'results.json'}")


@experiment_app.command("robustness")
@one_line_errors
def robustness(
    models: str = typer.Option(..., "--models", "-M", help="Comma-separated classifiers (e.g. a ViT and a CNN)."),
    data: str = typer.Option(..., "--data", "-d", help="Labelled dataset, e.g. ROOT::coco or ROOT::imagenet-boxes."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    region: str = typer.Option("box", "--region", help="Foreground: box or mask."),
    fill: str = typer.Option("zero", "--fill", help="Hidden pixels of the foreground test: zero (black), mean (the "
                             "dataset's mean, which shows a background shortcut that black boxes hide) or blur."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N images."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", min=1, help="Images per batch."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    figure_files: bool = typer.Option(False, "--figure-files/--no-figure-files", help=FIGURE_FILES_HELP),
    image_size: int | None = typer.Option(None, "--image-size", min=1, help=IMAGE_SIZE_HELP),
) -> None:
    """Foreground/background-only accuracy and Fourier filtering sweeps, every model in one figure (paper 001 s. 5)."""
    from vitscope.experiments.robustness import run_robustness

    names = [m.strip() for m in models.split(",") if m.strip()]
    doc = run_robustness(names, data, out, batch_size=batch_size, device=device, limit=limit, region=region,
                         fill=fill, figure_files=figure_files, image_size=image_size,
                         log=say)
    echo_choices(doc)
    analyses = doc["analyses"]
    for model, freq in analyses["frequency_filtering"]["summary"].items():
        line = f"{model}: full {shown(freq['full_accuracy'], '.3f')}"
        fg = analyses.get("foreground_masking", {}).get("summary", {}).get(model, {}).get("normalised_accuracy")
        if fg:
            line += (f", foreground-only {shown(fg[1][0], '.3f')}, background-only {shown(fg[2][0], '.3f')} "
                     "(top-1, / full)")
        typer.echo(line)
    typer.echo(f"-> {out / 'results.json'}")
