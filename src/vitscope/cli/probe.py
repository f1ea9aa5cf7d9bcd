"""``vitscope probe``: per-block downstream probes of one model on one benchmark (paper 002 section 6).

The data format picks the probe: ``revisitop`` -> retrieval (revisited mAP), ``davis`` -> label propagation
(J, F, J&F), ``spair`` -> keypoint correspondence (PCK), ``coco`` / ``partimagenet`` -> region clustering,
any labelled image set (``imagefolder``...) -> k-NN, linear probes and clustering (a second labelled set
with ``--test-data``, else a seeded hold-out of ``--test-fraction``). Everything runs through
:func:`vitscope.downstream.sweep.probe_sweep`; this module only parses, writes and prints.
"""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.errors import one_line_errors
from vitscope.cli.help_text import FIGURE_FILES_HELP

__all__ = ["parse_blocks", "probe"]

def parse_blocks(text: str | None, num_blocks: int) -> tuple[int, ...] | None:
    """``"0,3,-1"`` -> ``(0, 3, -1)`` checked against ``num_blocks``; None / ``"all"`` -> None (every block).

    Raises:
        typer.BadParameter: not integers, or outside ``-num_blocks .. num_blocks-1`` (bad usage, exit 2).
    """
    if text is None or text.strip().lower() in ("", "all"):
        return None
    try:
        blocks = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        raise typer.BadParameter(f"--blocks takes comma-separated integers, got {text!r}") from None
    bad = [b for b in blocks if not -num_blocks <= b < num_blocks]
    if bad or not blocks:
        raise typer.BadParameter(f"--blocks {text!r}: the model has blocks 0..{num_blocks - 1} (negative counts "
                                 "from the end)")
    return blocks


@one_line_errors
def probe(
    model: str = typer.Option(..., "--model", "-m", help="Registered name, hf:<id or dir>, or a directory."),
    data: str = typer.Option(..., "--data", "-d", help="ROOT::FORMAT[:SPLIT] (revisitop, davis, spair, coco, "
                             "partimagenet, imagefolder...; e.g. davis::davis:test-dev) or ROOT (format detected)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    test_data: str | None = typer.Option(None, "--test-data", help="Labelled test set for k-NN and linear probes "
                                         "(default: hold out --test-fraction of --data)."),
    test_fraction: float = typer.Option(0.2, "--test-fraction", min=0.01, max=0.99,
                                        help="Share of a labelled --data held out for testing."),
    tiling: float = typer.Option(0.0, "--tiling", help="Dense features by tiling for spatial probes: frame side / "
                                 "model input (the paper: 2); 0 = off."),
    blocks: str | None = typer.Option(None, "--blocks", help="Comma-separated blocks, negative from the end "
                                      "[all]."),
    site: str = typer.Option("resid_post", "--site", help="Block site: resid_post, norm1, norm2, ..."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", min=1, help="Images per forward pass."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, mps (default: best available)."),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 (default), bf16 or fp16 autocast."),
    seed: int = typer.Option(0, "--seed", help="Seed of the split, the probes and the random baselines."),
    cache: Path | None = typer.Option(None, "--cache", help="Feature-cache folder [$VITSCOPE_CACHE/features or "
                                      "~/.cache/vitscope/features]."),
    davis_void: str = typer.Option("background", "--davis-void", help="DAVIS void pixels (255): background (the "
                                   "official evaluation: predictions on them count) or ignore (masked out of both "
                                   "masks)."),
    figure_files: bool = typer.Option(False, "--figure-files/--no-figure-files", help=FIGURE_FILES_HELP),
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

    if tiling != 0 and not tiling >= 1:
        raise typer.BadParameter(f"--tiling must be 0 (off) or a scale >= 1, got {tiling:g}")
    options = {"model": model, "data": data, "out": out, "test_data": test_data, "test_fraction": test_fraction,
               "tiling": tiling, "blocks": lambda num_blocks: parse_blocks(blocks, num_blocks), "site": site,
               "batch_size": batch_size, "device": device, "dtype": dtype, "seed": seed, "cache": cache,
               "davis_void": davis_void, "figure_files": figure_files}
    from vitscope.cli.launch import role
    from vitscope.workflows.probe import run_probe

    with role(lambda m: typer.echo(m, err=True)) as me:  # under torchrun: this process's share; rank 0 writes
        path = run_probe(options, log=me.log, distributed=me.distributed)
    if path is None:
        return
    doc = json.loads(path.read_text())
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
