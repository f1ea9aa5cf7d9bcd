"""How well single SAE latents recover the synthetic world's known concepts, beside PCA, ICA, k-means, random
directions and the model's own MLP neurons, every method scored on the same held-out tokens (docs/sae-benchmark.md).

* **Data:** scenes ``0 .. images-1`` of ``SyntheticWorld(seed=world_seed)`` (backgrounds independent of the class)
  fit everything; the next ``heldout`` scenes are held out. Every spatial token is labelled with the concepts of
  :mod:`vitscope.sae.concepts`.
* **Units:** an SAE trained (:func:`vitscope.sae.train`) on the fitting images' tokens of ``hook``; PCA, ICA,
  k-means and random directions (:mod:`vitscope.sae.baselines`) fitted on a sample of ``fit_tokens`` of those
  tokens; and the neurons of the same block's MLP (``blocks.N.mlp.post``), which need no fit.
* **Scores, per concept and method:** the unit with the highest AUROC on the fitting sample (PCA, ICA and random
  directions read with either sign: their sign is arbitrary), its AUROC on the held-out tokens and its F1 there at
  the threshold that maximises F1 on the fitting sample; its AUROC within the concept's context (a class among the
  object tokens, a background type among the background tokens...: told apart from its siblings alone); and the
  latents needed: the fewest of the best-ranked units whose read-out (the unit alone, or a logistic regression
  fitted on the fitting sample) reaches ``target`` AUROC on the held-out tokens, at most ``cap``
  (:func:`~vitscope.functional.concept_scores.units_needed`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from vitscope.analyses.base import Analysis, Batch
from vitscope.autoencoders.model import KINDS, SparseAutoencoder
from vitscope.data.synthetic.world import SyntheticWorld
from vitscope.engine.run import resolve_device, run
from vitscope.errors import VitscopeUsageError, VitscopeValueError
from vitscope.functional.concept_scores import auroc_table, best_f1_threshold, f1_at, ranked_units, units_needed
from vitscope.models.backbone import Backbone
from vitscope.sae.baselines import BASELINES, fit_baseline
from vitscope.sae.concepts import FAMILIES, Concept, concept_labels, world_concepts
from vitscope.sae.training import SAETraining, train

__all__ = ["BOTH_SIGNS", "METHODS", "SAEBenchmark", "ZOO_MODELS", "benchmark"]

#: the zoo's four ViTs: supervised, self-distilled, masked autoencoder, and supervised where background followed class
ZOO_MODELS = ("tiny-vit-sup", "tiny-vit-distill", "tiny-vit-mae", "tiny-vit-sup-spurious")
#: every method scored, in the order tables list them
METHODS = ("sae", *BASELINES, "neurons")
#: methods whose units are directions of arbitrary sign, read either way
BOTH_SIGNS = ("pca", "ica", "random")


@dataclass(frozen=True)
class SAEBenchmark:
    """The sizes of one benchmark (recorded in its JSON).

    Attributes:
        hook: the tokens read (``blocks.N.<name>``); the neurons are ``blocks.N.mlp.post``.
        images, heldout: fitting and held-out scenes; size: their side in pixels; world_seed: the world's seed.
        kind, latents, k, tokens, batch_tokens, lr: the SAE (:class:`~vitscope.sae.training.SAETraining`);
            ``latents`` is also the number of k-means centroids and random directions, and of PCA and ICA
            components up to the tokens' width.
        fit_tokens: the fitting sample (tokens of the fitting images) that fits the baselines, ranks units, sets
            thresholds and fits the read-outs.
        cap: the most units a read-out may use; target: the AUROC it must reach.
        min_tokens: a concept is scored when it has this many positive and negative tokens in the fitting sample
            and in the held-out tokens.
        seed: of the SAE, the baselines and the fitting sample; batch_size: images per forward pass.
    """

    hook: str = "blocks.3.resid_post"
    images: int = 1000
    heldout: int = 500
    size: int = 64
    world_seed: int = 20_000
    kind: str = "topk"
    latents: int = 512
    k: int = 16
    tokens: int = 2**18
    batch_tokens: int = 1024
    lr: float = 1e-3
    fit_tokens: int = 20_000
    cap: int = 32
    target: float = 0.9
    min_tokens: int = 20
    seed: int = 0
    batch_size: int = 64

    def check(self) -> None:
        if not re.fullmatch(r"blocks\.\d+\..+", self.hook):
            raise VitscopeValueError(f"hook must be a block's hook (blocks.N.<name>), got {self.hook!r}")
        if self.kind not in KINDS:
            raise VitscopeValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if min(self.images, self.heldout, self.latents, self.k, self.tokens, self.batch_tokens, self.fit_tokens,
               self.cap, self.min_tokens, self.batch_size) < 1 or self.k > self.latents:
            raise VitscopeValueError("images, heldout, latents, k, tokens, batch_tokens, fit_tokens, cap, min_tokens "
                                     "and batch_size must be positive, k <= latents")
        if not 0.5 < self.target <= 1:
            raise VitscopeValueError(f"target must be an AUROC in (0.5, 1], got {self.target}")

    @property
    def neuron_hook(self) -> str:
        """The MLP neurons of the hook's block."""
        return f"blocks.{self.hook.split('.')[1]}.mlp.post"


