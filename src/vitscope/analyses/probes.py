"""One sweep over every block and every downstream probe of a model (paper 002 section 6, tables 1 and 5).

``probe_sweep`` extracts each dataset's features once (all blocks, every pooling the probes need, one
forward pass per image, cached on disk) and runs every probe the given data allows; ``best_block_table``
(:mod:`vitscope.analyses.probe_result`) then gives the best block per model and task, and
``vitscope.viz.probe_figures.compare_models`` draws the per-block curves of several models.
"""

from __future__ import annotations

from collections.abc import Sequence

from vitscope.analyses.clustering import clustering_probe
from vitscope.analyses.probe_davis import davis_probe
from vitscope.analyses.probe_keypoints import keypoint_probe
from vitscope.analyses.probe_knn import knn_probe
from vitscope.analyses.probe_linear import linear_probe
from vitscope.analyses.probe_result import ProbeResult
from vitscope.analyses.probe_retrieval import retrieval_probe
from vitscope.features.cache import FeatureCache
from vitscope.features.extract import FeatureRequest, extract_features
from vitscope.features.sources import DatasetSource, as_source
from vitscope.features.views import StandardView, TiledView
from vitscope.models.backbone import Backbone

__all__ = ["probe_sweep"]


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
    tiling: bool = False,
    seed: int = 0,
    random_kind: str | None = "uniform",
    batch_size: int = 32,
    device: str | None = None,
    dtype: str | None = None,
) -> dict[str, ProbeResult]:
    """Every probe the given data allows, at every block, each with its random-chance score.

    Args:
        backbone: the model.
        cache: feature cache (default location if None); a second sweep with unchanged model, data and
            settings runs no forward pass.
        train, test: labelled image sets (format readers with labels, e.g. imagefolder) for k-NN and the
            linear probe (``knn_<tokens>``, ``linear_<tokens>`` and ``linear_<tokens>_bn``).
        clustering: labelled image set for image-level clustering (``clustering_<tokens>``); default: ``test``.
        regions: dataset with instance or part masks (coco, partimagenet) for region-level clustering
            (``clustering_regions``; tiled dense features when ``tiling``).
        retrieval: revisited Oxford / Paris dataset (``retrieval``); davis: DAVIS dataset (``davis``);
            spair: SPair dataset (``keypoints``).
        tokens: image-level poolings to probe (``"cls"``, ``"spatial_mean"``).
        batch_norm: linear-probe variants (without and with batch norm).
        site: block site; tiling: dense tiled features for the spatial tasks (regions, DAVIS, SPair).
        seed: seed of the probes and of the random baselines (SPair pair sampling keeps the code's 42).
        random_kind: ``"uniform"``, ``"gaussian"`` or None.
        batch_size, device, dtype: extraction settings.

    Returns:
        ``{task name: ProbeResult}``.
    """
    out: dict[str, ProbeResult] = {}
    name = backbone.spec.name
    common = {"batch_size": batch_size, "device": device, "dtype": dtype}
    requests = [FeatureRequest(site, t) for t in tokens]

    def entries(data):
        source = as_source(data)
        return source, extract_features(backbone, source, requests, cache, StandardView(), **common)

    if (train is None) != (test is None):
        raise ValueError("k-NN and linear probes need both a train and a test set")
    if train is not None:
        (src_tr, e_tr), (src_te, e_te) = entries(train), entries(test)
        y_tr, y_te = src_tr.labels(), src_te.labels()
        for r in requests:
            out[f"knn_{r.pooling}"] = knn_probe(e_tr[r], y_tr, e_te[r], y_te, seed=seed, random_kind=random_kind,
                                                model=name)
            for bn in batch_norm:
                out[f"linear_{r.pooling}" + ("_bn" if bn else "")] = linear_probe(
                    e_tr[r], y_tr, e_te[r], y_te, batch_norm=bn, seed=seed, random_kind=random_kind, model=name)
    clustering = clustering if clustering is not None else test
    if clustering is not None:
        src, found = entries(clustering)
        labels = src.labels()
        for r in requests:
            entry = found[r]
            out[f"clustering_{r.pooling}"] = clustering_probe(entry, labels[entry.index], seed=seed,
                                                              random_kind=random_kind, model=name)
    if regions is not None:
        request = FeatureRequest(site, "mask")
        view = TiledView() if tiling else StandardView()
        entry = extract_features(backbone, DatasetSource(regions), [request], cache, view, **common)[request]
        out["clustering_regions"] = clustering_probe(entry, seed=seed, random_kind=random_kind, model=name)
    if retrieval is not None:
        out["retrieval"] = retrieval_probe(backbone, retrieval, cache, site=site, seed=seed, random_kind=random_kind,
                                           **common)
    if davis is not None:
        out["davis"] = davis_probe(backbone, davis, cache, site=site, tiling=tiling, seed=seed,
                                   random_kind=random_kind, **common)
    if spair is not None:
        out["keypoints"] = keypoint_probe(backbone, spair, cache, site=site, tiling=tiling, random_kind=random_kind,
                                          **common)
    return out
