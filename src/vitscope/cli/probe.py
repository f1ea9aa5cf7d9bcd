"""``vitscope probe``: per-block downstream probes of one model on one benchmark (paper 002 section 6).

The data format picks the probe: ``revisitop`` -> retrieval (revisited mAP), ``davis`` -> label propagation
(J, F, J&F), ``spair`` -> keypoint correspondence (PCK), ``coco`` / ``partimagenet`` -> region clustering,
any labelled image set (``imagefolder``...) -> k-NN, linear probes and clustering (a second labelled set
with ``--test-data``, else a seeded hold-out of ``--test-fraction``). Everything runs through
:func:`vitscope.analyses.probes.probe_sweep`; this module only parses, writes and prints.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from vitscope.cli.errors import one_line_errors

__all__ = ["PROBE_OF_FORMAT", "parse_blocks", "probe", "run_probe"]

#: data format -> probe_sweep argument (formats not listed are treated as labelled image sets)
PROBE_OF_FORMAT = {"revisitop": "retrieval", "davis": "davis", "spair": "spair", "coco": "regions",
                   "partimagenet": "regions"}


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


def _open(data: str):
    """``ROOT::FORMAT`` (or ``ROOT``, format detected) -> ``(reader, format)``."""
    from vitscope.data.load import detect_format, load_dataset

    root, sep, fmt = data.rpartition("::")
    root, fmt = (root, fmt) if sep else (data, "")
    fmt = fmt or detect_format(root)
    return load_dataset(root, fmt), fmt


def _labelled_split(dataset, fmt: str, test_fraction: float, seed: int):
    """A labelled reader -> ``(train, test)`` image lists with labels, split by a seeded hash of the position."""
    import numpy as np

    from vitscope.analyses.probe_base import holdout_mask
    from vitscope.data.annotated_source import AnnotatedSource
    from vitscope.data.files import ImageFiles

    source = AnnotatedSource(dataset)
    try:
        labels = source.labels()
    except ValueError:
        raise ValueError(f"{fmt} data has no image labels; vitscope probe takes revisitop, davis, spair, coco, "
                         "partimagenet or labelled images (imagefolder)") from None
    test = holdout_mask(np.arange(len(source)), test_fraction, seed)
    if test.all() or not test.any():
        raise ValueError(f"{len(source)} images cannot be split into train and test at --test-fraction "
                         f"{test_fraction}; add images or pass --test-data")
    paths = np.asarray(source.paths, dtype=object)
    return (ImageFiles(list(paths[~test]), labels=labels[~test], name=f"{source.name}:train"),
            ImageFiles(list(paths[test]), labels=labels[test], name=f"{source.name}:test"))


def _num_images(dataset, fmt: str) -> int:
    if fmt == "davis":
        return sum(len(dataset[s].frame_paths) for s in range(len(dataset)))
    if fmt == "spair":
        return len({p for i in range(len(dataset)) for p in (dataset[i].src_path, dataset[i].trg_path)})
    return len(dataset)


def run_probe(options: dict[str, Any], log: Callable[[str], None] | None = None) -> Path:
    """Load the model and data, run the probes, write results.json, tables, figures and report.html.

    Args:
        options: ``model``, ``data``, ``out``, ``test_data``, ``test_fraction``, ``tiling``, ``blocks`` (text),
            ``site``, ``batch_size``, ``device``, ``dtype``, ``seed``, ``cache`` (folder or None).
        log: receives one-line progress messages.

    Returns:
        The path of results.json.
    """
    import vitscope
    from vitscope.analyses.probe_common import require_blocks
    from vitscope.analyses.probe_result import best_block_table
    from vitscope.analyses.probes import probe_sweep
    from vitscope.cli.analyze import environment, save_result_files, write_results_json
    from vitscope.engine.provenance import model_identity
    from vitscope.features.cache import FeatureCache
    from vitscope.models.load import load_model
    from vitscope.report import analyze_report, write_report

    out = Path(options["out"])
    backbone = load_model(options["model"])
    require_blocks(backbone, "per-block")  # before any data is read: a CNN fails at once
    blocks = parse_blocks(options.get("blocks"), backbone.spec.num_blocks)
    dataset, fmt = _open(options["data"])
    task = PROBE_OF_FORMAT.get(fmt, "labelled")
    data: dict[str, Any] = {task: dataset}
    if task == "labelled":
        if options.get("test_data"):
            test, _ = _open(options["test_data"])
            data = {"train": dataset, "test": test}
        else:
            train, test = _labelled_split(dataset, fmt, options["test_fraction"], options["seed"])
            data = {"train": train, "test": test}
    elif options.get("test_data"):
        raise ValueError(f"--test-data is for labelled image sets; {fmt} data is probed on its own")
    if log:
        log(f"probing {backbone.spec.name} on {fmt} ({task}) ...")
    cache = FeatureCache(options["cache"]) if options.get("cache") else None
    results = probe_sweep(backbone, cache, **data, tiling=options.get("tiling") or False, blocks=blocks,
                          site=options["site"], seed=options["seed"], batch_size=options["batch_size"],
                          device=options.get("device"), dtype=options.get("dtype"))
    files = save_result_files(out, results)
    table = best_block_table({backbone.spec.name: results})
    table_path = out / "tables" / "best_blocks.csv"
    table.to_csv(table_path, index=False)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()}
    doc = {
        "vitscope_version": vitscope.__version__,
        "config": {**config, "format": fmt, "task": task, "blocks": None if blocks is None else list(blocks),
                   "device": options.get("device") or "auto", "dtype": options.get("dtype") or "fp32"},
        "models": [model_identity(options["model"], backbone)],
        "data": {"name": getattr(dataset, "name", fmt), "source": options["data"], "format": fmt,
                 "items": len(dataset)},
        "num_images": _num_images(dataset, fmt) + (_num_images(data["test"], fmt) if options.get("test_data") else 0),
        "skipped": [],
        "analyses": {name: {"summary": r.summary(), "files": files[name]} for name, r in results.items()},
        "best_blocks": {"file": str(table_path.relative_to(out)), "rows": table.to_dict(orient="records")},
        "environment": environment(),
    }
    path = write_results_json(out, doc)
    write_report(analyze_report(out, doc, results), out / "report.html")
    return path


@one_line_errors
def probe(
    model: str = typer.Option(..., "--model", "-m", help="Registered name, hf:<id or dir>, or a directory."),
    data: str = typer.Option(..., "--data", "-d", help="ROOT::FORMAT (revisitop, davis, spair, coco, partimagenet, "
                             "imagefolder...) or ROOT (format detected)."),
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
) -> None:
    """Per-block probes (retrieval, DAVIS, SPair keypoints, k-NN / linear, clustering) with random chance."""
    import json

    if tiling != 0 and not tiling >= 1:
        raise typer.BadParameter(f"--tiling must be 0 (off) or a scale >= 1, got {tiling:g}")
    options = {"model": model, "data": data, "out": out, "test_data": test_data, "test_fraction": test_fraction,
               "tiling": tiling, "blocks": blocks, "site": site, "batch_size": batch_size, "device": device,
               "dtype": dtype, "seed": seed, "cache": cache}
    path = run_probe(options, log=lambda m: typer.echo(m, err=True))
    doc = json.loads(path.read_text())
    for row in doc["best_blocks"]["rows"]:
        head = f"{row['task']:<24} {row['metric']:<10}"
        if row["best_block"] < 0:  # e.g. hard mAP when no query has a hard positive
            typer.echo(f"{head} no score (nothing to evaluate at any block)")
        else:
            typer.echo(f"{head} best block {row['best_block']:>2}: {row['score']:.4f} (random {row['random']:.4f})")
    typer.echo(f"-> {path}")
    typer.echo(f"report: {path.parent / 'report.html'}")