class _Tokens(Analysis):
    """The spatial tokens of a few hooks, kept by image (nothing declared but the count of images)."""

    name = "sae_benchmark_tokens"

    def __init__(self, hooks: Sequence[str], keep: Callable[[list[int], dict[str, torch.Tensor]], None]) -> None:
        super().__init__()
        self.hooks, self.keep = list(hooks), keep
        self.add_state("num_images", 0, reduce="sum")

    def required_hooks(self, spec: Any) -> list[str]:
        return list(self.hooks)

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        kinds = tuple(batch.spec.prefix_kinds)
        self.keep(list(batch.indices), {h: record[h].detach().float()[:, len(kinds):].cpu() for h in self.hooks})
        self.num_images += batch.size

    def compute(self) -> Any:
        return {"num_images": self.num_images}


def _tokens_of(backbone: Backbone, pictures: list[np.ndarray], hooks: Sequence[str], batch_size: int,
               device: str | None) -> dict[str, np.ndarray]:
    """``{hook: [images, T, D] float32}`` of every picture, in order."""
    kept: dict[int, dict[str, torch.Tensor]] = {}

    def keep(indices: list[int], tensors: dict[str, torch.Tensor]) -> None:
        for j, i in enumerate(indices):
            kept[int(i)] = {h: t[j] for h, t in tensors.items()}

    with torch.no_grad():
        run(backbone, pictures, [_Tokens(hooks, keep)], batch_size=batch_size, device=device, progress=False,
            workers=0)
    return {h: torch.stack([kept[i][h] for i in range(len(pictures))]).numpy() for h in hooks}


