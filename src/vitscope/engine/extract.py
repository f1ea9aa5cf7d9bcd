"""Extract per-block features once and keep them in the feature cache.

``extract_features(backbone, source, requests, cache)`` serves every request from the cache when its key
is there (no forward pass at all); the requests that miss share **one** pass of :func:`vitscope.run` (the only
loop over images) with any analyses riding along: :class:`FeatureRows` records the hooks of all of them
together and pools every block's tokens in every requested way. Rows are streamed into
:class:`~vitscope.cache.rowstore.RowStore` tables in the pass's working folder (resumable: a killed pass
continues) and committed to the cache sorted by image position, so memory stays bounded. Under
``torch.distributed`` every process writes its own rows and rank 0 commits them as one entry.
"""

from __future__ import annotations

import shutil
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from vitscope.cache.feature_cache import CacheEntry, FeatureCache
from vitscope.cache.request import FeatureRequest
from vitscope.data.fingerprint import held_fingerprints
from vitscope.data.open import as_source
from vitscope.engine.distributed import barrier, collectives, shard_for
from vitscope.engine.feature_rows import FeatureRows
from vitscope.engine.results import EmptyRunError
from vitscope.engine.run import resolve_device, resolve_dtype, run
from vitscope.engine.state import Checkpoint
from vitscope.errors import VitscopeRuntimeError, VitscopeValueError
from vitscope.hooks.edits import Edits
from vitscope.models.backbone import Backbone
from vitscope.models.digest import CACHE_FORMAT, digest, model_fingerprint
from vitscope.models.views import StandardView, TiledView, View

try:
    import fcntl
except ImportError:  # no advisory file locks (Windows): passes stay resumable, unguarded
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:  # annotations only
    from vitscope.analyses.base import Analysis
    from vitscope.data.source import Source

__all__ = ["extract_features"]

def _key(model_fp: str, data_digest: str, view: View, request: FeatureRequest, backbone: Backbone,
         amp: torch.dtype | None) -> str:
    return digest({
        "format": CACHE_FORMAT, "model": model_fp, "view": view.describe(backbone.spec), "data": data_digest,
        "request": asdict(request), "blocks": request.block_list(backbone.spec.num_blocks), "autocast": str(amp),
    })


def _working_folder(cache: FeatureCache, name: str | None, shard: Any, log: Callable[[str], None] | None
                    ) -> tuple[Path, bool, IO[bytes] | None]:
    """The pass's working folder, whether the pass is resumable there, and the lock rank 0 holds on it.

    A resumable pass works in ``<cache>/tmp/<name>`` while it holds that folder's lock (rank 0 takes it for the
    whole process group). When another run holds it (two jobs extracting the same features into one cache),
    this one works in a folder of its own and is not resumable, rather than mixing its rows with the other's.
    """
    private = cache.root / "tmp" / f"pass-{uuid.uuid4().hex}"
    chosen: list[Any] = [str(private), False]
    lock = None
    if name is not None and shard.rank == 0:
        folder = cache.root / "tmp" / name
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "wb")  # noqa: SIM115 (held until the pass is committed)
        try:
            if fcntl is not None:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            chosen = [str(folder), True]
        except OSError:
            lock.close()
            lock = None
            if log:
                log(f"another run is extracting the same features into {folder}; this one keeps its rows apart "
                    "(it cannot be resumed)")
    if shard.world > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(chosen, src=0)
    return Path(chosen[0]), bool(chosen[1]), lock

# intervention -> {shared cache root: the intervention's own cache under it}; an entry goes with its intervention
_EDITED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _edited_cache(cache: FeatureCache, edits: Edits, shard: Any, log: Callable[[str], None] | None) -> FeatureCache:
    """A cache of the open intervention's own, in ``<cache>/tmp/edited-*``, deleted when the intervention ends.

    Edits are functions and have no fingerprint: features computed under them must neither be served from the
    shared cache nor stored there under the unedited model's key. Calls within one intervention share this cache
    (DAVIS extracts each sequence in a call of its own).
    """
    mine = _EDITED.setdefault(edits, {})
    private = mine.get(cache.root)
    if private is not None:
        return private
    chosen = [str(cache.root / "tmp" / f"edited-{uuid.uuid4().hex}")]
    if shard.world > 1:  # every process reads the entries rank 0 commits there
        import torch.distributed as dist

        dist.broadcast_object_list(chosen, src=0)
    private = mine[cache.root] = FeatureCache(chosen[0])
    if shard.rank == 0:
        weakref.finalize(edits, shutil.rmtree, chosen[0], True)
        if log:
            log("the model runs under backbone.intervene(...): its features are extracted afresh and kept apart "
                "from the feature cache until the intervention ends")
    return private


