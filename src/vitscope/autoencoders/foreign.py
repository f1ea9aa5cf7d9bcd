"""Sparse autoencoders saved by other tools, read into :class:`~vitscope.autoencoders.model.SparseAutoencoder`.

- **ViT-Prisma** (``vit_prisma.sae.SparseAutoencoder``): a folder with ``config.json`` and ``weights.pt`` or
  ``n_images_<N>.pt``; the file is a bare state dict, or ``save_model``'s ``{"cfg", "state_dict"}`` (its config
  pickled as a ``vit_prisma`` class: read through torch's weights-only unpickler with a stand-in for that one class).
  ``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec [d_sae, d_in]``, ``b_dec``; the decoder bias is subtracted before
  encoding; ``activation_fn_str`` ``relu`` or ``topk`` (``activation_fn_kwargs.k``); ``normalize_activations``
  ``layer_norm`` (the default when absent), ``none`` or ``constant_norm_rescale`` (refused: it depends on each
  token's norm in a way a file cannot fold); the tokens it was trained on from ``cls_token_only`` (the CLS token)
  and ``use_patches_only`` (every token after the first), else all of them.
- **overcomplete** (``overcomplete.sae``): ``torch.save(model.state_dict())``: ``encoder.final_block.0.weight``
  ``[d_sae, d_in]`` (so ``W_enc`` is its transpose) and ``.bias``, ``dictionary._weights [d_sae, d_in]`` (normalised
  to unit rows and multiplied by ``exp(dictionary.multiplier)`` when read, as the library does), no decoder bias and
  no centring; a tied encoder (``SAE.tied()``: no encoder weight) encodes with the dictionary's transpose plus its
  ``encoder.bias`` when it has one; ``thresholds`` (log-thresholds) make a JumpReLU SAE. ``k`` is not in the file:
  pass it for a top-k SAE. A whole pickled module is refused (it would run the library's code): save its
  ``state_dict()``.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from vitscope.autoencoders.model import SparseAutoencoder
from vitscope.errors import VitscopeFileNotFoundError, VitscopeValueError

__all__ = ["is_prisma_file", "load_overcomplete", "load_prisma", "prisma_weights", "read_json_object"]


def is_prisma_file(path: Path) -> bool:
    """Whether ``path`` is a ViT-Prisma weights file (``weights.pt`` or ``n_images_<N>.pt`` beside a
    ``config.json``): any of a folder's checkpoints, not only the one :func:`prisma_weights` picks."""
    named = path.name == "weights.pt" or re.fullmatch(r"n_images_\d+\.pt", path.name) is not None
    return named and path.is_file() and (path.parent / "config.json").is_file()


def prisma_weights(folder: Path) -> Path | None:
    """The weights file of a ViT-Prisma SAE folder (``weights.pt``, else the last ``n_images_<N>.pt``), or None."""
    if (folder / "weights.pt").is_file():
        return folder / "weights.pt"
    found = sorted(folder.glob("n_images_*.pt"), key=lambda p: (len(p.name), p.name))
    found = [p for p in found if "sparsity" not in p.name]
    return found[-1] if found else None


class _PrismaConfig:
    """Stand-in for ``vit_prisma.sae.config.VisionModelSAERunnerConfig``: its fields land in ``__dict__``."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


_PrismaConfig.__module__, _PrismaConfig.__qualname__ = "vit_prisma.sae.config", "VisionModelSAERunnerConfig"
_PrismaConfig.__name__ = "VisionModelSAERunnerConfig"


def _torch_file(path: Path) -> Any:
    """A torch file through the weights-only unpickler (the Prisma config class allowed as a plain record)."""
    try:
        with torch.serialization.safe_globals([_PrismaConfig, torch.device]), warnings.catch_warnings():
            # torch warns of a plain pickle's protocol before refusing it: the refusal alone is the message
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise VitscopeValueError(f"{path} is not a file of tensors vitscope reads safely ({_reason(path, err)}); "
                                 "save the SAE's state_dict()") from None


def _reason(path: Path, err: Exception) -> str:
    """Why ``path`` could not be read, in a few words (an empty file's EOFError has no message; torch's advice to
    load the file unsafely is left out: vitscope never does)."""
    text = str(err).strip()
    if text.startswith("Weights only load failed"):
        detail = text.partition("WeightsUnpickler error:")[2].strip().splitlines()
        return "the safe unpickler refuses it" + (f": {detail[0].strip()}" if detail else "")
    if text:
        return text.splitlines()[0]
    return "an empty file" if path.is_file() and path.stat().st_size == 0 else type(err).__name__


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``.

    Raises:
        VitscopeValueError: a file that is not JSON (torn, or another format) or holds no JSON object.
    """
    try:
        found = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise VitscopeValueError(f"{path} is not readable JSON ({err})") from None
    except RecursionError:
        raise VitscopeValueError(f"{path} is not readable JSON (nested too deeply)") from None
    if not isinstance(found, dict):
        raise VitscopeValueError(f"{path} is not a JSON object (it holds a {type(found).__name__})")
    return found


