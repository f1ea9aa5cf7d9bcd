"""How good a sparse autoencoder is, on held-out images: how well it reconstructs its hook's tokens, how sparse and
how alive its latents are, and what the model loses when the hook is replaced by the reconstruction, beside the same
hook replaced by its mean (the control) and by PCA with as many components as the SAE's L0.

Reconstruction metrics are streamed over every token of the data (one pass): the fraction of variance unexplained
``FVU = sum ||x - x_hat||^2 / sum ||x - mean||^2``, the mean cosine of ``x_hat`` to ``x``, the mean L0 (active
latents per token), dead latents (never active) and dense ones (active on more than ``dense_above`` of the tokens).
The spliced-in cost is measured on the data's first ``images`` images (:func:`vitscope.models.outputs.output_change`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vitscope.analyses.base import Analysis, Batch
from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.autoencoders.tokens import TOKENS_OF, as_tokens, check_selects, map_back, selected_tokens
from vitscope.data.open import as_source
from vitscope.engine.provenance import model_identity
from vitscope.engine.run import run
from vitscope.errors import VitscopeUsageError, VitscopeValueError
from vitscope.hooks.edits import EditFn
from vitscope.models.backbone import Backbone
from vitscope.models.outputs import edited_readout, output_change

__all__ = ["evaluate", "spliced"]


class _Moments(Analysis):
    """Streaming sums over the hook's selected tokens: of ``x``, ``||x||^2``, ``x^T x`` (the PCA control's
    covariance), the squared error, the cosine, the L0 and each latent's firing count."""

    name = "sae_moments"

    def __init__(self, sae: SparseAutoencoder, hook: str, tokens_of: str) -> None:
        super().__init__()
        self.sae, self.hook, self.tokens_of = sae, hook, tokens_of
        self.add_state("sums", {}, reduce="sum")

    def required_hooks(self, spec: Any) -> list[str]:
        return [self.hook]

    def stream_hooks(self, spec: Any) -> list[str]:
        return [self.hook]

    def update_hook(self, name: str, tensor: torch.Tensor, batch: Batch) -> None:
        if tensor.dim() == 4 and not batch.spec.is_transformer:  # a CNN map: every position is a token, as trained
            tensor = as_tokens(tensor)
        x = selected_tokens(tensor.detach().float(), tuple(batch.spec.prefix_kinds), self.tokens_of)
        if x.shape[-1] != self.sae.d_in:
            raise VitscopeValueError(f"{name} has {x.shape[-1]} channels but the SAE reads {self.sae.d_in}")
        sae = self.sae.to(x.device)
        codes = sae.encode(x)
        x_hat = sae(x)  # in the tokens' units (a per-token norm undone)
        add = {"n": torch.tensor(float(len(x)), dtype=torch.float64, device=x.device),
               "x": x.double().sum(dim=0), "x2": (x.double() ** 2).sum(), "xx": (x.T @ x).double(),
               "error": ((x - x_hat).double() ** 2).sum(),
               "cosine": torch.nn.functional.cosine_similarity(x, x_hat, dim=-1).double().sum(),
               "l0": (codes > 0).sum().double(), "fired": (codes > 0).sum(dim=0).double()}
        for key, value in add.items():
            self.sums[key] = value if key not in self.sums else self.sums[key].to(value.device) + value

    def update(self, record: Mapping[str, torch.Tensor], batch: Batch) -> None:
        """Everything happens as the hook streams."""

    def compute(self) -> Any:
        return {}


