"""``vitscope.run``: THE loop over images (docs/architecture.md, "The one loop"). Everything that reads a dataset
through a model (``analyze``, ``compare``, the feature cache, the probes, masking re-runs) is fed by it.

Per batch: decode (one batch ahead, in a thread), preprocess (the model's own, or a :class:`View`), forward
under autocast while recording exactly the hooks the analyses need, hand every analysis the record and a
:class:`~vitscope.analyses.batch.Batch` carrying the run's shared quantities and the model, save resumable
state when due. At the end every analysis computes its result.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitscope.analyses.base import Analysis
from vitscope.analyses.batch import loader_work, union_plan
from vitscope.analyses.data_checks import DataFacts
from vitscope.analyses.grids import grid_counts
from vitscope.analyses.registry import get_analysis, refuse_what_cannot_run, refuse_what_the_view_cannot_feed
from vitscope.analyses.sync import exchange_folder
from vitscope.data.open import as_source
from vitscope.data.source import Source
from vitscope.engine.batch_forward import BatchForward
from vitscope.engine.batches import LoaderClock, SkipLog, iter_batches, loader_bound_note, shard_range, workers_used
from vitscope.engine.decoding import data_entry, decoding
from vitscope.engine.distributed import barrier, collectives, gather_lists, parts_over_ranks, shard_for, sum_over_ranks
from vitscope.engine.results import EmptyRunError, Results, pass_timing
from vitscope.engine.settings import dtype_name, loader_workers, progress_bar, resolve_device, resolve_dtype
from vitscope.engine.state import Checkpoint, interrupt_guard, restore_or_reset, run_checkpoint
from vitscope.engine.streaming import stream_plan, warn_if_patterns_do_not_fit
from vitscope.errors import VitscopeValueError
from vitscope.functional.attention_blocks import Workspace
from vitscope.functional.compiled import watch_fallbacks
from vitscope.hooks.names import expand_names
from vitscope.models.backbone import Backbone
from vitscope.models.inference import inference_pass
from vitscope.models.preprocess import pixel_groups, resized_pixels
from vitscope.models.spec import ModelSpec
from vitscope.models.views import StandardView

__all__ = ["PassTally", "loader_preprocessing", "required_hook_names", "resolve_device",
           "resolve_dtype", "run", "tally_passes"]


@dataclass
class PassTally:
    """What the passes of :func:`run` made inside :func:`tally_passes` did, for a command whose passes are made
    on its behalf (the feature cache's): results.json's ``run``.

    Attributes:
        resumed_images: images their restored states already held, added up.
        workers: the most processes any of them decoded images in (None: no pass ran, every feature was cached).
        images, seconds, loader_seconds: images they fed, their wall time and their wait for the loader, added up.
        processes: the most processes any of them ran in (torchrun's world size).
        earlier_parts, compile_fallback: as :class:`Results`'s, of every pass (the first fallback's reason)
    """

    resumed_images: int = 0
    workers: int | None = None
    images: int = 0
    seconds: float = 0.0
    loader_seconds: float = 0.0
    processes: int = 1
    earlier_parts: list[dict[str, Any]] = field(default_factory=list)
    compile_fallback: str | None = None

    def add(self, results: Results) -> None:
        self.resumed_images += int(results.resumed_images)
        self.workers = max(self.workers or 0, int(results.workers))
        self.images += int(results.num_images) - int(results.resumed_images)
        self.seconds += float(results.seconds)
        self.loader_seconds += float(results.loader_seconds)
        self.processes = max(self.processes, int(results.processes))
        self.earlier_parts += list(results.earlier_parts)
        self.compile_fallback = self.compile_fallback or results.compile_fallback

    def timing(self) -> dict[str, float] | None:
        """:func:`~vitscope.engine.results.pass_timing` of the passes together (None: none ran)."""
        return pass_timing(self.images, self.seconds, self.loader_seconds)


_TALLIES: ContextVar[tuple[PassTally, ...]] = ContextVar("vitscope_pass_tallies", default=())


@contextlib.contextmanager
def tally_passes() -> Iterator[PassTally]:
    """Count what every pass of :func:`run` finished inside the block did (nested blocks each count them).

    Yields:
        The :class:`PassTally`, filled as passes finish.
    """
    tally = PassTally()
    token = _TALLIES.set((*_TALLIES.get(), tally))
    try:
        yield tally
    finally:
        _TALLIES.reset(token)


def required_hook_names(backbone: Backbone, analyses: Sequence[Analysis]) -> list[str]:
    """Union of the hook names every analysis declares, resolved against the backbone (each analysis must be able
    to run on it: :func:`~vitscope.analyses.registry.refuse_what_cannot_run`)."""
    spec = backbone.spec
    names: list[str] = []
    for a in analyses:
        for n in expand_names(a.required_hooks(spec), backbone.hook_names(), spec.name):
            if n not in names:
                names.append(n)
    return names


def run(
    backbone: Backbone,
    data: Any,
    analyses: str | Sequence[Analysis | str],
    batch_size: int = 16,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    limit: int | None = None,
    strict: bool | None = None,
    progress: bool | None = None,
    checkpoint: Checkpoint | None = None,
    resume: str | Path | None = None,
    view: Any = None,
    distributed: bool = False,
    checkpoint_seconds: float = 60.0,
    log: Callable[[str], None] | None = None,
    workers: int | None = None,
    jpeg_draft: bool = False,
    compile_stats: bool = False,
) -> Results:
    """Make one pass over ``data`` and feed every batch to every analysis.

    Args:
        backbone: the model (moved to ``device``; in eval mode for the pass, then back in its own mode).
        data: a :class:`~vitscope.data.source.Source`, or anything :func:`vitscope.data.as_source` opens: a
            folder, ``ROOT::FORMAT``, a list of paths or of PIL images, a reader of ``load_dataset``.
        analyses: analysis instances, or registered names (``"attention_distance"``: its default
            configuration; one string may list several, comma-separated); each sees every batch once, from fresh
            state (an instance given again starts over).
        batch_size: images per forward pass.
        device: ``"cpu"``, ``"cuda"`` / ``"cuda:N"``, or None (cuda when there is one).
        dtype: None/``"fp32"`` or ``"bf16"``/``"fp16"`` autocast (recorded patterns stay float32).
        limit: use only the first ``limit`` images.
        strict: stop at the first unreadable image (default: the source's own setting, else skip it with a
            warning; skipped files are listed in the results).
        progress: force the progress bar on/off (default: a bar when stderr is a terminal, else a plain line
            every ``VITSCOPE_PROGRESS_SECONDS`` seconds).
        checkpoint: resumable state (:class:`~vitscope.engine.state.Checkpoint`): restored before the pass when
            it matches this run, saved while running and once at the end; Ctrl-C then stops after the batch in
            flight with the state saved.
        resume: a state file: the same as a checkpoint keyed by everything that decides the numbers (model
            weights, data fingerprint, analyses and their parameters, the file of an analysis from outside
            vitscope, limit, device, dtype, view): a re-run with the same arguments continues where an
            interrupted one stopped, whatever its batch size (no number depends on it at fp32; under autocast by
            the forward's half-precision rounding, docs/methods.md); anything else starts
            over. While edits are installed on the model (inside ``backbone.intervene``:
            :attr:`~vitscope.models.backbone.Backbone.active_edits`) no key can describe them, so the run neither
            resumes nor saves a state, and says so to ``log``.
        view: how images become model inputs (:mod:`vitscope.models.views`); None: the model's own
            preprocessing. Views group images by frame size, and tiled views stitch tiles into dense grids.
        distributed: share the pass with the other processes of the ``torch.distributed`` group (joined from
            ``torchrun``'s environment when not yet initialised): rank ``r`` of ``K`` reads the ``r``-th of ``K``
            contiguous parts of the positions, every analysis's state is merged over the ranks at the end, and
            every rank returns the results of the whole pass. Off by default, so one rank of your own DDP job
            can call ``run`` alone. The progress bar shows on rank 0; a checkpoint is kept per rank (keyed by
            rank and process count).
        checkpoint_seconds: with ``resume``, the least seconds between two saves of the state.
        log: receives one-line messages (resumed from..., ignored a state file..., a pass whose loader was the
            bottleneck).
        workers: processes that decode and preprocess the images, several batches ahead (0: a thread of this
            process; None: :func:`~vitscope.engine.settings.loader_workers` chooses from the CPUs). No number
            depends on it; ``Results.workers`` says what ran.
        jpeg_draft: decode JPEGs at libjpeg's reduced DCT scales (1/2, 1/4, 1/8) down to the size the model's resize
            needs: faster on large images, with slightly different pixels, so off by default; recorded in the
            data entry (``"decode"``) and the state file's key.
        compile_stats: compute the attention analyses' shared per-block statistics through ``torch.compile``
            (:func:`~vitscope.functional.attention_blocks.block_statistics`): their steps fuse into a few passes
            over each pattern, several times faster on a GPU and on CPUs, after one compilation per process (tens
            of seconds); the statistics differ from the default's by float32 rounding, so it is off by default,
            part of the state file's key and ``Results.compile_stats``. Where compiling fails it warns and runs
            op by op.

    Returns:
        :class:`Results` mapping each analysis's ``name`` to its Result.

    Raises:
        ValueError: bad arguments, an analysis the model cannot support, or one that reads the input pixels under
            a view that gives none (tiled).
        DegenerateDataError: data an analysis cannot score (k-NN on one class, saliency without masks...), before
            the pass.
        EmptyRunError: no readable image.
    """
    if batch_size < 1:
        raise VitscopeValueError("batch_size must be at least 1")
    if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 1):
        raise VitscopeValueError(f"limit must be a whole number of images, at least 1 (or None: every image), got "
                                 f"{limit!r}")
    if isinstance(analyses, str):  # one name (or a comma list), not a sequence of one-letter names
        analyses = [n.strip() for n in analyses.split(",") if n.strip()]
    given = list(analyses)
    analyses = [get_analysis(a) if isinstance(a, str) else a for a in given]
    names = [a.name for a in analyses]
    if len(set(names)) != len(names):
        raise VitscopeValueError(f"two analyses share a name ({', '.join(names)}); give each a distinct name")
    source: Source = data if isinstance(data, Source) else as_source(data, strict=bool(strict))
    strict = bool(strict) if strict is not None else bool(getattr(source, "strict", False))
    dev = resolve_device(device)
    shard = shard_for(distributed, dev.type)
    if shard.world > 1:
        if dev.type == "cuda":
            dev = torch.device("cuda", shard.gpu)  # one GPU per process (shared when there are fewer)
        progress = progress if shard.rank == 0 else False
    amp = resolve_dtype(dtype)
    backbone.to(dev)  # in eval mode for the pass alone (inference_pass)
    # what the batches will carry (the engine loads regions on request): refused now, not after a pass
    refuse_what_the_view_cannot_feed(analyses, view)
    refuse_what_cannot_run(analyses, backbone.spec, DataFacts(source, source.target_keys() | {"regions"}, limit))
    hooks = required_hook_names(backbone, analyses)
    total = len(source) if limit is None else min(limit, len(source))
    described = data_entry(source, jpeg_draft)
    if checkpoint is None and resume is not None and backbone.active_edits:
        if log is not None and shard.rank == 0:  # edit functions have no fingerprint: no key could tell edits apart
            log(f"not resuming from or saving {resume}: edits are installed on {backbone.spec.name} "
                "(backbone.intervene), which a state file's key cannot describe; the pass runs whole")
    elif checkpoint is None and resume is not None:
        drafted = {"decode": described["decode"]} if jpeg_draft else {}  # keys of full decodes stay as they were
        compiled = {"compile_stats": True} if compile_stats else {}  # likewise: keys of op-by-op runs unchanged
        # the model's own preprocessing is the standard view's: their keys stay as they were
        viewed = {"view": view.describe(backbone.spec)} if view is not None and type(view) is not StandardView \
            else {}
        checkpoint = run_checkpoint(resume, backbone, described["fingerprint"], analyses,
                                    every_seconds=checkpoint_seconds, log=log, limit=limit, strict=strict,
                                    device=dev.type, dtype=dtype_name(dtype), **drafted, **compiled, **viewed)
    if checkpoint is not None:
        checkpoint.for_rank(shard.rank, shard.world)
    with decoding(backbone, jpeg_draft, view):
        _hand_references(backbone, source, analyses, batch_size, dev, amp, strict, limit, view)
        with _rows_beside(checkpoint):  # spilled rows on the state file's disk: saving links them
            try:
                ran = _pass(backbone, source, analyses, checkpoint, shard, dev, amp, batch_size, limit, strict,
                            progress, view, hooks, total, described, workers, log, bool(compile_stats))
            except BaseException:  # a failed pass's rows go now, not at exit (the saved state links its own)
                for a in analyses:
                    a.release_rows()
                raise
    for a in (a for a, g in zip(analyses, given) if isinstance(g, str)):  # nothing else holds what run made
        a.release_rows()
    return ran


def _hand_references(backbone: Backbone, source: Source, analyses: Sequence[Analysis], batch_size: int,
                     device: torch.device, dtype: torch.dtype | None, strict: bool, limit: int | None,
                     view: Any = None) -> None:
    """Record what analyses need of a reference set (:meth:`Analysis.reference_hooks`) on the first images of the
    data (within the run's ``limit``), before the pass, and hand it to them: the same images in every process and
    on every resume, made into model inputs by the pass's ``view``."""
    wanted = {a: a.reference_hooks(backbone.spec) for a in analyses}
    hooks = list(dict.fromkeys(h for names in wanted.values() for h in names))
    if not hooks:
        return
    from vitscope.analyses.activations.hook_tensors import HookTensors

    images = max(int(a.reference_images) for a, names in wanted.items() if names)
    images = images if limit is None else min(images, int(limit))
    kept = run(backbone, source, [HookTensors(hooks)], batch_size=batch_size, device=device, dtype=dtype,
               limit=images, strict=strict, progress=False, workers=0, view=view)["hook_tensors"].tensors
    for a, names in wanted.items():
        if names:
            a.set_reference({n: t for n, t in kept.items() if any(fnmatch.fnmatchcase(n, p) for p in names)})


def loader_preprocessing(backbone: Backbone) -> Callable[[list[Any]], Any]:
    """What the loader does to a batch of images: the model's resize and crop to uint8 pixels (a quarter of the
    bytes to send from a worker and to a GPU), normalised on the device
    (:meth:`~vitscope.engine.batch_forward.BatchForward.batches`); images that keep their aspect ratio
    (``spec.max_tokens``) come in groups of one input size (:func:`pixel_groups`); a backbone with preprocessing
    of its own gets it whole in the loader."""
    if type(backbone).preprocess is not Backbone.preprocess:
        return backbone.preprocess
    if backbone.spec.max_tokens:
        return functools.partial(pixel_groups, spec=backbone.spec)
    return functools.partial(resized_pixels, spec=backbone.spec)


def _rows_beside(checkpoint: Checkpoint | None) -> contextlib.AbstractContextManager:
    """Row stores spill beside the state file while a resumable run goes on (a plain context otherwise)."""
    return contextlib.nullcontext() if checkpoint is None else checkpoint.rows_beside()


def _image_work(spec: ModelSpec, analyses: Sequence[Analysis],
                shared: Mapping[str, frozenset[str]]) -> dict[str, Callable[[Any], Any]]:
    """Per-image work on the preprocessed images for the loader: the planned shared quantities' own part (the
    SIFT keypoints) and every analysis's :meth:`~vitscope.analyses.base.Analysis.image_transforms`."""
    work = loader_work(shared, spec)
    for a in analyses:
        work.update(a.image_transforms(spec))
    return work


def _pass(backbone: Backbone, source: Source, analyses: list[Analysis], checkpoint: Checkpoint | None,
          shard: Any, dev: torch.device, amp: torch.dtype | None, batch_size: int, limit: int | None, strict: bool,
          progress: bool | None, view: Any, hooks: list[str], total: int, described: dict[str, Any],
          workers: int | None, say: Callable[[str], None] | None, compile_stats: bool) -> Results:
    """The pass of :func:`run` over its checked arguments."""
    if type(view) is StandardView:  # the model's own preprocessing, the same pixels: done where images decode
        view = None
    log = SkipLog()
    start, seen, grids = restore_or_reset(checkpoint, analyses, log)
    autocast = torch.autocast(dev.type, dtype=amp) if amp is not None else contextlib.nullcontext()
    preprocess = loader_preprocessing(backbone) if view is None else None
    transforms = {k: v for a in analyses for k, v in a.target_transforms(backbone.spec).items()} if view is None \
        else None
    regions = any("regions" in getattr(a, "required_targets", ()) for a in analyses) or any(
        given == "regions" for given, _ in (transforms or {}).values())
    shared = union_plan([a.shared_quantities(backbone.spec) for a in analyses])
    images = _image_work(backbone.spec, analyses, shared) if view is None else None
    workspace = Workspace()  # work buffers of this run, freed with it
    plan = stream_plan(backbone, analyses, hooks)
    warn_if_patterns_do_not_fit(backbone, plan, batch_size, dev)
    with progress_bar(progress) as bar, inference_pass(backbone.model), backbone.record(hooks) as rec, \
            interrupt_guard(checkpoint is not None) as guard, watch_fallbacks() as op_by_op:
        part = shard_range(total, shard.rank, shard.world)  # what this process reads
        task = bar.add_task(f"{backbone.spec.name}", total=len(part), completed=max(start - part.start, 0),
                            unit="images")
        current = BatchForward(backbone, rec, dev, autocast, shared, workspace, view, plan, compile_stats, grids)
        remaining = len(part) - max(start - part.start, 0)
        chosen = workers_used(loader_workers(workers, remaining, int(os.environ.get("LOCAL_WORLD_SIZE", shard.world))),
                              -(-remaining // batch_size))  # what runs: Results.workers and the loader's note say it
        if checkpoint is not None:  # saved with the state: a resumed run says how its earlier parts read
            checkpoint.settings = {"batch_size": int(batch_size), "workers": chosen}
        clock = LoaderClock(iter_batches(source, batch_size, limit, start, strict, log, regions, preprocess,
                                         (shard.rank, shard.world), transforms, chosen, dev.type == "cuda",
                                         images))
        try:
            for end, loaded in clock:
                if loaded is not None:
                    for record, batch in current.batches(loaded):
                        for a in analyses:
                            a.update(record, batch)
                            a.end_batch()
                    seen += len(loaded.indices)
                    rec.clear()
                if checkpoint is not None:
                    checkpoint.after_batch(analyses, end, seen, log.skipped, guard.requested,
                                           grid_counts(current.grids))
                bar.update(task, completed=end - part.start)  # after the batch: rate and time left count work done
        finally:
            clock.close()  # the loading thread or worker processes stop with the pass, however it ends
        seconds, waited = clock.elapsed, clock.waited
    note = loader_bound_note(clock.wait_fraction, seconds, chosen)
    if note and say is not None and shard.rank == 0:
        say(note)
    if checkpoint is not None and start < total:
        checkpoint.save(analyses, total, seen, log.skipped, grid_counts(current.grids))  # a finished pass is kept
    workspace.release()
    resumed, earlier = (checkpoint.resumed_images, list(checkpoint.earlier_parts)) if checkpoint else (0, [])
    skipped = list(log.skipped)
    for a in analyses:
        a.states_to_host()  # sums kept on the GPU during the pass come home once
    if shard.world > 1:  # every rank ends with the state of the whole pass
        with collectives(shard):
            exchange = exchange_folder()  # row stores travel as shard files, never through the group
            for a in analyses:
                a.sync(exchange=exchange)
            seen, resumed = sum_over_ranks(seen, shard), sum_over_ranks(resumed, shard)
            # the pass ends with its slowest process (after a resume one process may have had nothing left to read)
            seconds, waited = max(gather_lists([(seconds, waited)], shard))
            earlier = parts_over_ranks(earlier, shard)
            current.grids = _grids_over_ranks(current.grids, shard)
            skipped = sorted(gather_lists(skipped, shard), key=lambda s: s.path)
    if seen == 0:
        raise EmptyRunError(f"no readable image among {total} files ({len(skipped)} skipped)")
    results = {a.name: a.result() for a in analyses}
    if shard.world > 1:
        with collectives(shard):
            barrier()  # every process has read the shared row shards before rank 0 may remove them at exit
    fell_back = "; ".join(f"{name} ({why})" for name, why in op_by_op.items()) if compile_stats else ""
    ran = Results(results, seen, skipped, hooks, described, resumed, chosen, grid_counts(current.grids),
                  compile_stats and not fell_back, seconds, waited, shard.world, earlier, fell_back or None)
    for tally in _TALLIES.get():
        tally.add(ran)
    return ran


def _grids_over_ranks(grids: dict[tuple[int, int], int], shard: Any) -> dict[tuple[int, int], int]:
    """The grids of every rank's images, added up."""
    merged: dict[tuple[int, int], int] = {}
    for grid, n in gather_lists([(tuple(g), n) for g, n in grids.items()], shard):
        merged[grid] = merged.get(grid, 0) + n
    return merged