def _set(sae: SparseAutoencoder, weights: dict[str, torch.Tensor], where: Path) -> SparseAutoencoder:
    with torch.no_grad():
        for name, value in weights.items():
            held = getattr(sae, name)
            if tuple(value.shape) != tuple(held.shape):
                raise VitscopeValueError(f"{where}: {name} has shape {tuple(value.shape)}, expected "
                                         f"{tuple(held.shape)}")
            held.copy_(value.float())
    return sae.eval()


def load_prisma(folder: Path, weights_path: Path | None = None) -> SparseAutoencoder:
    """A ViT-Prisma SAE folder (see the module docstring); ``weights_path``: one of its checkpoints (default: the
    one :func:`prisma_weights` picks)."""
    weights_path = weights_path or prisma_weights(folder)
    if weights_path is None:
        raise VitscopeFileNotFoundError(f"{folder} holds no ViT-Prisma weights (weights.pt or n_images_<N>.pt)")
    loaded = _torch_file(weights_path)
    state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else loaded
    cfg: dict[str, Any] = {}
    if isinstance(loaded, dict) and "cfg" in loaded:
        cfg = dict(vars(loaded["cfg"])) if not isinstance(loaded["cfg"], dict) else dict(loaded["cfg"])
    if (folder / "config.json").is_file():
        cfg.update(read_json_object(folder / "config.json"))
    if cfg.get("architecture", "standard") != "standard" or cfg.get("is_transcoder"):
        raise VitscopeValueError(f"{folder}: a ViT-Prisma {cfg.get('architecture')} SAE"
                                 f"{' (transcoder)' if cfg.get('is_transcoder') else ''}; vitscope reads standard ones")
    norm = cfg.get("normalize_activations", "layer_norm")
    if norm not in ("layer_norm", "none", None):
        raise VitscopeValueError(f"{folder}: activations normalised by {norm!r}, which vitscope does not fold")
    activation = cfg.get("activation_fn_str", "relu")
    if activation not in ("relu", "topk"):
        raise VitscopeValueError(f"{folder}: activation {activation!r}; vitscope reads relu and topk")
    d_in, d_sae = state["W_enc"].shape
    k = int((cfg.get("activation_fn_kwargs") or {}).get("k", min(32, d_sae)))
    sae = SparseAutoencoder(int(d_in), int(d_sae), kind="topk" if activation == "topk" else "relu", k=min(k, d_sae),
                            token_norm="layer_norm" if norm == "layer_norm" else None)
    sae = _set(sae, {n: state[n] for n in ("W_enc", "b_enc", "W_dec", "b_dec")}, weights_path)
    layer = cfg.get("hook_point_layer")
    sae.hook = cfg.get("hook_point") or (f"blocks.{layer}.{cfg.get('layer_subtype', 'ln2.hook_normalized')}"
                                         if layer is not None else None)
    sae.model = cfg.get("model_name")
    # the tokens its runner trained on: the CLS alone, the patches (every token after the first), or all of them
    sae.tokens_of = "cls" if cfg.get("cls_token_only") else ("spatial" if cfg.get("use_patches_only") else "all")
    return sae


def load_overcomplete(path: Path, k: int | None = None) -> SparseAutoencoder:
    """An overcomplete state dict (see the module docstring); ``k``: the top-k of a ``TopKSAE``."""
    state = _torch_file(path)
    if not isinstance(state, dict) or "dictionary._weights" not in state:
        raise VitscopeValueError(f"{path} is not an overcomplete SAE's state_dict (no dictionary._weights)")
    refused = [key for key in state if key.startswith(("encoder.final_block.1", "encoder.mlp_blocks", "Q",
                                                        "dictionary.C", "dictionary.W", "dictionary.Relax"))]
    if refused:
        raise VitscopeValueError(f"{path}: an overcomplete SAE with a non-linear encoder or another dictionary "
                                 f"({refused[0]}...); vitscope reads linear encoders")
    raw = state["dictionary._weights"].float()
    multiplier = float(state.get("dictionary.multiplier", torch.zeros(())))
    w_dec = raw / (raw.norm(dim=1, keepdim=True) + 1e-8) * torch.exp(torch.tensor(multiplier))
    if "encoder.final_block.0.weight" in state:
        w_enc, b_enc = state["encoder.final_block.0.weight"].float().T, state["encoder.final_block.0.bias"].float()
    elif "encoder.weight" in state:
        w_enc = state["encoder.weight"].float().T
        b_enc = state.get("encoder.bias", torch.zeros(w_enc.shape[1])).float()
    else:  # tied: the encoder is the dictionary's transpose, its bias (if any) its own
        w_enc, b_enc = w_dec.T.clone(), state.get("encoder.bias", torch.zeros(w_dec.shape[0])).float()
    d_sae, d_in = w_dec.shape
    jump = "thresholds" in state
    kind = "jumprelu" if jump else ("topk" if k is not None else "relu")
    sae = SparseAutoencoder(int(d_in), int(d_sae), kind=kind, k=min(int(k or 1), d_sae), b_dec_in_input=False)
    weights = {"W_enc": w_enc, "b_enc": b_enc, "W_dec": w_dec, "b_dec": torch.zeros(d_in)}
    if jump:
        weights["threshold"] = torch.exp(state["thresholds"].float())
    sae = _set(sae, weights, path)
    sae.hook, sae.model = None, None
    return sae