def _sae_units(sae: SparseAutoencoder, x: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """The SAE's codes ``[n, latents]`` of tokens ``[n, D]``."""
    sae = sae.cpu().eval()
    with torch.no_grad():
        return torch.cat([sae.encode(torch.from_numpy(x[s:s + chunk])) for s in range(0, len(x), chunk)]).numpy()


def _sae_quality(sae: SparseAutoencoder, x: np.ndarray, codes: np.ndarray) -> dict[str, float]:
    """FVU, L0 and dead latents (never active) of the SAE on tokens ``x`` with their ``codes``."""
    with torch.no_grad():
        recon = sae.reconstruct(torch.from_numpy(codes), torch.from_numpy(x)).numpy().astype(np.float64)
    error = float(((x - recon) ** 2).sum())
    variance = float(((x - x.mean(axis=0)) ** 2).sum())
    return {"fvu": error / max(variance, 1e-30), "l0": float((codes > 0).sum(axis=1).mean()),
            "dead": int(((codes > 0).sum(axis=0) == 0).sum())}


def _score(fit_units: np.ndarray, fit_labels: np.ndarray, test_units: np.ndarray, test_labels: np.ndarray,
           contexts: Sequence[np.ndarray | None], both_signs: bool, config: SAEBenchmark) -> list[dict[str, Any]]:
    """The record of every concept (columns of the labels) for one method's units; ``contexts``: per concept, the
    held-out tokens of its context (:attr:`~vitscope.sae.concepts.Concept.context`) as a bool mask, or None."""
    from sklearn.metrics import roc_auc_score

    table = auroc_table(fit_units, fit_labels)
    order, sign = ranked_units(table, both_signs)
    records = []
    for c in range(fit_labels.shape[1]):
        unit = int(order[c, 0])
        s = float(sign[c, unit])
        fit_scores, test_scores = s * fit_units[:, unit], s * test_units[:, unit]
        threshold, fit_f1 = best_f1_threshold(fit_scores, fit_labels[:, c])
        needed, readout = units_needed(fit_units, fit_labels[:, c], test_units, test_labels[:, c],
                                       order[c].tolist(), config.target, config.cap, s)
        within = None
        if contexts[c] is not None:
            inside = test_labels[contexts[c], c]
            if min(inside.sum(), (~inside).sum()) >= config.min_tokens:
                within = float(roc_auc_score(inside, test_scores[contexts[c]]))
        records.append({"unit": unit, "sign": int(s), "fit_auroc": float(table[c, unit] if s > 0 else
                                                                         1 - table[c, unit]),
                        "auroc": float(roc_auc_score(test_labels[:, c], test_scores)), "auroc_within": within,
                        "threshold": threshold, "fit_f1": fit_f1,
                        "f1": f1_at(test_scores, test_labels[:, c], threshold),
                        "needed": needed, "readout_auroc": readout})
    return records


def _references(test_labels: np.ndarray, scored: np.ndarray, concepts: list[Concept]) -> dict[str, Any]:
    """What a score is worth, per scored concept on the held-out tokens: ``context_auroc``, the AUROC of the
    concept's context itself as a score (a perfect object detector scores a class this high without knowing any
    class; None without a context), and ``all_positive_f1``, the F1 of calling every token positive."""
    from sklearn.metrics import roc_auc_score

    index = {c.key: i for i, c in enumerate(concepts)}
    out = {}
    for i in scored:
        context = concepts[i].context
        y = test_labels[:, i]
        out[concepts[i].key] = {
            "context_auroc": None if context is None else float(roc_auc_score(y, test_labels[:, index[context]])),
            "all_positive_f1": f1_at(np.ones(len(y)), y, 1.0)}
    return out


def _model_scores(name: str, config: SAEBenchmark, world: SyntheticWorld, scenes: list, concepts: list[Concept],
                  out: Path | None, device: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Every method's scores for one model."""
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model

    backbone = load_model(name, device=device)
    spec = backbone.spec
    log(describe_input(spec))
    if not spec.is_transformer:
        raise VitscopeValueError(f"{name} is a CNN: the SAE benchmark reads a ViT's tokens")
    hooks = set(backbone.hook_names())
    for hook in (config.hook, config.neuron_hook):
        if hook not in hooks:  # a value only the model shows wrong: still bad usage
            raise VitscopeUsageError(f"{name} has no hook {hook!r}")
    labels = concept_labels(scenes, world, spec, concepts)  # [B, T, C]
    pictures = [s.image for s in scenes]
    start = time.perf_counter()
    found = _tokens_of(backbone, pictures, (config.hook, config.neuron_hook), config.batch_size, device)
    x, neurons = found[config.hook], found[config.neuron_hook]
    if x.shape[1] != labels.shape[1]:
        raise VitscopeValueError(f"{name} has {x.shape[1]} spatial tokens but its grid labels {labels.shape[1]}")
    per_image = x.shape[1]
    x, neurons, labels = (a.reshape(-1, a.shape[-1]) for a in (x, neurons, labels))
    fit_end = config.images * per_image
    rng = np.random.default_rng(config.seed)
    sample = np.sort(rng.permutation(fit_end)[: config.fit_tokens])
    held = slice(fit_end, None)
    fit_labels, test_labels = labels[sample], labels[held]
    counts = {"fit": fit_labels.sum(axis=0), "heldout": test_labels.sum(axis=0)}
    floor = config.min_tokens
    scored = np.flatnonzero((counts["fit"] >= floor) & (len(sample) - counts["fit"] >= floor)
                            & (counts["heldout"] >= floor) & (len(test_labels) - counts["heldout"] >= floor))
    log(f"{name}: {config.images} + {config.heldout} images, {per_image} tokens each ({time.perf_counter() - start:.1f}"
        f" s); {len(scored)} of {len(concepts)} concepts have {floor} positive tokens in both sets")

    sae = train(backbone, config.hook, pictures[: config.images],
                SAETraining(kind=config.kind, latents=config.latents, k=config.k, tokens=config.tokens,
                            buffer_tokens=16 * config.batch_tokens, batch_tokens=config.batch_tokens, lr=config.lr,
                            seed=config.seed),
                out=None if out is None else out / "sae" / name, batch_size=config.batch_size, device=device,
                log=lambda s: log(f"{name} SAE {s}"))
    sae_test = _sae_units(sae, x[held])
    doc: dict[str, Any] = {
        "tokens": {"per_image": per_image, "fit": fit_end, "fitting_sample": len(sample), "heldout": len(test_labels)},
        "positives": {c.key: {"fit": int(counts["fit"][i]), "heldout": int(counts["heldout"][i])}
                      for i, c in enumerate(concepts)},
        "references": _references(test_labels, scored, concepts),
        "sae": {**_sae_quality(sae, x[held], sae_test), "training": (sae.training_log or [{}])[-1]},
        "methods": {}}
    log(f"{name} SAE on held-out tokens: FVU {doc['sae']['fvu']:.3f}, L0 {doc['sae']['l0']:.1f}, "
        f"dead {doc['sae']['dead']}")
    for method in METHODS:
        # scikit-learn's fits and BLAS on one thread: their thread pools, beside torch's, only slow a small CPU down
        # (k-means of 20,000 tokens into 512 centroids: 2.9 s on one thread of two cores, 4.9 s on both)
        with threadpool_limits(1):
            doc["methods"][method] = _method(method, config, sae, sae_test, x, neurons, sample, held, fit_labels,
                                             test_labels, scored, concepts)
        m = doc["methods"][method]
        log(f"{name} {method}: {m['units']} units, mean held-out AUROC {m['mean_auroc']:.3f} ({m['seconds']:.1f} s)")
    return doc


def _method(method: str, config: SAEBenchmark, sae: SparseAutoencoder, sae_test: np.ndarray, x: np.ndarray,
            neurons: np.ndarray, sample: np.ndarray, held: slice, fit_labels: np.ndarray, test_labels: np.ndarray,
            scored: np.ndarray, concepts: list[Concept]) -> dict[str, Any]:
    """One method's units fitted and scored: ``{"units", "both_signs", "notes", "seconds", "mean_auroc",
    "concepts"}``."""
    start = time.perf_counter()
    notes: dict[str, Any] = {}
    if method == "sae":
        fit_u, test_u = _sae_units(sae, x[sample]), sae_test
    elif method == "neurons":
        fit_u, test_u = neurons[sample], neurons[held]
    else:
        fitted = fit_baseline(method, x[sample], config.latents, config.seed)
        fit_u, test_u, notes = fitted.units(x[sample]), fitted.units(x[held]), fitted.notes
    index = {c.key: i for i, c in enumerate(concepts)}
    contexts = [None if concepts[i].context is None else test_labels[:, index[concepts[i].context]] for i in scored]
    records = _score(fit_u, fit_labels[:, scored], test_u, test_labels[:, scored], contexts, method in BOTH_SIGNS,
                     config)
    by_key: dict[str, Any] = {c.key: None for c in concepts}
    by_key.update({concepts[i].key: r for i, r in zip(scored, records)})
    return {"units": int(fit_u.shape[1]), "both_signs": method in BOTH_SIGNS, "notes": notes,
            "seconds": time.perf_counter() - start,
            "mean_auroc": float(np.mean([r["auroc"] for r in records])) if records else float("nan"),
            "concepts": by_key}


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None (None when none is)."""
    found = [v for v in values if v is not None]
    return float(np.mean(found)) if found else None


def summarise(models: Mapping[str, Any], concepts: Sequence[Concept], target: float) -> dict[str, Any]:
    """Per model, method and family: the mean held-out AUROC and F1 of the best units, how many concepts one unit
    detects at ``target`` AUROC and how many a read-out of at most the cap reaches, and the median units needed;
    per model and family, how many concepts each method wins (the highest AUROC at two decimals, ties shared); and
    the references' means (:func:`_references`).
    """
    summary: dict[str, Any] = {}
    wins: dict[str, Any] = {}
    references: dict[str, Any] = {}
    for model, doc in models.items():
        summary[model], wins[model] = {}, {f: {m: 0 for m in METHODS} for f in FAMILIES}
        references[model] = {
            family: {name: _mean([r[name] for k, r in doc["references"].items() if k.split("/")[0] == family])
                     for name in ("context_auroc", "all_positive_f1")} for family in FAMILIES}
        for method in METHODS:
            summary[model][method] = {}
            for family in FAMILIES:
                rows = [doc["methods"][method]["concepts"][c.key] for c in concepts if c.family == family]
                rows = [r for r in rows if r is not None]
                needed = [r["needed"] for r in rows if r["needed"] is not None]
                summary[model][method][family] = {
                    "concepts": len(rows),
                    "auroc": float(np.mean([r["auroc"] for r in rows])) if rows else None,
                    "auroc_within": _mean([r["auroc_within"] for r in rows]),
                    "f1": float(np.mean([r["f1"] for r in rows])) if rows else None,
                    "one_unit": sum(r["auroc"] >= target for r in rows),
                    "reached": len(needed),
                    "median_needed": float(np.median(needed)) if needed else None}
        for c in concepts:
            found = {m: doc["methods"][m]["concepts"][c.key] for m in METHODS}
            if any(r is None for r in found.values()):
                continue
            best = max(round(r["auroc"], 2) for r in found.values())
            for m, r in found.items():
                wins[model][c.family][m] += int(round(r["auroc"], 2) == best)
    return {"families": summary, "wins": wins, "references": references}


def benchmark(models: Sequence[str] = ZOO_MODELS, config: SAEBenchmark = SAEBenchmark(),
              out: str | Path | None = None, device: str | None = None,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Score SAE latents and the baselines as detectors of the synthetic world's concepts, model by model.

    Args:
        models: registered ViT names (default: :data:`ZOO_MODELS`).
        config: the sizes (:class:`SAEBenchmark`).
        out: a folder for ``benchmark.json`` (every number), ``benchmark.md`` (the tables), ``auroc.png`` (AUROC per
            concept and method) and ``sae/<model>/`` (each trained SAE); None writes nothing.
        device: where the models and SAEs run; log: receives progress lines.

    Returns:
        ``{"settings", "concepts", "models": {model: {"tokens", "positives", "references", "sae", "methods": {method:
        {"units", "both_signs", "notes", "seconds", "mean_auroc", "concepts": {key: record or None}}}}}, "summary",
        "seconds"}``; a record is
        ``{"unit", "sign", "fit_auroc", "auroc", "auroc_within", "threshold", "fit_f1", "f1", "needed",
        "readout_auroc"}`` (None: a concept with too few tokens to score; ``needed`` None: not reached within the cap;
        ``auroc_within``: the same unit's AUROC among the held-out tokens of the concept's context,
        :attr:`~vitscope.sae.concepts.Concept.context`, None without one).

    Raises:
        ValueError: bad sizes, no model, a model not registered, a CNN, or a hook the model lacks (one line).
        VitscopeUsageError: an unknown ``device``.
        VitscopeValueError: a ``device`` this machine does not have.
    """
    config.check()
    resolve_device(device)  # an unknown or absent device is one line, before any model loads
    models = list(dict.fromkeys(models))
    if not models:
        raise VitscopeValueError("name at least one model")
    say = log or (lambda s: None)
    start = time.perf_counter()
    world = SyntheticWorld(size=config.size, seed=config.world_seed)
    concepts = world_concepts(world)
    scenes = list(world.scenes(config.images + config.heldout))
    folder = None if out is None else Path(out)
    found = {name: _model_scores(name, config, world, scenes, concepts, folder, device, say) for name in models}
    doc = {"settings": {**asdict(config), "neuron_hook": config.neuron_hook, "models": models, "world": repr(world)},
           "concepts": [{"key": c.key, "family": c.family, "name": c.name} for c in concepts],
           "models": found, "summary": summarise(found, concepts, config.target),
           "seconds": time.perf_counter() - start}
    if folder is not None:
        from vitscope.sae.benchmark_tables import write_benchmark

        for path in write_benchmark(doc, folder):
            say(f"wrote {path}")
    return doc
