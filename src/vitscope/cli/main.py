"""The ``vitscope`` command line (thin: parsing and printing only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from vitscope.cli.analyses import analyses as analyses_command
from vitscope.cli.artifacts import artifacts as artifacts_command
from vitscope.cli.attribute import attribute as attribute_command
from vitscope.cli.choices import echo_choices
from vitscope.cli.errors import one_line_errors, one_line_warnings
from vitscope.cli.experiment import experiment_app
from vitscope.cli.explain import explain_pair
from vitscope.cli.explanations import explanations as explanations_command
from vitscope.cli.featviz import featviz as featviz_command
from vitscope.cli.help_text import (
    COMPILE_STATS_HELP,
    CONFIG_HELP,
    DEVICE_HELP,
    FIGURE_FILES_HELP,
    IMAGE_SIZE_HELP,
    JPEG_DRAFT_HELP,
    KEEP_ASPECT_HELP,
    RESUME_HELP,
    WORKERS_HELP,
    analyses_epilog,
)
from vitscope.cli.imports import CommandLine
from vitscope.cli.numbers import counted
from vitscope.cli.paths import writable_folder
from vitscope.cli.probe import probe as probe_command
from vitscope.cli.resolve import resolve_or_exit
from vitscope.cli.sae import sae_app
from vitscope.cli.terminal import say
from vitscope.cli.torchrun import refuse_under_torchrun
from vitscope.cli.zoo import zoo_app
from vitscope.models.errors import TRUST_PICKLE_ENV
from vitscope.strict_json import dumps

app = CommandLine(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"max_content_width": 120}, help="Put vision transformers under a microscope.")
app.add_typer(zoo_app, name="zoo")
app.add_typer(sae_app, name="sae")
app.add_typer(experiment_app, name="experiment")
app.command("explain-pair")(explain_pair)
app.command("attribute")(attribute_command)
app.command("explanations")(explanations_command)
app.command("artifacts")(artifacts_command)
app.command("featviz")(featviz_command)
app.command("probe")(probe_command)
app.command("analyses")(analyses_command)


def _version(value: bool) -> None:
    if value:
        from vitscope._version import __version__

        typer.echo(f"vitscope {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(ctx: typer.Context,
                 version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                              help="Print the version and exit."),
                 trust_pickle: bool = typer.Option(False, "--trust-pickle", help="Load model weights stored as "
                                                   "pickle (pytorch_model.bin, .pt) when a directory has no "
                                                   "safetensors: only for files from a source you trust.")) -> None:
    """Put vision transformers under a microscope."""
    one_line_warnings()
    if trust_pickle:
        os.environ[TRUST_PICKLE_ENV] = "1"  # read by the loader, in this process only
    if ctx.invoked_subcommand != "sae":  # the sae group asks about its own commands
        refuse_under_torchrun(str(ctx.invoked_subcommand))


@app.command()
@one_line_errors
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List every registered model: family, blocks, heads, width, patch, prefix tokens, offline."""
    from vitscope.models.load import describe_models

    rows = describe_models()
    if as_json:
        typer.echo(dumps(rows, indent=1))
        return
    from vitscope.cli.columns import plain_table

    columns = ("name", "family", "blocks", "heads", "width", "patch", "prefix", "offline", "source")
    cells = [[("yes" if r[c] else "no") if c == "offline" else str(r[c]) for c in columns] for r in rows]
    typer.echo(plain_table(columns, cells, right=("blocks", "heads", "width", "patch")))  # names never cut
    typer.echo("Also: hf:<hub id>, hf:<save_pretrained directory>, or a vitscope checkpoint directory.")


def _stderr(message: str) -> None:
    say(message)


def _params_of(name: str | None) -> None:
    """``analyze --params-of NAME``: the analysis's parameters with their defaults and meaning, then exit."""
    if name:
        from vitscope.analyses.params import describe_parameters
        from vitscope.errors import VitscopeError

        try:
            typer.echo(describe_parameters(name))
        except VitscopeError as err:
            _stderr(f"error: {err}")
            raise typer.Exit(2) from None
        raise typer.Exit(0)




