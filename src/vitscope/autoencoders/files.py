"""Sparse autoencoders on disk in SAELens's layout: a folder with ``cfg.json`` and ``sae_weights.safetensors``
(``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_in]``, ``b_dec [d_in]``, and ``threshold [d_sae]``
for JumpReLU inference), so that SAELens and vitscope read each other's files.

vitscope writes its input scale folded into the weights (``normalize_activations: "none"``: the file is exact for any
reader) and keeps what it knows beside SAELens's keys under ``"vitscope"`` (the kind, k, the matryoshka widths, the
scale, the model and hook it was trained on; from training, its settings and what it was made of: the model's identity,
the data with its fingerprint, the versions). Batch top-k and matryoshka SAEs are written as SAELens writes them for
inference: JumpReLU with the learned threshold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from vitscope.atomic import atomic_path
from vitscope.autoencoders.foreign import (
    is_prisma_file,
    load_overcomplete,
    load_prisma,
    prisma_weights,
    read_json_object,
)
from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.errors import VitscopeFileNotFoundError, VitscopeValueError
from vitscope.strict_json import write_json_atomic

__all__ = ["CFG_FILE", "PROVENANCE_KEYS", "WEIGHTS_FILE", "load", "save", "trained_on"]

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
#: what vitscope's record says an SAE was trained on (results.json's names): vitscope's version, the model's identity,
#: the data with its fingerprint, where the passes ran, the package versions
PROVENANCE_KEYS = ("vitscope_version", "models", "data", "run", "environment")
_ARCHITECTURE = {"relu": "standard", "topk": "topk", "batchtopk": "jumprelu", "matryoshka": "jumprelu",
                 "jumprelu": "jumprelu"}


def save(sae: SparseAutoencoder, folder: str | Path, hook: str | None = None, model: str | None = None,
         extra: dict[str, Any] | None = None) -> Path:
    """Write ``sae`` into ``folder`` (created) in SAELens's layout; returns the folder.

    Args:
        sae: the autoencoder; hook, model: what it reads (recorded as SAELens's ``hook_name`` and ``model_name``).
        extra: more of vitscope's record (training settings, token counts...), kept under ``"vitscope"``.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    weights = sae.folded()
    architecture = _ARCHITECTURE[sae.kind]
    if architecture != "jumprelu":
        weights.pop("threshold")
    cfg: dict[str, Any] = {
        "architecture": architecture, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32", "device": "cpu",
        "apply_b_dec_to_input": sae.b_dec_in_input,
        "normalize_activations": "layer_norm" if sae.token_norm == "layer_norm" else "none",
        "hook_name": hook, "model_name": model, "metadata": {"hook_name": hook, "model_name": model},
        "vitscope": {"kind": sae.kind, "k": sae.k, "widths": list(sae.widths), "input_scale": float(sae.scale),
                     "hook": hook, "model": model, **(extra or {})}}
    if architecture == "topk":
        cfg["k"] = sae.k
    with atomic_path(out / WEIGHTS_FILE) as partial:
        save_file({k: v.float().cpu() for k, v in weights.items()}, str(partial))
    write_json_atomic(out / CFG_FILE, cfg)
    return out


def trained_on(path: str | Path) -> dict[str, Any]:
    """What the cfg.json of the SAE folder at ``path`` records of the model, data and environment it was trained on
    (:data:`PROVENANCE_KEYS`); empty for other layouts and for folders written before vitscope recorded it."""
    cfg_path = Path(path) / CFG_FILE
    if not cfg_path.is_file():
        return {}
    ours = read_json_object(cfg_path).get("vitscope") or {}
    return {key: ours[key] for key in PROVENANCE_KEYS if key in ours}


def _refuse_a_folders_file(path: Path) -> None:
    """Refuse one file of an SAE folder given for the folder (it would be read as another library's file).

    Raises:
        VitscopeValueError: ``path`` is a ``.json`` or ``.safetensors`` file, naming the folder to give.
    """
    if path.suffix not in (".json", ".safetensors"):
        return
    if (path.parent / CFG_FILE).is_file() and (path.parent / WEIGHTS_FILE).is_file():
        raise VitscopeValueError(f"{path} is one file of the SAE folder {path.parent}: give the folder")
    raise VitscopeValueError(f"{path} is a {path.suffix} file: give an SAE's folder ({CFG_FILE} and {WEIGHTS_FILE}, "
                             "or ViT-Prisma's config.json and weights.pt) or an overcomplete .pt file")


def _finite(sae: SparseAutoencoder, where: str | Path) -> SparseAutoencoder:
    """``sae`` when its weights are finite numbers (a diverged training writes NaN, which measures as nothing).

    Raises:
        VitscopeValueError: a weight holding NaN or infinity, naming it.
    """
    for name, value in sae.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise VitscopeValueError(f"{where}: the SAE's {name} holds NaN or infinite values (a diverged "
                                     "training?): it cannot be used")
    return sae


def load(path: str | Path, k: int | None = None) -> SparseAutoencoder:
    """A sparse autoencoder from disk: a torch module with ``encode(x) -> codes``, ``decode(codes) -> x_hat`` and
    ``forward(x) -> x_hat``, its ``hook`` and ``model`` attributes saying what it was trained on (None when the file
    does not say).

    Layouts: a folder in SAELens's layout (``cfg.json`` + ``sae_weights.safetensors``: vitscope's and SAELens's),
    a ViT-Prisma folder (``config.json`` + ``weights.pt`` or ``n_images_<N>.pt``: the last, unless ``path`` names
    one of them), or an overcomplete ``state_dict`` file (``.pt``; :mod:`vitscope.autoencoders.foreign`).

    Args:
        path: the folder or file.
        k: the top-k of an overcomplete ``TopKSAE`` (its files do not hold it; other layouts record their own and
            refuse it).

    Raises:
        FileNotFoundError: nothing of these layouts there.
        ValueError: an architecture or a normalisation vitscope does not read, weights of the wrong shapes or not
            finite (NaN or infinite), a cfg.json that is no JSON object, or one file of an SAE folder (give the
            folder).
    """

    folder = Path(path)
    if folder.is_file():
        _refuse_a_folders_file(folder)
    if folder.is_file() and not is_prisma_file(folder):
        return _finite(load_overcomplete(folder, k=k), folder)
    if k is not None:
        raise VitscopeValueError(f"k is for overcomplete .pt files, which do not hold their k; the SAE at {path} "
                                 "records its own")
    if folder.is_file():  # one of a ViT-Prisma folder's checkpoints: that one
        return _finite(load_prisma(folder.parent, folder), folder)
    cfg_path, weights_path = folder / CFG_FILE, folder / WEIGHTS_FILE
    if not cfg_path.is_file() and (folder / "config.json").is_file() and prisma_weights(folder) is not None:
        return _finite(load_prisma(folder), folder)
    if not cfg_path.is_file() or not weights_path.is_file():
        raise VitscopeFileNotFoundError(f"{folder} holds no SAE in SAELens's layout ({CFG_FILE} and {WEIGHTS_FILE}), "
                                        "ViT-Prisma's (config.json and weights.pt) or overcomplete's (a .pt file)")
    cfg = read_json_object(cfg_path)
    architecture = cfg.get("architecture", "standard")
    ours = cfg.get("vitscope") or {}
    if architecture not in ("standard", "topk", "jumprelu"):
        raise VitscopeValueError(f"{folder}: SAE architecture {architecture!r} is not one vitscope reads (standard, "
                                 "topk, jumprelu)")
    # SAELens before 6 wrote a top-k SAE as "standard" with its activation named apart (k in its keyword arguments)
    activation = cfg.get("activation_fn_str") or "relu"
    if architecture == "standard" and activation not in ("relu", "topk"):
        raise VitscopeValueError(f"{folder}: activation {activation!r}; vitscope reads relu and topk")
    if architecture == "standard" and activation == "topk":
        architecture = "topk"
    token_norm = "layer_norm" if cfg.get("normalize_activations") == "layer_norm" else None
    if cfg.get("normalize_activations", "none") not in ("none", None, "layer_norm"):
        raise VitscopeValueError(f"{folder}: activations normalised by {cfg['normalize_activations']!r}; fold the "
                                 "normalisation into the weights first (SAELens: fold_activation_norm_scaling_factor)")
    weights = load_file(str(weights_path))
    missing = [k for k in ("W_enc", "b_enc", "W_dec", "b_dec") if k not in weights]
    if missing:
        raise VitscopeValueError(f"{folder}: the weights lack {', '.join(missing)}")
    d_in, d_sae = weights["W_enc"].shape
    kind = ours.get("kind") or {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu"}[architecture]
    k = int(cfg.get("k") or (cfg.get("activation_fn_kwargs") or {}).get("k") or ours.get("k") or min(32, d_sae))
    sae = SparseAutoencoder(int(d_in), int(d_sae), kind=kind, k=min(k, int(d_sae)), widths=ours.get("widths"),
                            b_dec_in_input=bool(cfg.get("apply_b_dec_to_input", True)), token_norm=token_norm)
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
    if architecture == "jumprelu":
        shapes["threshold"] = (d_sae,)
        if "threshold" not in weights:
            raise VitscopeValueError(f"{folder}: a jumprelu SAE needs its threshold")
    with torch.no_grad():
        for name, shape in shapes.items():
            value = weights[name].float()
            if tuple(value.shape) != tuple(shape):
                raise VitscopeValueError(f"{folder}: {name} has shape {tuple(value.shape)}, expected {tuple(shape)}")
            getattr(sae, name).copy_(value)
    sae.hook = cfg.get("hook_name") or (cfg.get("metadata") or {}).get("hook_name") or ours.get("hook")
    sae.model = cfg.get("model_name") or (cfg.get("metadata") or {}).get("model_name") or ours.get("model")
    sae.tokens_of = (ours.get("training") or {}).get("tokens_of")
    return _finite(sae, folder).eval()