def spliced(hook: str, prefix_kinds: tuple[str, ...], tokens_of: str, replace: Any, maps: bool = False
            ) -> dict[str, EditFn]:
    """Edits that put ``replace(tokens [n, D]) -> [n, D]`` in place of the selected tokens at ``hook``.

    Args:
        hook: where; prefix_kinds: the model's prefix tokens; tokens_of: which tokens (``TOKENS_OF``).
        replace: the replacement of ``[n, D]`` tokens.
        maps: the hook is a CNN's ``[B, D, H, W]`` map (every position a token), not tokens ``[B, T, D]``.
    """
    def edit(t: torch.Tensor, name: str) -> torch.Tensor:
        if maps and t.dim() == 4:
            return map_back(on_tokens(as_tokens(t)), t)
        return on_tokens(t)

    def on_tokens(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        p = len(prefix_kinds)
        if tokens_of == "all":
            out[:] = replace(t.reshape(-1, t.shape[-1]).float()).reshape(t.shape).to(t.dtype)
        elif tokens_of == "spatial":
            out[:, p:] = replace(t[:, p:].reshape(-1, t.shape[-1]).float()).reshape(t[:, p:].shape).to(t.dtype)
        else:
            wanted = [i for i, kind in enumerate(prefix_kinds) if kind == ("cls" if tokens_of == "cls" else "reg")]
            part = t[:, wanted]
            out[:, wanted] = replace(part.reshape(-1, t.shape[-1]).float()).reshape(part.shape).to(t.dtype)
        return out
    return {hook: edit}


def evaluate(sae: SparseAutoencoder, backbone: Backbone, data: Any, hook: str | None = None,
             tokens_of: str | None = None, images: int = 32, batch_size: int = 32, dense_above: float = 0.1,
             knn: bool = True) -> dict[str, Any]:
    """Reconstruction, sparsity and spliced-in cost of ``sae`` on ``data``.

    Args:
        sae: the autoencoder (:func:`vitscope.sae.load`); backbone: the model it reads.
        data: held-out images; hook: where (default: the SAE's own ``hook``); tokens_of: which tokens (default:
            those the SAE was trained on, as its file records them, else ``"spatial"``).
        images: images the spliced-in cost is measured on; batch_size: of the pass.
        dense_above: share of tokens above which a latent is dense.
        knn: with labelled data, also the k-NN accuracy of the last block's features (the probe's defaults) with the
            hook replaced, beside the model's own (one more pass per replacement).

    Returns:
        ``{"hook", "tokens_of", "tokens", "fvu", "cosine", "l0", "dead", "dense", "num_images", "spliced": {"sae" |
        "mean" | "pca": output change}, "models", "data"}`` (:func:`~vitscope.models.outputs.output_change`; ``pca``
        keeps the ``round(l0)`` principal components of every token the pass streamed, as the SAE and the mean are
        fitted away from the scored images; ``models`` and ``data`` as results.json has them: the model's identity
        under its spec's name, the data's description with its fingerprint); with ``knn`` and labels,
        ``knn_accuracy`` (the model's) and each replacement's ``knn_accuracy`` and ``knn_change``.

    Raises:
        ValueError: no hook, a hook the model lacks, a width that is not the hook's, an SAE of another model, or
            ``tokens_of`` naming a class token or registers the model does not have.
    """
    hook = hook or getattr(sae, "hook", None)
    tokens_of = tokens_of or getattr(sae, "tokens_of", None) or "spatial"
    if not hook:
        raise VitscopeValueError("this SAE's file does not name the hook it reads: give it (--hook, or hook=)")
    if hook not in set(backbone.hook_names()):  # a value only the model shows wrong: still bad usage
        raise VitscopeUsageError(f"{backbone.spec.name} has no hook {hook!r} for this SAE (give another with --hook, "
                                 "or hook=)")
    if tokens_of not in TOKENS_OF:
        raise VitscopeValueError(f"tokens_of must be one of {', '.join(TOKENS_OF)}, got {tokens_of!r}")
    check_selects(tuple(backbone.spec.prefix_kinds), tokens_of, backbone.spec.name)
    trained_on = getattr(sae, "model", None)
    if trained_on and trained_on != backbone.spec.name:
        raise VitscopeValueError(f"this SAE was trained on {trained_on}, not {backbone.spec.name}")
    moments = _Moments(sae.eval(), hook, tokens_of)
    source = as_source(data)
    with torch.no_grad():
        passed = run(backbone, source, [moments], batch_size=batch_size, progress=False, workers=0)
    s = {k: v.cpu() for k, v in moments.sums.items()}
    if not s or not float(s["n"]):
        raise VitscopeValueError(f"no token of {hook!r} came from {source.name} ({tokens_of} tokens)")
    n = float(s["n"])
    mean = s["x"] / n
    variance = float(s["x2"]) - n * float((mean ** 2).sum())
    l0 = float(s["l0"]) / n
    out: dict[str, Any] = {"hook": hook, "tokens_of": tokens_of, "tokens": int(n),
                           "fvu": float(s["error"]) / max(variance, 1e-30), "cosine": float(s["cosine"]) / n,
                           "l0": l0, "dead": int((s["fired"] == 0).sum()),
                           "dense": int((s["fired"] > dense_above * n).sum()), "num_images": passed.num_images}
    covariance = s["xx"] / n - torch.outer(mean, mean)
    replacements = _replacements(sae, mean.float(), covariance, max(1, round(l0)))
    out["spliced"] = _spliced_costs(backbone, source, hook, tokens_of, images, replacements)
    if knn and "label" in source.target_keys():
        kinds, maps = tuple(backbone.spec.prefix_kinds), not backbone.spec.is_transformer
        out["knn_accuracy"] = _knn(backbone, source, {}, batch_size)
        for name, fn in replacements.items():
            accuracy = _knn(backbone, source, spliced(hook, kinds, tokens_of, fn, maps), batch_size)
            out["spliced"][name].update(knn_accuracy=accuracy, knn_change=accuracy - out["knn_accuracy"])
    out.update(models=[model_identity(backbone.spec.name, backbone)], data=passed.data)
    return out


def _knn(backbone: Backbone, source: Any, edits: Mapping[str, EditFn], batch_size: int) -> float:
    """k-NN accuracy of the last block's features under ``edits`` (NaN when the data cannot be scored)."""
    import contextlib

    from vitscope.analyses.probes.knn import KnnProbe

    with backbone.intervene(dict(edits)) if edits else contextlib.nullcontext():
        result = run(backbone, source, [KnnProbe()], batch_size=batch_size, progress=False, workers=0)["knn_probe"]
    return float(result["accuracy"][-1]) if "accuracy" in result.tensors else float("nan")


def _replacements(sae: SparseAutoencoder, mean: torch.Tensor, covariance: torch.Tensor, components: int
                  ) -> dict[str, Any]:
    """What the hook's tokens are replaced by: the SAE's reconstruction, their mean, and their projection on the top
    ``components`` principal directions of the streamed tokens (``mean [D]``, ``covariance [D, D]``)."""
    _, vectors = torch.linalg.eigh(covariance.double())  # eigenvalues ascending
    basis = vectors[:, -components:].T.float().contiguous()  # [c, D]
    return {
        "sae": lambda x: sae.to(x.device)(x),
        "mean": lambda x: mean.to(x.device).expand_as(x),
        "pca": lambda x: (x - mean.to(x.device)) @ basis.T.to(x.device) @ basis.to(x.device) + mean.to(x.device),
    }


def _spliced_costs(backbone: Backbone, source: Any, hook: str, tokens_of: str, images: int,
                   replacements: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The output change on the first ``images`` images with the hook's tokens replaced by each replacement."""
    pixels = backbone.preprocess(source.first_images(images))
    kinds, maps = tuple(backbone.spec.prefix_kinds), not backbone.spec.is_transformer
    clean = edited_readout(backbone, pixels)
    return {name: output_change(backbone, clean, edited_readout(backbone, pixels,
                                                                spliced(hook, kinds, tokens_of, fn, maps)))
            for name, fn in replacements.items()}
