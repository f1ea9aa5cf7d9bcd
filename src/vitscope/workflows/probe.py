"""``vitscope probe``: per-block downstream probes of one model on one benchmark (paper 002 section 6).

The data format picks the probe: ``revisitop`` -> retrieval (revisited mAP), ``davis`` -> label propagation
(J, F, J&F), ``spair`` -> keypoint correspondence (PCK), ``coco`` / ``partimagenet`` -> region clustering,
any labelled image set (``imagefolder``...) -> k-NN, linear probes and clustering (a second labelled set
with ``test_data``, else a seeded hold-out of ``test_fraction``). Everything runs through
:func:`vitscope.downstream.sweep.probe_sweep`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitscope.data.fingerprint import held_fingerprints
from vitscope.downstream.checks import layout_hint, require_classes, require_regions
from vitscope.errors import DegenerateDataError, VitscopeValueError
from vitscope.outputs import RunResult, prepare_output, write_run
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs
from vitscope.workflows.launch import role
from vitscope.workflows.options import ConfigError, ProbeOptions

__all__ = ["PROBE_OF_FORMAT", "check_blocks", "probe_command", "run_probe"]

#: data format -> probe_sweep argument (formats not listed are treated as labelled image sets)
PROBE_OF_FORMAT = {"revisitop": "retrieval", "davis": "davis", "spair": "spair", "coco": "regions",
                   "partimagenet": "regions"}
#: formats read as Sources of images in containers (no file per image): labelled image sets
SOURCE_FORMATS = ("hf", "webdataset")


def _open(data: str, limit: int | None = None):
    """``ROOT::FORMAT[:SPLIT]`` (or ``ROOT``, format detected) -> ``(reader, format)``, the reader cut to its first
    ``limit`` items (images, DAVIS sequences, SPair pairs)."""
    from vitscope.data.first_items import FirstItems
    from vitscope.data.load import detect_format, load_dataset, parse_data

    root, fmt, options = parse_data(data) if "::" in data else (data, None, {})
    if fmt is None and _only_images(Path(root)):  # a plain folder of pictures: no labels to probe
        from vitscope.analyses.data_checks import no_labels

        raise DegenerateDataError(no_labels(f"data {root!r}", f"; {root} holds images and no class subfolders"))
    fmt = fmt or detect_format(root)
    if fmt in SOURCE_FORMATS:  # a Source already (images as bytes): a part of it is a Source too
        from vitscope.data.open import as_source
        from vitscope.data.source_part import SourcePart

        source = as_source(data)
        return (source if limit is None else SourcePart(source, range(min(limit, len(source))), source.name)), fmt
    dataset = load_dataset(root, fmt, **options)
    if limit is None:
        return dataset, fmt
    if fmt == "revisitop":
        raise ConfigError("--limit does not apply to revisitop: every query is ranked against the whole "
                                 "database, whose ground truth a cut would break; leave --limit out")
    return FirstItems(dataset, limit), fmt


def _source_of(dataset):
    """A reader as a :class:`~vitscope.data.source.Source`: sources (``::hf``, ``::webdataset``, image folders read
    as bytes) as they are, dataset readers through their annotations."""
    from vitscope.data.annotated_source import AnnotatedSource
    from vitscope.data.source import Source

    return dataset if isinstance(dataset, Source) else AnnotatedSource(dataset)


def _only_images(root: Path) -> bool:
    """Whether ``root`` is a folder of image files and nothing else (no class folders, no annotations)."""
    from vitscope.data.images import IMAGE_EXTENSIONS

    entries = [p for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []
    return bool(entries) and all(p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS for p in entries)


def _labels(source):
    """``[N]`` image labels of a source, -1 throughout when it has none (:func:`require_classes` then says so)."""
    import numpy as np

    try:
        return source.labels()
    except ValueError:
        return np.full(len(source), -1, dtype=np.int64)


def _require_clustered(labels, reader, data: str, advice: str) -> None:
    """Refuse, before any pass, test images of fewer than two classes: clustering scores them alone, and one class
    scores 1.0, as does its random chance. A few test images of one each pass (clustering warns that every image
    gets a cluster of its own; k-NN and linear probes score them).

    Args:
        labels: ``[n]`` labels of the test images (-1: unlabelled); reader: what names them (its ``classes``).
        data: what to call the test images; advice: appended to the message.

    Raises:
        DegenerateDataError: :func:`vitscope.analyses.data_checks.class_problem`'s line (the words the whole data is
            refused with), naming the side and its classes.
    """
    import numpy as np

    from vitscope.analyses.data_checks import class_names, class_problem

    labels = np.asarray(labels)
    if np.unique(labels[labels >= 0]).size < 2:
        raise DegenerateDataError(class_problem(labels, data, class_names(reader), advice))


def _labelled_split(dataset, fmt: str, test_fraction: float, seed: int):
    """A labelled reader -> ``(train, test)`` image lists with labels, split by a seeded hash of the position."""
    import numpy as np

    from vitscope.analyses.data_checks import split_problem
    from vitscope.analyses.probes.base import holdout_mask
    from vitscope.data.files import ImageFiles

    source = _source_of(dataset)
    labels = _labels(source)
    require_classes(labels, dataset, fmt)
    test = holdout_mask(np.arange(len(source)), test_fraction, seed)
    problem = split_problem(test[labels >= 0], test_fraction)
    if problem:
        raise DegenerateDataError(problem)
    _require_clustered(labels[test], dataset, f"the held-out test part of {fmt} data ({int(test.sum())} images)",
                       f"; clustering scores the held-out images alone: raise --test-fraction (now {test_fraction}) "
                       "or pass --test-data")
    if fmt in SOURCE_FORMATS:  # no files to list: the parts read the whole by position
        from vitscope.data.source_part import SourcePart

        return (SourcePart(source, np.flatnonzero(~test), f"{source.name}:train"),
                SourcePart(source, np.flatnonzero(test), f"{source.name}:test"))
    paths = np.asarray(source.paths, dtype=object)
    return (ImageFiles(list(paths[~test]), labels=labels[~test], name=f"{source.name}:train"),
            ImageFiles(list(paths[test]), labels=labels[test], name=f"{source.name}:test"))


def _extraction(options: ProbeOptions) -> dict[str, Any]:
    """How the feature passes run: unreadable images (``strict``), saved state (``resume``, how often) and how JPEGs
    decode (``jpeg_draft``)."""
    return {"strict": options.strict, "resume": options.resume, "checkpoint_seconds": options.checkpoint_seconds,
            "jpeg_draft": options.jpeg_draft}


def check_blocks(blocks: tuple[int, ...] | str | None, num_blocks: int) -> tuple[int, ...] | None:
    """The blocks to probe (``"all"`` or None: every block, as None), checked against the model's ``num_blocks``.

    Raises:
        ConfigError: a block outside ``-num_blocks .. num_blocks-1`` (an option the model cannot take).
    """
    if blocks is None or blocks == "all":
        return None
    bad = [b for b in blocks if not -num_blocks <= b < num_blocks]
    if bad:
        shown = ",".join(str(b) for b in blocks)
        raise ConfigError(f"--blocks {shown!r}: the model has blocks 0..{num_blocks - 1} (negative counts from the "
                          "end)")
    return tuple(blocks)


def _describe(dataset: Any, jpeg_draft: bool = False) -> dict[str, Any]:
    """results.json ``data`` with the keys every command writes: the source's description (name, root, format id,
    split, items as ``num_files``, label rule and classes), the fingerprint of its files and the decoding."""
    from vitscope.data.fingerprint import data_fingerprint
    from vitscope.data.source import Source
    from vitscope.engine.decoding import decode_name

    source = _source_of(dataset)
    whole = getattr(source, "source", None)  # the first items of a Source (--limit on hf or webdataset data)
    described = whole.describe() if isinstance(whole, Source) else source.describe()
    return {**described, "name": source.name, "num_files": len(dataset), "fingerprint": data_fingerprint(source),
            "decode": decode_name(jpeg_draft)}


def _num_images(dataset, fmt: str) -> int:
    if fmt == "davis":
        return sum(len(dataset[s].frame_paths) for s in range(len(dataset)))
    if fmt == "spair":
        return len({p for i in range(len(dataset)) for p in (dataset[i].src_path, dataset[i].trg_path)})
    return len(dataset)


def probe_command(options: ProbeOptions, log: Callable[[str], None] | None = None) -> Path | None:
    """``vitscope probe``: :func:`run_probe` in this process's role (under ``torchrun``: its share of the feature
    extraction; rank 0 writes).

    Returns:
        The path of results.json (None on the other processes of a ``torchrun`` launch).
    """
    with role(log) as me:
        return run_probe(options, log=me.log, distributed=me.distributed)


@held_fingerprints()  # every pass of the command stats the files once
@releasing_outputs
def run_probe(options: ProbeOptions, log: Callable[[str], None] | None = None, distributed: bool = False
              ) -> Path | None:
    """Load the model and data, run the probes, write results.json, tables, figures and report.html.

    Args:
        options: :class:`~vitscope.workflows.options.ProbeOptions`: ``model``, ``data``, ``out``, ``test_data``,
            ``test_fraction``, ``tiling``, ``blocks`` (a tuple, None or ``"all"`` for every block; checked
            against the model), ``site``, ``batch_size``, ``device``, ``dtype``, ``seed``, ``cache`` (folder or
            None), ``davis_void``, ``figure_files``, ``image_size`` (None: the model's own preprocessing);
            ``limit`` (the first items of ``data`` and ``test_data``), ``strict``, ``resume`` and
            ``checkpoint_seconds`` (the extraction passes).
        log: receives one-line progress messages.
        distributed: this process is one of several (``torchrun``): the feature extraction is shared, every
            process computes the probes on the whole cache, and rank 0 alone writes.

    Returns:
        The path of results.json (None on the other processes of a distributed run).
    """
    check_output(options.out)  # before any work: a wrong --out costs nothing
    from vitscope.analyses.probes.result import best_block_table
    from vitscope.cache.feature_cache import FeatureCache
    from vitscope.cache.request import TOKEN_SITES
    from vitscope.downstream.checks import require_blocks
    from vitscope.downstream.davis import VOID_RULES
    from vitscope.downstream.sweep import probe_sweep
    from vitscope.engine.provenance import model_identity
    from vitscope.engine.results import run_record
    from vitscope.engine.run import tally_passes
    from vitscope.engine.settings import describe_device
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model
    from vitscope.workflows.option_values import ConfigError

    void = options.davis_void or "background"
    if void not in VOID_RULES:  # before any model or data is loaded: bad usage (exit status 2)
        raise ConfigError(f"--davis-void must be one of {', '.join(VOID_RULES)}, got {void!r}")
    if options.site not in TOKEN_SITES:
        raise ConfigError(f"--site must be one of {', '.join(TOKEN_SITES)}, got {options.site!r}")
    options.check_placement()
    backbone = load_model(options.model, image_size=options.image_size, keep_aspect=options.keep_aspect)
    require_blocks(backbone, "per-block")  # before any data is read: a CNN fails at once
    if log:
        log(describe_input(backbone.spec))
    blocks = check_blocks(options.blocks, backbone.spec.num_blocks)
    dataset, fmt = _open(options.data, options.limit)
    task = PROBE_OF_FORMAT.get(fmt, "labelled")
    data: dict[str, Any] = {task: dataset}
    if task == "labelled":
        if options.test_data:
            test, test_fmt = _open(options.test_data, options.limit)
            require_classes(_labels(_source_of(dataset)), dataset, fmt)
            _require_clustered(_labels(_source_of(test)), test, f"{test_fmt} --test-data",
                               layout_hint(test, test_fmt) + "; clustering scores the --test-data images alone")
            data = {"train": dataset, "test": test}
        else:
            train, test = _labelled_split(dataset, fmt, options.test_fraction, options.seed)
            data = {"train": train, "test": test}
    elif options.test_data:
        raise VitscopeValueError(f"--test-data is for labelled image sets; {fmt} data is probed on its own")
    if task == "regions":
        require_regions(dataset, fmt)
    cache = FeatureCache(options.cache) if options.cache else None
    if task == "davis" and getattr(dataset, "first_frame_only", False):
        return _davis_first_frames(options, backbone, dataset, blocks, cache, log, distributed)
    out = prepare_output(options.out)  # once the model and the data are known good: a refused run leaves no folder
    if log:
        log(f"probing {backbone.spec.name} on {fmt} ({task}) ...")
    with tally_passes() as passes:  # the feature cache makes the passes: what they resumed, how they decoded
        results = probe_sweep(backbone, cache, **data, tiling=options.tiling or False, blocks=blocks,
                              site=options.site, seed=options.seed, batch_size=options.batch_size,
                              device=options.device, dtype=options.dtype, distributed=distributed, log=log,
                              davis_void=void, workers=options.workers, **_extraction(options))
    if distributed:
        from vitscope.engine.distributed import is_main_process

        if not is_main_process():
            return None
    table = best_block_table({backbone.spec.name: results})
    num_images = _num_images(dataset, fmt) + (_num_images(data["test"], fmt) if options.test_data else 0)
    return write_run(out, RunResult(
        "probe", title=f"vitscope probe: {options.model} on {fmt} ({task})",
        config=options.record(format=fmt, task=task, blocks=None if blocks is None else list(blocks)),
        results=dict(results), models=[model_identity(options.model, backbone)],
        data=_describe(dataset, options.jpeg_draft), num_images=num_images, tables={"best_blocks": table},
        extra={"best_blocks": {"file": "tables/best_blocks.csv", "rows": table.to_dict(orient="records")}},
        device=describe_device(options.device), **run_record(passes)),
        figure_files=options.figure_files)


def _davis_first_frames(options: ProbeOptions, backbone: Any, dataset: Any, blocks: Any, cache: Any,
                        log: Callable[[str], None] | None, distributed: bool) -> Path | None:
    """DAVIS test-dev / test-challenge: propagate each first annotation at one block and write the masks as the
    official evaluation takes them (``predictions/<sequence>/<frame>.png``); no J or F can be computed here."""
    from vitscope.downstream.davis import davis_predictions
    from vitscope.engine.provenance import model_identity
    from vitscope.engine.results import run_record
    from vitscope.engine.run import tally_passes
    from vitscope.engine.settings import describe_device

    blocks = [backbone.spec.num_blocks - 1] if blocks is None else list(blocks)
    if len(blocks) != 1:
        raise VitscopeValueError(f"{dataset.name} annotates only first frames: its masks are written for one block; "
                                 f"pass --blocks with one block (got {len(blocks)}; default: the last)")
    block = blocks[0] % backbone.spec.num_blocks  # --blocks -1: the last
    if log:
        log(f"propagating {backbone.spec.name} block {block} on {dataset.name} (first frames annotated only) ...")
    if options.jpeg_draft:
        raise VitscopeValueError("--jpeg-draft follows the model's own resize, but DAVIS frames are resized their own "
                                 "way; run the DAVIS probe without it")
    out = prepare_output(options.out)  # once the options are known good: a refused run leaves no folder
    extraction = {k: v for k, v in _extraction(options).items() if k != "jpeg_draft"}
    with tally_passes() as passes:
        files = davis_predictions(backbone, dataset, block, cache, site=options.site,
                                  tiling=options.tiling or False, batch_size=options.batch_size,
                                  device=options.device, dtype=options.dtype, distributed=distributed, log=log,
                                  **extraction)
    if distributed:
        from vitscope.engine.distributed import is_main_process

        if not is_main_process():
            return None
    reason = (f"{dataset.name} annotates only the first frame of each sequence, so no J or F was computed; the "
              f"masks propagated at block {block} are in predictions/, one folder per sequence, as the official "
              "DAVIS evaluation takes them")
    if log:
        log(f"no J&F: {reason}")
    return write_run(out, RunResult(
        "probe", title=f"vitscope probe: {options.model} on davis (propagation only)",
        config=options.record(format="davis", task="davis-predictions", blocks=[block]),
        models=[model_identity(options.model, backbone)],
        data=_describe(dataset),
        num_images=_num_images(dataset, "davis"), notes=[reason],
        extra={"davis": {"scored": False, "reason": reason, "block": block, "predictions": "predictions/",
                         "sequences": len(dataset), "frames": len(files)}},
        files={f"predictions/{rel}": content for rel, content in files.items()},
        device=describe_device(options.device), **run_record(passes)))
