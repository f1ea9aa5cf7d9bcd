"""One sweep over every block and every downstream probe of a model (paper 002 section 6, tables 1 and 5).

``probe_sweep`` extracts each dataset's features once (all blocks, every pooling the probes need, one
forward pass per image, cached on disk; with ``tiling`` a second, tiled pass feeds the spatial-mean probes)
and runs every probe the given data allows; ``best_block_table``
(:mod:`vitscope.analyses.probes.result`) then gives the best block per model and task, and
``vitscope.viz.probe_figures.models_probe_curves`` draws the per-block curves of several models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vitscope.analyses.attention.base import has_cls_token
from vitscope.analyses.probes.clustering import clustering_probe
from vitscope.analyses.probes.knn import knn_probe
from vitscope.analyses.probes.linear import linear_probe
from vitscope.analyses.probes.result import ProbeResult
from vitscope.cache.feature_cache import CacheEntry, FeatureCache, held_entries
from vitscope.cache.request import FeatureRequest
from vitscope.data.annotated_source import AnnotatedSource
from vitscope.data.fingerprint import held_fingerprints
from vitscope.data.open import as_source
from vitscope.downstream.checks import class_keys, require_blocks, tiling_scale, train_numbered_labels
from vitscope.downstream.davis import davis_probe
from vitscope.downstream.keypoints import keypoint_probe
from vitscope.downstream.retrieval import retrieval_probe
from vitscope.engine.extract import extract_features
from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.models.views import StandardView, TiledView, View

__all__ = ["probe_sweep"]


@held_fingerprints()  # every pass of the command stats the files once
@held_entries()  # a probe reads the entries of several extractions (train and test) together
def probe_sweep(
    backbone: Backbone,
    cache: FeatureCache | None = None,
    train=None,
    test=None,
    clustering=None,
    regions=None,
    retrieval=None,
    davis=None,
    spair=None,
    tokens: Sequence[str] = ("cls", "spatial_mean"),
    batch_norm: Sequence[bool] = (False, True),
    site: str = "resid_post",
    tiling: bool | float = False,
    blocks: Sequence[int] | None = None,
    seed: int = 0,
    random_kind: str | None = "uniform",
    batch_size: int = 32,
    device: str | None = None,
    dtype: str | None = None,
    distributed: bool = False,
    log: Callable[[str], None] | None = None,
    davis_void: str = "background",
    strict: bool = False,
    resume: bool = True,
    checkpoint_seconds: float = 60.0,
    workers: int | None = None,
    jpeg_draft: bool = False,
) -> dict[str, ProbeResult]:
    """Every probe the given data allows, at every block, each with its random-chance score.

    Args:
        backbone: the model (a transformer: the probes read ``blocks.{i}.<site>``).
        cache: feature cache (default location if None); a second sweep with unchanged model, data and
            settings runs no forward pass.
        train, test: labelled image sets (format readers with labels, e.g. imagefolder, or labelled
            ``ImageFiles`` with labels) for k-NN and the linear probe (``knn_<tokens>``, ``linear_<tokens>`` and
            ``linear_<tokens>_bn``).
        clustering: labelled image set for image-level clustering (``clustering_<tokens>``); default: ``test``.
        regions: dataset with instance or part masks (coco, partimagenet) for region-level clustering
            (``clustering_regions``).
        retrieval: revisited Oxford / Paris dataset (``retrieval``); davis: DAVIS dataset (``davis``);
            spair: SPair dataset (``keypoints``).
        tokens: image-level poolings to probe (``"cls"``, ``"spatial_mean"``).
        batch_norm: linear-probe variants (without and with batch norm).
        site: block site.
        tiling: dense features by tiling (appendix B.4) for every spatial-feature probe: regions, DAVIS, SPair
            and the ``spatial_mean`` image-level probes (CLS probes keep the model's preprocessing: tiles have
            no common CLS). True = the paper's scale 2, a number >= 1 = that scale, False = none. Retrieval
            ranks CLS features and refuses tiling.
        blocks: blocks to probe (negative counts from the end; default every block).
        seed: seed of the probes and of the random baselines (SPair pair sampling keeps the code's 42).
        random_kind: ``"uniform"``, ``"gaussian"`` or None.
        batch_size, device, dtype: extraction settings.
        distributed: share the extraction with the processes of the ``torch.distributed`` group (every process
            returns the same result; the feature cache folder must be one they all see).
        log: receives one-line messages (an extraction that resumes says so).
        davis_void: DAVIS void pixels: ``"background"`` (official) or ``"ignore"`` (:func:`davis_probe`).
        strict, resume, checkpoint_seconds: how the extraction pass treats unreadable images and saved state
        workers: processes that decode the images of the labelled, regions and retrieval passes (DAVIS and SPair
            make one short pass per sequence or pair set, decoded in a thread)
            (:func:`~vitscope.engine.extract.extract_features`).
        jpeg_draft: decode JPEGs at reduced DCT scales (:func:`vitscope.run`) in the labelled, clustering and
            regions passes; the retrieval, DAVIS and SPair probes (frames resized their own way) and tiles refuse it.

    Returns:
        ``{task name: ProbeResult}``, each result named by its task name.

    Raises:
        ValueError: a CNN backbone, only one of train / test, retrieval with tiling, a bad tiling scale.
    """
    require_blocks(backbone, "per-block")
    scale = tiling_scale(tiling)
    if retrieval is not None and scale:
        raise VitscopeValueError("retrieval ranks CLS features (docs/methods.md, Probes per block), which tiles do not "
                                 "have; run the retrieval probe without tiling")
    out: dict[str, ProbeResult] = {}
    name = backbone.spec.name
    common = {"batch_size": batch_size, "device": device, "dtype": dtype, "distributed": distributed, "log": log,
              "strict": strict, "resume": resume, "checkpoint_seconds": checkpoint_seconds}
    if jpeg_draft and (retrieval is not None or davis is not None or spair is not None):
        raise VitscopeValueError("jpeg_draft follows the model's own resize, but the retrieval, DAVIS and SPair probes "
                                 "resize frames their own way; run them without it")
    chosen = None if blocks is None else tuple(blocks)
    if "cls" in tokens and not has_cls_token(backbone.spec):  # I-JEPA, AIMv2, SigLIP: the spatial mean stands in
        tokens = [t for t in tokens if t != "cls"] or ["spatial_mean"]
        if log:
            log(f"{name} has no CLS token: probing the mean of its spatial tokens")
    requests = [FeatureRequest(site, t, chosen) for t in tokens]

    def view_of(request: FeatureRequest) -> View:
        return TiledView(scale=scale) if scale and request.pooling != "cls" else StandardView()

    def entries(data):
        """One extraction per view (at most two passes: standard for CLS, tiled for the spatial mean)."""
        source, found = as_source(data), {}
        for view in dict.fromkeys(view_of(r) for r in requests):
            mine = [r for r in requests if view_of(r) == view]
            found.update(extract_features(backbone, source, mine, cache, view, workers=workers, jpeg_draft=jpeg_draft,
                                          **common))
        return source, found

    def tag(result: ProbeResult, request: FeatureRequest, *used: CacheEntry) -> ProbeResult:
        """The result with its view and the token grids of the images its features came from."""
        result.meta["view"] = view_of(request).name
        grids: dict[str, int] = {}
        for entry in used:
            for grid, n in entry.meta.get("grids", {}).items():
                grids[grid] = grids.get(grid, 0) + int(n)
        if grids:
            result.meta["grids"] = dict(sorted(grids.items(), key=lambda kv: -kv[1]))
        return result

    if (train is None) != (test is None):
        raise VitscopeValueError("k-NN and linear probes need both a train and a test set")
    if train is not None:
        src_tr, src_te = as_source(train), as_source(test)
        y_tr = src_tr.labels()  # before any pass: test classes the train data lacks are refused at once
        y_te = train_numbered_labels(src_te.labels(), class_keys(src_tr), class_keys(src_te))
        (_, e_tr), (_, e_te) = entries(src_tr), entries(src_te)
        for r in requests:
            out[f"knn_{r.pooling}"] = tag(knn_probe(e_tr[r], y_tr, e_te[r], y_te, seed=seed, random_kind=random_kind,
                                                    model=name), r, e_tr[r], e_te[r])
            for bn in batch_norm:
                out[f"linear_{r.pooling}" + ("_bn" if bn else "")] = tag(linear_probe(
                    e_tr[r], y_tr, e_te[r], y_te, batch_norm=bn, seed=seed, random_kind=random_kind, model=name), r,
                    e_tr[r], e_te[r])
    clustering = clustering if clustering is not None else test
    if clustering is not None:
        src, found = entries(clustering)
        labels = src.labels()
        for r in requests:
            entry = found[r]
            out[f"clustering_{r.pooling}"] = tag(clustering_probe(entry, labels[entry.index], seed=seed,
                                                                  random_kind=random_kind, model=name), r, entry)
    if regions is not None:
        request = FeatureRequest(site, "mask", chosen)
        view = TiledView(scale=scale) if scale else StandardView()
        entry = extract_features(backbone, AnnotatedSource(regions), [request], cache, view, workers=workers,
                                 jpeg_draft=jpeg_draft, **common)[request]
        out["clustering_regions"] = tag(clustering_probe(entry, seed=seed, random_kind=random_kind, model=name),
                                        request, entry)
    if retrieval is not None:
        pooling = "cls" if has_cls_token(backbone.spec) else "spatial_mean"  # as the requests above
        out["retrieval"] = retrieval_probe(backbone, retrieval, cache, pooling=pooling, site=site, blocks=chosen,
                                           seed=seed, random_kind=random_kind, workers=workers, **common)
    if davis is not None:
        out["davis"] = davis_probe(backbone, davis, cache, site=site, blocks=chosen, tiling=scale or False,
                                   seed=seed, random_kind=random_kind, void=davis_void, **common)
    if spair is not None:
        out["keypoints"] = keypoint_probe(backbone, spair, cache, site=site, blocks=chosen, tiling=scale or False,
                                          random_kind=random_kind, **common)
    for task, result in out.items():  # each result writes files named by it: knn_cls and knn_spatial_mean
        result.name = task            # must not both write knn_probe_accuracy.json
    return out