@held_fingerprints()  # every pass of the command stats the files once
def extract_features(
    backbone: Backbone,
    source: Source | Any,
    requests: Sequence[FeatureRequest],
    cache: FeatureCache | None = None,
    view: View | None = None,
    batch_size: int = 32,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    analyses: Sequence[Analysis] = (),
    distributed: bool = False,
    progress: bool | None = None,
    checkpoint_seconds: float = 60.0,
    log: Callable[[str], None] | None = None,
    strict: bool | None = None,
    resume: bool = True,
    workers: int | None = None,
    jpeg_draft: bool = False,
) -> dict[FeatureRequest, CacheEntry]:
    """Cached per-block features of every image of ``source`` for each request.

    Args:
        backbone: the model.
        source: a :class:`~vitscope.data.source.Source`, or anything :func:`vitscope.data.as_source` opens.
        requests: what to keep; requests served by the cache cost nothing, the others share one pass.
        cache: where entries live (default: :class:`FeatureCache` at its default root).
        view: preprocessing and geometry (default :class:`StandardView`).
        batch_size: images per forward pass (tiled views run the tiles of one image together).
        device: ``"cpu"``, ``"cuda"``... (default: the best available).
        dtype: None/``"fp32"``, or ``"bf16"``/``"fp16"`` autocast (part of the key).
        analyses: analyses fed every batch of the same pass (e.g. a streaming ``BlockCKA`` next to cached
            final-block features); ``batch.targets`` holds the source's ground truth. With analyses the pass
            always runs (cached requests are still not recomputed). Not with :class:`TiledView`, whose stitched
            tokens are not the model's layout.
        distributed: share the pass with the processes of the ``torch.distributed`` group
            (:func:`vitscope.run`); each writes its rows, rank 0 commits the entries, and every process returns
            them (the cache folder must be one they all see).
        progress: show the pass's progress (rank 0 only; default: a bar when stderr is a terminal, else a line
            every ``VITSCOPE_PROGRESS_SECONDS``, as :func:`vitscope.run`).
        checkpoint_seconds: least time between two saves of the pass's state. Without riding analyses a pass
            is resumable: its rows go to disk shard by shard in ``<cache>/tmp/pass-<key>/`` and a killed
            pass restarted with the same requests continues where it stopped.
        log: receives one-line messages (resumed..., starting over..., a pass whose loader was the bottleneck).
        strict: stop at the first unreadable image (default: the source's own setting, else skip it).
        resume: continue an interrupted pass from its saved state; False runs the pass afresh, saving none (a
            saved state is left for the run that may own it).
        workers: processes that decode the images (:func:`vitscope.run`; None: chosen from the CPUs).
        jpeg_draft: decode JPEGs at reduced DCT scales (:func:`vitscope.run`; part of the key).

    Under :meth:`Backbone.intervene <vitscope.models.backbone.Backbone.intervene>` (edits have no fingerprint) the
    shared cache is neither read nor written: the features are extracted into a cache of the intervention's own,
    shared by the calls made inside it and deleted when it ends (``log`` says so once).

    Returns:
        ``{request: CacheEntry}``; each entry has ``index`` ``[rows]`` (image position), ``block{i}`` per
        kept block (float32), and for mask pooling ``label`` and ``region`` (mask number in its image).
        ``meta`` records the view, the request, the token ``grid`` / ``frame_hw`` / ``num_prefix`` of the
        first image (``"spatial"`` rows are ``[K, D]`` on that grid, row-major), and ``grids``: the images of every
        token grid (``"HxW"`` -> images; several when images keep their aspect ratio).

    Raises:
        ValueError: bad arguments, or no readable image.
    """
    if batch_size < 1:
        raise VitscopeValueError("batch_size must be at least 1")
    source = as_source(source)
    cache = cache if cache is not None else FeatureCache()
    view = view if view is not None else StandardView()
    edits = backbone.active_edits
    if edits:  # the innermost intervention ends first: its cache goes with it
        cache = _edited_cache(cache, edits[-1], shard_for(distributed, resolve_device(device).type), log)
    spec = backbone.spec
    amp = resolve_dtype(dtype)
    model_fp = model_fingerprint(backbone)
    data_digest = source.fingerprint()["digest"] + (":jpeg_draft" if jpeg_draft else "")
    keys = {r: _key(model_fp, data_digest, view, r, backbone, amp) for r in dict.fromkeys(requests)}
    found = {r: cache.get(k) for r, k in keys.items()}
    missing = [r for r, e in found.items() if e is None]
    if not missing and not analyses:
        return found  # type: ignore[return-value]
    if analyses and isinstance(view, TiledView):
        raise VitscopeValueError("analyses cannot ride on a tiled view: stitched tokens are not the model's token "
                                 "layout")
    shard = shard_for(distributed, resolve_device(device).type)
    # the pass's working folder, keyed by what it computes: a killed pass restarted with the same request finds
    # its state there (rows are committed to disk shard by shard as it goes, the state file names them)
    pass_key = digest({"entries": [keys[r] for r in missing]})  # rows do not depend on the batch size
    # analyses riding along are not keyed here, nor are edits (their folder goes with the intervention)
    resumable_name = f"pass-{pass_key}" if resume and not analyses and not edits else None
    work, resumable, lock = _working_folder(cache, resumable_name, shard, log)
    try:  # the lock goes with the pass, also when it is interrupted (a re-run in this process then resumes)
        rows_folder = work / f"rows-rank{shard.rank}-of-{shard.world}"
        rows = FeatureRows(missing, view, workdir=rows_folder)
        key = {"pass": pass_key, "format": CACHE_FORMAT, **({"strict": True} if strict else {})}  # as a run's key
        checkpoint = Checkpoint(work / "state.pt", key, every_seconds=checkpoint_seconds, log=log) if resumable \
            else None
        try:
            ran = run(backbone, source, [rows, *analyses], batch_size=batch_size, device=device, dtype=dtype,
                      strict=strict, progress=progress, view=view, checkpoint=checkpoint, distributed=distributed,
                      workers=workers, jpeg_draft=jpeg_draft, log=log)
        except EmptyRunError:
            shutil.rmtree(work, ignore_errors=True)
            raise VitscopeValueError(f"no readable image in {source.name} ({len(source)} files): nothing to "
                                     "extract") from None
        except BaseException:  # a pass that cannot resume leaves no rows behind (a resumable one keeps them)
            if not resumable:
                shutil.rmtree(work, ignore_errors=True)
            elif checkpoint is not None and not checkpoint.path.exists():  # failed before its first save: no
                shutil.rmtree(rows_folder, ignore_errors=True)  # state names these rows, and a retry adds its own
                if shard.rank == 0 and {p.name for p in work.iterdir()} <= {".lock"}:
                    shutil.rmtree(work, ignore_errors=True)
            raise
        meta_base = {"model": spec.name, "view": view.describe(spec), "data": source.name, **rows.layout,
                     "grids": ran.grids}
        if shard.rank == 0:  # one process publishes; every process then reads the same entries
            for k, r in enumerate(missing):
                meta = {**meta_base, "request": asdict(r), "blocks": r.block_list(spec.num_blocks)}
                found[r] = cache.commit(keys[r], rows.store(k), meta, evict=False)
            cache.evict(keep=set(keys.values()))  # after the last commit: no entry this call returns goes
        if shard.world > 1:
            with collectives(shard):
                barrier()
            found.update({r: cache.get(keys[r]) for r in missing})
            if any(found[r] is None for r in missing):
                raise VitscopeRuntimeError(f"process {shard.rank} cannot see the feature cache rank 0 wrote at "
                                           f"{cache.root}; processes on several machines need a cache folder on a file "
                                           "system they share")
            with collectives(shard):
                barrier()  # every process has its entries before the working folder goes
        if shard.rank == 0:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        if lock is not None:
            lock.close()
    return found  # type: ignore[return-value]
