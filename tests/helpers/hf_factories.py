"""Tiny randomly initialised transformers models of every supported family (built from configs, offline)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import transformers as tf

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
             patch_size=8)


def _seeded(build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build()
        # HF initialises relative position bias tables to zero; give them values so tests see the bias.
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "relative_position_bias_table" in name:
                    param.normal_(0.0, 1.0)
    return model.eval()


#: kind -> (is a CNN, builder(attention kwargs) -> model); one factory per kind, registered with @factory
FACTORIES: dict[str, tuple[bool, Callable[[dict], torch.nn.Module]]] = {}


def factory(kind: str, cnn: bool = False):
    """Register the tiny-model builder of ``kind`` (a new HF family adds one of these, beside its descriptor);
    the adapter contract tests run every registered kind (:func:`kinds`), wherever the factory sits."""
    def register(build: Callable[[dict], torch.nn.Module]) -> Callable[[dict], torch.nn.Module]:
        if kind in FACTORIES:
            raise ValueError(f"a test factory for {kind!r} is already registered")
        FACTORIES[kind] = (cnn, build)
        return build
    return register


def kinds(cnn: bool = False) -> list[str]:
    """The registered transformer kinds (CNN kinds with ``cnn``), in registration order: read when a test module
    is collected, after every factory of this file has registered (a list built here would miss the ones below)."""
    return [kind for kind, (is_cnn, _) in FACTORIES.items() if is_cnn == cnn]


def make(kind: str, attn_implementation: str | None = None) -> torch.nn.Module:
    """A tiny model of ``kind``; ``attn_implementation="eager"`` builds the eager twin."""
    if kind not in FACTORIES:
        raise ValueError(f"no test factory for {kind!r}; known: {sorted(FACTORIES)}")
    cnn, build = FACTORIES[kind]
    kw = {"attn_implementation": attn_implementation} if attn_implementation and not cnn else {}
    return _seeded(lambda: build(kw))


#: query and key projections of every family's attention (scaled by :func:`peaked`)
_QK = ("q_proj.weight", "k_proj.weight", "query.weight", "key.weight")


def peaked(model: torch.nn.Module, factor: float = 16.0) -> torch.nn.Module:
    """``model`` with its query and key projections scaled up, so that attention is far from uniform (random tiny
    models attend almost uniformly, where a missing rotation or bias would hardly show)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(_QK):
                param.mul_(factor)
    return model


