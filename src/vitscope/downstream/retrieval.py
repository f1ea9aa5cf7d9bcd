"""Image retrieval per block on revisited Oxford / Paris (paper 002 figure 9 right, figure 29, table 1).

docs/methods.md, Probes per block "Retrieval": CLS features of the block output; images reduced so the long side is
the model input, then the model's resize and centre crop (:class:`LongSideView`); no query-box crop;
ranking by cosine similarity; mAP with the revisited protocol (Easy, Medium, Hard;
:func:`vitscope.functional.revisited_map`). Random chance: the same ranking of U(0, 1) features.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from vitscope.analyses.probes.result import ProbeResult, probe_result
from vitscope.cache.feature_cache import CacheEntry, FeatureCache
from vitscope.cache.request import FeatureRequest
from vitscope.data.annotated_source import AnnotatedSource
from vitscope.downstream.checks import require_blocks
from vitscope.engine.extract import extract_features
from vitscope.errors import VitscopeValueError
from vitscope.functional.pooling import random_features
from vitscope.functional.retrieval_scores import revisited_map
from vitscope.models.backbone import Backbone
from vitscope.models.views import LongSideView
from vitscope.strict_json import note_null

__all__ = ["retrieval_probe", "retrieval_scores"]

PROTOCOLS = ("medium", "hard", "easy")  # medium first: the paper's headline number


def _maps(queries: np.ndarray, database: np.ndarray, gnd: Sequence[object]) -> dict[str, float]:
    q = F.normalize(torch.as_tensor(np.array(queries, dtype=np.float32)), dim=1)
    d = F.normalize(torch.as_tensor(np.array(database, dtype=np.float32)), dim=1)
    sim = q @ d.T
    return {f"mAP_{p}": revisited_map(sim, gnd, p) for p in PROTOCOLS}


def retrieval_scores(entry: CacheEntry, num_queries: int, gnd: Sequence[object], blocks: Sequence[int] | None = None,
                     seed: int = 0, random_kind: str | None = "uniform", model: str = "") -> ProbeResult:
    """Revisited mAP per block from cached features of the queries followed by the database.

    Args:
        entry: cache entry whose image positions ``0 .. num_queries-1`` are the queries and the rest the
            database (the order of :class:`vitscope.data.formats.revisitop.RevisitOPDataset`).
        num_queries: Q.
        gnd: Q ground-truth entries (``easy``, ``hard``, ``junk`` database indices).
        blocks: blocks to score (default: every cached block).
        seed, random_kind: the random-chance features (``None``: no baseline).
        model: model name for the result.

    Returns:
        ProbeResult with ``mAP_medium``, ``mAP_hard``, ``mAP_easy`` ``[L]`` and their ``random_*``.
    """
    index = entry.index
    if index.size <= num_queries or not np.array_equal(index, np.arange(index.size)):
        raise VitscopeValueError("retrieval needs the features of every query and database image; the cache entry "
                                 f"holds {index.size} rows with gaps or no database (unreadable images?)")
    blocks = list(blocks) if blocks is not None else entry.blocks
    scores: dict[str, list[float]] = {f"mAP_{p}": [] for p in PROTOCOLS}
    width = 0
    for b in blocks:
        x = np.asarray(entry.block(b))
        width = x.shape[1]
        for k, v in _maps(x[:num_queries], x[num_queries:], gnd).items():
            scores[k].append(v)
    random = None
    if random_kind is not None and blocks:
        noise = random_features((index.size, width), torch.Generator().manual_seed(seed), random_kind).numpy()
        random = _maps(noise[:num_queries], noise[num_queries:], gnd)
    result = probe_result("retrieval", "retrieval", blocks, scores, random, model=model,
                          num_queries=int(num_queries), num_database=int(index.size - num_queries),
                          random_kind=random_kind, pooling=entry.meta.get("request", {}).get("pooling", ""))
    for p in PROTOCOLS:  # revisited_map is NaN exactly when no query has a positive under the protocol
        for key in (f"mAP_{p}", f"random_mAP_{p}"):
            if key in result.tensors and result.tensors[key].isnan().any():
                note_null(result.meta, key, f"no query has a positive under the {p} protocol")
    return result


def retrieval_probe(backbone: Backbone, dataset, cache: FeatureCache | None = None, pooling: str = "cls",
                    site: str = "resid_post", blocks: Sequence[int] | None = None, seed: int = 0,
                    random_kind: str | None = "uniform", batch_size: int = 32, device: str | None = None,
                    dtype: str | None = None, distributed: bool = False,
                    log: Callable[[str], None] | None = None, strict: bool = False, resume: bool = True,
                    checkpoint_seconds: float = 60.0, workers: int | None = None) -> ProbeResult:
    """Revisited Oxford / Paris retrieval mAP at every block (features extracted once, cached).

    Args:
        backbone: the model.
        dataset: a :class:`~vitscope.data.formats.revisitop.RevisitOPDataset` (queries then database).
        cache: feature cache (default location if None).
        pooling: ``"cls"`` (the paper) or ``"spatial_mean"``; site: block site.
        blocks: blocks to score (default all).
        seed, random_kind: random-chance features.
        batch_size, device, dtype: extraction settings.
        distributed: share the extraction with the processes of the ``torch.distributed`` group (every process
            returns the same result; the feature cache folder must be one they all see).
        log: receives one-line messages (an extraction that resumes says so).
        strict, resume, checkpoint_seconds: how the extraction pass treats unreadable images and saved state
            (:func:`~vitscope.engine.extract.extract_features`).
        workers: processes that decode the images (None: chosen from the CPUs).

    Returns:
        ProbeResult with ``mAP_medium``, ``mAP_hard``, ``mAP_easy`` per block.
    """
    require_blocks(backbone, "retrieval")
    if not hasattr(dataset, "gnd") or not hasattr(dataset, "queries"):
        raise VitscopeValueError("retrieval needs a revisited Oxford / Paris dataset (load_dataset(root, 'revisitop'))")
    request = FeatureRequest(site, pooling, None if blocks is None else tuple(blocks))
    entry = extract_features(backbone, AnnotatedSource(dataset), [request], cache, LongSideView(), batch_size,
                             device, dtype, distributed=distributed, log=log, strict=strict, resume=resume,
                             checkpoint_seconds=checkpoint_seconds, workers=workers)[request]
    return retrieval_scores(entry, len(dataset.queries), dataset.gnd, seed=seed, random_kind=random_kind,
                            model=backbone.spec.name)
