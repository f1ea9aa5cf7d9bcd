"""Small fake specs and records of the canonical hook shapes, for analysis tests (not a test module)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import numpy as np
import torch

from vitscope.analyses.base import Batch
from vitscope.hooks.names import cnn_hook_names, expand_names, split_block_name, transformer_hook_names
from vitscope.models.spec import ModelSpec

SPEC_KINDS: tuple[str, ...] = ("transformer", "cnn")
#: kinds backed by a real tiny classifier (random weights): for analyses that re-run the model (masking)
MODEL_KINDS: tuple[str, ...] = ("vit-classifier", "cnn-classifier")
NUM_FAKE_LABELS = 3  # batch.targets["label"] = index % 3 (no random draws)


@functools.lru_cache(maxsize=2)
def classifier(kind: str):
    """A tiny classifier with random weights (seeded), 32 px input: ``vit-classifier`` or ``cnn-classifier``."""
    from vitscope.models.wrap import build_tiny_resnet, build_tiny_vit

    torch.manual_seed(0)
    if kind == "vit-classifier":
        return build_tiny_vit("fake-vit-head", num_classes=NUM_FAKE_LABELS, image_size=32, patch_size=8, embed_dim=16,
                              depth=2, num_heads=2).eval()
    if kind == "cnn-classifier":
        return build_tiny_resnet("fake-cnn-head", num_classes=NUM_FAKE_LABELS, image_size=32,
                                 widths=(8, 8, 8, 8)).eval()
    raise ValueError(f"unknown classifier kind {kind!r}; use one of {MODEL_KINDS}")


def fake_spec(kind: str = "transformer") -> ModelSpec:
    """A tiny ModelSpec: 3 blocks (stages), non-square 3 x 4 grid, 12 x 16 pixel input.

    Transformer: 2 heads, width 8, MLP 16, patch 4, one ``"cls"`` prefix token (N = 13).
    CNN: 3 stages, 8 channels in the last map, total stride 4, no prefix tokens.
    """
    if kind == "transformer":
        return ModelSpec(
            name="fake-vit", family="tiny-vit", kind="transformer", num_blocks=3, num_heads=2, embed_dim=8,
            mlp_dim=16, patch_size=4, grid=(3, 4), num_prefix_tokens=1, prefix_kinds=("cls",),
            image_size=(12, 16),
        )
    if kind in MODEL_KINDS:
        return classifier(kind).spec
    if kind == "cnn":
        return ModelSpec(
            name="fake-cnn", family="resnet", kind="cnn", num_blocks=3, num_heads=0, embed_dim=8,
            mlp_dim=0, patch_size=4, grid=(3, 4), num_prefix_tokens=0, prefix_kinds=(),
            image_size=(12, 16),
        )
    raise ValueError(f"unknown fake spec kind {kind!r}; use one of {SPEC_KINDS}")


def hook_names(spec: ModelSpec) -> list[str]:
    """Every canonical hook name of ``spec``."""
    if spec.is_transformer:
        return transformer_hook_names(spec.num_blocks)
    return cnn_hook_names(spec.num_blocks)


def _cnn_shape(spec: ModelSpec, name: str, b: int) -> tuple[int, ...]:
    """Stage i of S has stride ``patch / 2^(S-1-i)`` and ``D / 2^(S-1-i)`` channels; embed = stage 0."""
    s = spec.num_blocks
    if name == "features":
        level = 0
    elif name == "embed":
        level = s - 1
    else:
        level = s - 1 - int(name.split(".")[1])
    h, w = spec.grid
    return (b, max(1, spec.embed_dim >> level), h << level, w << level)


def _transformer_shape(spec: ModelSpec, name: str, b: int) -> tuple[int, ...]:
    n, d, heads = spec.num_tokens, spec.embed_dim, spec.num_heads
    site = split_block_name(name)[1] if split_block_name(name) else name
    if site == "attn.pattern":
        return (b, heads, n, n)
    if site in ("attn.q", "attn.k", "attn.v"):
        return (b, heads, n, d // heads)
    if site == "mlp.post":
        return (b, n, spec.mlp_dim)
    return (b, n, d)


def fake_record(
    spec: ModelSpec,
    names_or_patterns: Sequence[str] | str,
    batch_size: int,
    generator: torch.Generator,
    start_index: int = 0,
) -> tuple[dict[str, torch.Tensor], Batch]:
    """Random tensors of the canonical shapes for every name matched, plus a matching Batch.

    ``attn.pattern`` is the float32 softmax of random logits (rows sum to 1); every other tensor
    is standard normal float32. ``batch.targets["masks"]`` holds :func:`fake_masks` of every image and
    ``batch.targets["label"]`` the image labels ``index % NUM_FAKE_LABELS``.

    Args:
        spec: from :func:`fake_spec`.
        names_or_patterns: canonical names or glob patterns (``blocks.*.attn.pattern``).
        batch_size: B.
        generator: seeded ``torch.Generator``; the same seed gives the same record.
        start_index: dataset index of the first image (so batches get distinct indices).

    Returns:
        ``(record, batch)``.
    """
    if spec.name.startswith("fake-") and spec.name.endswith("-head"):
        return _model_record(spec, names_or_patterns, batch_size, generator, start_index)
    names = expand_names(names_or_patterns, hook_names(spec), model=spec.name)
    record: dict[str, torch.Tensor] = {}
    for name in names:
        shape = _transformer_shape(spec, name, batch_size) if spec.is_transformer else _cnn_shape(
            spec, name, batch_size
        )
        x = torch.randn(shape, generator=generator, dtype=torch.float32)
        if name.endswith("attn.pattern"):
            x = torch.softmax(3.0 * x, dim=-1)
        record[name] = x
    pixels = torch.randn((batch_size, 3, *spec.image_size), generator=generator)
    indices = list(range(start_index, start_index + batch_size))
    batch = Batch(pixels=pixels, indices=indices, paths=[f"img_{i:04d}.png" for i in indices], spec=spec,
                  grid=spec.grid, targets={"masks": [fake_masks(spec, i) for i in indices],
                                           "label": [i % NUM_FAKE_LABELS for i in indices]})
    return record, batch


def fake_masks(spec: ModelSpec, index: int) -> np.ndarray:
    """Instance masks ``[n, H, W]`` bool of fake image ``index`` at the input size (no random draws).

    Image ``i`` has one rectangle shifted with ``i`` and, for odd ``i``, a second one; every fifth image
    (``i % 5 == 4``) has no instance at all.
    """
    h, w = spec.image_size
    if index % 5 == 4:
        return np.zeros((0, h, w), dtype=bool)
    masks = np.zeros((1 + index % 2, h, w), dtype=bool)
    top, left = index % max(1, h // 2), (2 * index) % max(1, w // 2)
    masks[0, top:top + h // 2, left:left + w // 2] = True
    if index % 2:
        masks[1, h - h // 4:, : w // 3] = True
    return masks


def _model_record(spec: ModelSpec, names_or_patterns: Sequence[str] | str, batch_size: int,
                  generator: torch.Generator, start_index: int) -> tuple[dict[str, torch.Tensor], Batch]:
    """A real forward of the tiny classifier of ``spec`` on random pixels; the batch carries the model."""
    from vitscope.analyses.batch import ModelRunner

    backbone = classifier("vit-classifier" if spec.is_transformer else "cnn-classifier")
    pixels = torch.randn((batch_size, 3, *spec.image_size), generator=generator)
    names = list(names_or_patterns) if not isinstance(names_or_patterns, str) else [names_or_patterns]
    with torch.no_grad(), backbone.record(names) if names else contextlib.nullcontext() as rec:
        backbone(pixels)
        record = dict(rec.items()) if rec is not None else {}
    indices = list(range(start_index, start_index + batch_size))
    batch = Batch(pixels=pixels, indices=indices, paths=[f"img_{i:04d}.png" for i in indices], spec=spec,
                  grid=spec.grid, targets={"masks": [fake_masks(spec, i) for i in indices],
                                           "label": [i % NUM_FAKE_LABELS for i in indices]},
                  model=ModelRunner(backbone))
    return record, batch


def analysis_kinds(cls, first_model_only: bool = False) -> list[str]:
    """The fake kinds an analysis runs on: the fake specs it supports, or, for an analysis that needs a classifier
    or re-runs the model (masking, ablations), the real tiny classifiers (``first_model_only``: one of them)."""
    fake = [] if cls.reruns_model else [kind for kind in SPEC_KINDS if construct(cls, fake_spec(kind)).supports(
        fake_spec(kind))]
    models = [kind for kind in MODEL_KINDS if construct(cls, fake_spec(kind)).supports(fake_spec(kind))]
    return fake or (models[:1] if first_model_only else models)


_FOLDERS: dict[tuple, str] = {}


def sae_folder(spec: ModelSpec) -> str:
    """A folder holding an SAE (random weights, seeded) of ``spec``'s last block output (a CNN: its last stage), for
    analyses that read one; made once per process."""
    import atexit
    import shutil
    import tempfile

    from vitscope.autoencoders.files import save
    from vitscope.autoencoders.model import SparseAutoencoder

    hook = f"blocks.{spec.num_blocks - 1}.resid_post" if spec.is_transformer else f"stages.{spec.num_blocks - 1}"
    key = (spec.name, hook, spec.embed_dim)
    if key not in _FOLDERS:
        folder = tempfile.mkdtemp(prefix="vitscope-sae-")
        atexit.register(shutil.rmtree, folder, True)
        save(SparseAutoencoder(spec.embed_dim, 12, kind="topk", k=3, seed=5), folder, hook=hook)
        _FOLDERS[key] = folder
    return _FOLDERS[key]


#: analyses that cannot run without a file made for the model (an SAE): what they get, per spec
NEEDS = {"sae_features": lambda spec: {"path": sae_folder(spec), "featviz_steps": 0}}


def construct(cls_or_name, spec: ModelSpec | None = None, **params):
    """An analysis as the contract tests run it: its defaults (and ``params``), and for one that needs a file made
    for the model (:data:`NEEDS`) that file, made for ``spec``."""
    from vitscope.analyses import ANALYSES

    cls = ANALYSES[cls_or_name] if isinstance(cls_or_name, str) else cls_or_name
    needs = NEEDS.get(getattr(cls, "name", ""))
    return cls(**{**(needs(spec or fake_spec()) if needs else {}), **params})


def give_reference(acc, spec: ModelSpec) -> None:
    """What vitscope.run does before a pass for an analysis with a reference set: the hooks it names, recorded on
    the reference images (here the fake data's first ones, whatever the batches)."""
    hooks = acc.reference_hooks(spec)
    if hooks:
        record, _ = fake_record(spec, hooks, acc.reference_images, torch.Generator().manual_seed(99), start_index=0)
        acc.set_reference(record)
