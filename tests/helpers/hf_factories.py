"""Tiny randomly initialised transformers models of every supported family (built from configs, offline)."""

from __future__ import annotations

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


def make(kind: str, attn_implementation: str | None = None) -> torch.nn.Module:
    """A tiny model of ``kind``; ``attn_implementation="eager"`` builds the eager twin."""
    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if kind == "vit":
        return _seeded(lambda: tf.ViTModel(tf.ViTConfig(**SMALL, **kw), add_pooling_layer=False))
    if kind == "vit-cls":
        return _seeded(lambda: tf.ViTForImageClassification(tf.ViTConfig(**SMALL, num_labels=5, **kw)))
    if kind == "deit":
        cfg = tf.DeiTConfig(**SMALL, num_labels=5, **kw)
        return _seeded(lambda: tf.DeiTForImageClassificationWithTeacher(cfg))
    if kind == "dinov2":
        cfg = dict(SMALL)
        cfg.pop("intermediate_size")
        return _seeded(lambda: tf.Dinov2ForImageClassification(tf.Dinov2Config(**cfg, mlp_ratio=2, num_labels=5,
                                                                                 layerscale_value=0.5, **kw)))
    if kind == "dinov2-reg":
        cfg = dict(SMALL)
        cfg.pop("intermediate_size")
        return _seeded(lambda: tf.Dinov2WithRegistersModel(tf.Dinov2WithRegistersConfig(
            **cfg, mlp_ratio=2, num_register_tokens=3, layerscale_value=0.5, **kw)))
    if kind == "clip":
        return _seeded(lambda: tf.CLIPVisionModelWithProjection(tf.CLIPVisionConfig(**SMALL, projection_dim=16, **kw)))
    if kind == "clip-cls":
        vis = tf.CLIPVisionConfig(**SMALL)
        cfg = tf.CLIPConfig(vision_config=vis.to_dict(), text_config={"hidden_size": 16, "num_hidden_layers": 1,
                            "num_attention_heads": 2, "intermediate_size": 32}, num_labels=5, **kw)
        return _seeded(lambda: tf.CLIPForImageClassification(cfg))
    if kind == "siglip":
        return _seeded(lambda: tf.SiglipVisionModel(tf.SiglipVisionConfig(**SMALL, **kw)))
    if kind == "mae":
        return _seeded(lambda: tf.ViTMAEModel(tf.ViTMAEConfig(**SMALL, mask_ratio=0.0, **kw)))
    if kind == "beit":
        return _seeded(lambda: tf.BeitForImageClassification(tf.BeitConfig(
            **SMALL, use_relative_position_bias=True, use_mean_pooling=True, layer_scale_init_value=0.3,
            num_labels=5, **kw)))
    if kind == "beit-shared":
        return _seeded(lambda: tf.BeitModel(tf.BeitConfig(
            **SMALL, use_shared_relative_position_bias=True, use_mean_pooling=False, **kw)))
    if kind == "resnet":
        return _seeded(lambda: tf.ResNetForImageClassification(tf.ResNetConfig(
            embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)))
    if kind == "bit":
        cfg = tf.BitConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_groups=4)
        return _seeded(lambda: tf.BitModel(cfg))
    if kind == "convnext":
        return _seeded(lambda: tf.ConvNextForImageClassification(tf.ConvNextConfig(
            hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=5)))
    raise ValueError(kind)


TRANSFORMER_KINDS = ["vit", "vit-cls", "deit", "dinov2", "dinov2-reg", "clip", "clip-cls", "siglip", "mae", "beit",
                     "beit-shared"]
CNN_KINDS = ["resnet", "bit", "convnext"]