@app.command(epilog=analyses_epilog)  # a function: the list includes --import's analyses
@one_line_errors
def analyze(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", "-m", help="Registered name (vitscope models), hf:<id or dir>, "
                                     "or a directory. Required (here or in --config)."),
    data: str | None = typer.Option(None, "--data", "-d", help="Image folder, file list (.txt), image, 'skimage', "
                                    "or ROOT::FORMAT[:SPLIT]. Required (here or in --config)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output directory. Required (here or in --config)."),
    analyses: str | None = typer.Option(None, "--analyses", "-a", help="Comma-separated analysis or group names "
                                        "(NAME@TAG: a labelled second configuration)."),
    params: list[str] | None = typer.Option(None, "--param", "-p", help="Analysis parameter NAME.KEY=VALUE "
                                            "(repeatable), e.g. knn_probe.k=20 or representation.tokens=cls; "
                                            "--params-of NAME lists them."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N images."),
    batch_size: int | None = typer.Option(None, "--batch-size", "-b", min=1, help="Images per batch [16]."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 (default), bf16 or fp16 autocast."),
    strict: bool | None = typer.Option(None, "--strict/--no-strict", help="Stop at the first unreadable image."),
    resume: bool | None = typer.Option(None, "--resume/--no-resume", help=RESUME_HELP),
    checkpoint_seconds: float | None = typer.Option(None, "--checkpoint-seconds", min=0,
                                                    help="Least seconds between state saves [60]."),
    figure_files: bool | None = typer.Option(None, "--figure-files/--no-figure-files", help=FIGURE_FILES_HELP),
    image_size: int | None = typer.Option(None, "--image-size", min=1, help=IMAGE_SIZE_HELP),
    keep_aspect: bool | None = typer.Option(None, "--keep-aspect/--no-keep-aspect", help=KEEP_ASPECT_HELP),
    workers: int | None = typer.Option(None, "--workers", min=0, help=WORKERS_HELP),
    jpeg_draft: bool | None = typer.Option(None, "--jpeg-draft/--no-jpeg-draft", help=JPEG_DRAFT_HELP),
    compile_stats: bool | None = typer.Option(None, "--compile-stats/--no-compile-stats", help=COMPILE_STATS_HELP),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    params_of: str | None = typer.Option(None, "--params-of", metavar="NAME", is_eager=True, callback=_params_of,
                                         help="Print the parameters of analysis NAME (defaults and meaning) and "
                                              "exit."),
) -> None:
    """Run analyses over a dataset in one pass; write results.json, tables, figures and report.html."""
    # the parameters are named as AnalyzeOptions' fields: ctx.params holds them all, --config too
    from vitscope.workflows.analyze import analyze_command
    from vitscope.workflows.options import AnalyzeOptions

    path = analyze_command(resolve_or_exit(AnalyzeOptions, ctx.params), log=_stderr)
    if path is None:  # a rank other than 0 of a torchrun launch: rank 0 writes and reports
        return
    doc = json.loads(path.read_text())
    echo_choices(doc)
    typer.echo(f"{counted(doc['num_images'], 'image')}, {counted(len(doc['analyses']), 'analysis', 'analyses')} -> "
               f"{path}")
    typer.echo(f"report: {path.parent / 'report.html'}")
    if doc["skipped"]:
        typer.echo(f"skipped {len(doc['skipped'])} unreadable file(s); listed in results.json")


@app.command()
@one_line_errors
def compare(
    ctx: typer.Context,
    models: str | None = typer.Option(None, "--models", "-M", help="Comma-separated models (two or more), each MODEL "
                                      "or NAME=MODEL, NAME shown in legends, tables and the report (unique; a "
                                      "letter or _, then letters, digits, _ - .; split at the first '=' only after "
                                      "such a name, so hf:org/m=v2 stays whole). Required (here or in --config)."),
    data: str | None = typer.Option(None, "--data", "-d", help="Dataset, as for analyze (ROOT::coco gives masks "
                                    "and labels). Required (here or in --config)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output directory. Required (here or in --config)."),
    analyses: str | None = typer.Option(None, "--analyses", "-a", help="What each model runs besides the pooled "
                                        "features behind clustering, k-NN and CKA between models: analysis or group "
                                        "names as for analyze (default: attention_distance, the attention maps and, "
                                        "with masks, saliency_iou); others are reported per model as ANALYSIS@NAME."),
    params: list[str] | None = typer.Option(None, "--param", "-p", help="Analysis parameter NAME.KEY=VALUE "
                                            "(repeatable), e.g. saliency_iou.mass=0.5; analyze --params-of NAME "
                                            "lists them."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use only the first N images."),
    batch_size: int | None = typer.Option(None, "--batch-size", "-b", min=1, help="Images per batch [16]."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 (default), bf16 or fp16 autocast."),
    strict: bool | None = typer.Option(None, "--strict/--no-strict", help="Stop at the first unreadable image."),
    resume: bool | None = typer.Option(None, "--resume/--no-resume", help=RESUME_HELP),
    checkpoint_seconds: float | None = typer.Option(None, "--checkpoint-seconds", min=0,
                                                    help="Least seconds between state saves [60]."),
    figure_files: bool | None = typer.Option(None, "--figure-files/--no-figure-files", help=FIGURE_FILES_HELP),
    image_size: int | None = typer.Option(None, "--image-size", min=1, help=IMAGE_SIZE_HELP),
    keep_aspect: bool | None = typer.Option(None, "--keep-aspect/--no-keep-aspect", help=KEEP_ASPECT_HELP),
    workers: int | None = typer.Option(None, "--workers", min=0, help=WORKERS_HELP),
    jpeg_draft: bool | None = typer.Option(None, "--jpeg-draft/--no-jpeg-draft", help=JPEG_DRAFT_HELP),
    compile_stats: bool | None = typer.Option(None, "--compile-stats/--no-compile-stats", help=COMPILE_STATS_HELP),
    cka_estimator: str | None = typer.Option(None, "--cka-estimator", help="CKA between models: full_unbiased "
                                             "(default; about 0 for unrelated features) or full (biased: unrelated "
                                             "features score well above 0 with few images or wide features)."),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
) -> None:
    """Compare models per block on shared axes (paper 002): one pass per model; figures, tables, report.html."""
    # the parameters are named as CompareOptions' fields: ctx.params holds them all, --config too
    from vitscope.workflows.compare import compare_command
    from vitscope.workflows.options import CompareOptions

    path = compare_command(resolve_or_exit(CompareOptions, ctx.params), log=_stderr)
    if path is None:  # a rank other than 0 of a torchrun launch
        return
    doc = json.loads(path.read_text())
    echo_choices(doc)
    typer.echo(f"{len(doc['models'])} models, {doc['num_images']} images -> {path}")
    typer.echo(f"report: {path.parent / 'report.html'}")


@app.command()
@one_line_errors
def demo(
    out: Path = typer.Option(Path("demo_out"), "--out", "-o", help="Output directory."),
    quick: bool = typer.Option(False, "--quick", help="Fewer images and smaller paper sections: under 30 s on 2 CPU "
                               "cores (for CI)."),
) -> None:
    """Generate the synthetic world, compare the tiny zoo on it, explain a few pairs, visualise units, measure token
    mixing, SIFT interrelation and masking by it; write report.html."""
    # Before torch and scikit-learn start OpenMP: idle threads sleep instead of spinning. The demo's tiny models
    # run short parallel regions, and on a shared machine spinning workers took 3x longer (--quick 10 s vs 27-32 s).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from vitscope.workflows.demo import demo as run_demo

    writable_folder("--out", out)  # before the world is generated
    path = run_demo(out, quick=quick, log=_stderr)
    typer.echo(f"demo report: {path}")


@app.command()
@one_line_errors
def synth(
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    format: str = typer.Option(..., "--format", "-f", help="imagefolder|coco|partimagenet|davis|spair|revisitop|"
                               "sop|list|imagenet-boxes"),
    n: int = typer.Option(100, "--n", min=1, help="Images (davis: sequences, spair: pairs)."),
    size: int = typer.Option(224, "--size", min=16, help="Image side in pixels."),
    seed: int = typer.Option(0, "--seed"),
    spurious: float | None = typer.Option(None, "--spurious", help="P(the background type is tied to the class, "
                                          "label mod 5; else drawn at random, so it agrees with P + (1 - P) / 5)."),
    num_classes: int = typer.Option(10, "--classes", min=2),
    max_objects: int = typer.Option(3, "--max-objects", min=1, help="Objects per scene (1 to this)."),
) -> None:
    """Generate the synthetic world with ground truth in a real dataset format."""
    from vitscope.data.synthetic.write import SYNTH_FORMATS, synthesize

    if format in SYNTH_FORMATS:  # synthesize refuses another, naming the choices, before it writes
        writable_folder("--out", out)
    root = synthesize(out, format, n=n, size=size, seed=seed, spurious=spurious, num_classes=num_classes,
                      max_objects=max_objects)
    typer.echo(f"wrote {format} ({n} items, {size} px, seed {seed}) -> {root}")


def main() -> None:  # pragma: no cover - console entry point
    app()