def main_output(out) -> torch.Tensor:
    """The main tensor of a model's output: itself, or its logits, last hidden state or image embeddings."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state", "image_embeds"):
        if getattr(out, key, None) is not None:
            return getattr(out, key)
    raise AssertionError("no tensor output")


def _no_intermediate() -> dict:
    cfg = dict(SMALL)
    cfg.pop("intermediate_size")
    return cfg


@factory("vit")
def _vit(kw: dict) -> torch.nn.Module:
    return tf.ViTModel(tf.ViTConfig(**SMALL, **kw), add_pooling_layer=False)


@factory("vit-cls")
def _vit_cls(kw: dict) -> torch.nn.Module:
    return tf.ViTForImageClassification(tf.ViTConfig(**SMALL, num_labels=5, **kw))


@factory("deit")
def _deit(kw: dict) -> torch.nn.Module:
    return tf.DeiTForImageClassificationWithTeacher(tf.DeiTConfig(**SMALL, num_labels=5, **kw))


@factory("dinov2")
def _dinov2(kw: dict) -> torch.nn.Module:
    return tf.Dinov2ForImageClassification(tf.Dinov2Config(**_no_intermediate(), mlp_ratio=2, num_labels=5,
                                                           layerscale_value=0.5, **kw))


@factory("dinov2-swiglu")  # DINOv2 giant's gated MLP: mlp.post is 48 wide (2/3 of 64, up to a multiple of 8)
def _dinov2_swiglu(kw: dict) -> torch.nn.Module:
    return tf.Dinov2Model(tf.Dinov2Config(**_no_intermediate(), mlp_ratio=2, use_swiglu_ffn=True,
                                          layerscale_value=0.5, **kw))


@factory("dinov2-reg")
def _dinov2_reg(kw: dict) -> torch.nn.Module:
    return tf.Dinov2WithRegistersModel(tf.Dinov2WithRegistersConfig(
        **_no_intermediate(), mlp_ratio=2, num_register_tokens=3, layerscale_value=0.5, **kw))


@factory("clip")
def _clip(kw: dict) -> torch.nn.Module:
    return tf.CLIPVisionModelWithProjection(tf.CLIPVisionConfig(**SMALL, projection_dim=16, **kw))


@factory("clip-cls")
def _clip_cls(kw: dict) -> torch.nn.Module:
    vis = tf.CLIPVisionConfig(**SMALL)
    cfg = tf.CLIPConfig(vision_config=vis.to_dict(), text_config={"hidden_size": 16, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "intermediate_size": 32}, num_labels=5, **kw)
    return tf.CLIPForImageClassification(cfg)


@factory("siglip")
def _siglip(kw: dict) -> torch.nn.Module:
    return tf.SiglipVisionModel(tf.SiglipVisionConfig(**SMALL, **kw))


@factory("siglip2")
def _siglip2(kw: dict) -> torch.nn.Module:
    cfg = {k: v for k, v in SMALL.items() if k != "image_size"}
    return tf.Siglip2VisionModel(tf.Siglip2VisionConfig(**cfg, num_patches=16, **kw))


@factory("siglip2-cls")
def _siglip2_cls(kw: dict) -> torch.nn.Module:
    vis = {k: v for k, v in SMALL.items() if k != "image_size"} | {"num_patches": 16}
    cfg = tf.Siglip2Config(vision_config=vis, text_config={"hidden_size": 16, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "intermediate_size": 32}, num_labels=5, **kw)
    return tf.Siglip2ForImageClassification(cfg)


@factory("mae")
def _mae(kw: dict) -> torch.nn.Module:
    return tf.ViTMAEModel(tf.ViTMAEConfig(**SMALL, mask_ratio=0.0, **kw))


@factory("beit")
def _beit(kw: dict) -> torch.nn.Module:
    return tf.BeitForImageClassification(tf.BeitConfig(
        **SMALL, use_relative_position_bias=True, use_mean_pooling=True, layer_scale_init_value=0.3, num_labels=5,
        **kw))


@factory("beit-shared")
def _beit_shared(kw: dict) -> torch.nn.Module:
    return tf.BeitModel(tf.BeitConfig(**SMALL, use_shared_relative_position_bias=True, use_mean_pooling=False, **kw))


@factory("dinov3")
def _dinov3(kw: dict) -> torch.nn.Module:
    return tf.DINOv3ViTModel(tf.DINOv3ViTConfig(**SMALL, num_register_tokens=2, layerscale_value=0.5, **kw))


@factory("ijepa")
def _ijepa(kw: dict) -> torch.nn.Module:
    return tf.IJepaModel(tf.IJepaConfig(**SMALL, **kw), add_pooling_layer=False)


@factory("ijepa-cls")
def _ijepa_cls(kw: dict) -> torch.nn.Module:
    return tf.IJepaForImageClassification(tf.IJepaConfig(**SMALL, num_labels=5, **kw))


@factory("aimv2")
def _aimv2(kw: dict) -> torch.nn.Module:
    return tf.Aimv2VisionModel(tf.Aimv2VisionConfig(**SMALL, **kw))


@factory("aimv2-native")
def _aimv2_native(kw: dict) -> torch.nn.Module:
    return tf.Aimv2VisionModel(tf.Aimv2VisionConfig(**SMALL, is_native=True, **kw))


@factory("metaclip2")
def _metaclip2(kw: dict) -> torch.nn.Module:
    return tf.MetaClip2VisionModelWithProjection(tf.MetaClip2VisionConfig(**SMALL, projection_dim=16, **kw))


@factory("metaclip2-cls")
def _metaclip2_cls(kw: dict) -> torch.nn.Module:
    vis = tf.MetaClip2VisionConfig(**SMALL)
    cfg = tf.MetaClip2Config(vision_config=vis.to_dict(), text_config={"hidden_size": 16, "num_hidden_layers": 1,
                             "num_attention_heads": 2, "intermediate_size": 32}, num_labels=5, **kw)
    return tf.MetaClip2ForImageClassification(cfg)


@factory("resnet", cnn=True)
def _resnet(kw: dict) -> torch.nn.Module:
    return tf.ResNetForImageClassification(tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                                           num_labels=5))


@factory("bit", cnn=True)
def _bit(kw: dict) -> torch.nn.Module:
    return tf.BitModel(tf.BitConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_groups=4))


@factory("convnext", cnn=True)
def _convnext(kw: dict) -> torch.nn.Module:
    return tf.ConvNextForImageClassification(tf.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                                               num_labels=5))

