"""The zoo's held-out protocol: which images score a model, and the baselines it must beat.

* Training images: scenes ``0..train_images-1`` of the world with seed ``data_seed``.
* k-NN bank: the first ``BANK_SIZE`` training scenes (labels used only by the probe, as DINO's k-NN).
* Test: ``TEST_SIZE`` scenes of the world with seed ``data_seed + HELDOUT_OFFSET`` (never trained on).
* Metric models train on the identities ``instance % 20 < 10`` and are scored by leave-one-out
  Recall@1 among the test scenes of the other identities (SOP's protocol: unseen products).

Baselines on the same images: the randomly initialised twin (same architecture and seed, untrained)
and a raw-pixel model (the normalised image flattened: k-NN accuracy, or Recall@1 for metric models).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from vitscope.errors import VitscopeValueError
from vitscope.models.backbone import Backbone
from vitscope.train import evaluate as ev
from vitscope.train.data import TensorImages, synthetic_split
from vitscope.zoo.catalog import ZooEntry

__all__ = ["BANK_SIZE", "HELDOUT_OFFSET", "TEST_SIZE", "HeldOut", "entry_sets", "heldout_sets", "is_training_identity",
           "pixel_score", "score"]

BANK_SIZE = 2000
TEST_SIZE = 1000
HELDOUT_OFFSET = 10_000
INSTANCES_PER_CLASS = 20  # the synthetic world's default


def is_training_identity(instances: torch.Tensor) -> torch.Tensor:
    """Which instance ids metric models train on (the first half of every class's instances)."""
    return instances % INSTANCES_PER_CLASS < INSTANCES_PER_CLASS // 2


@dataclass
class HeldOut:
    """The scoring images of one data seed (k-NN bank from training scenes, test from held-out scenes)."""

    bank: TensorImages
    test: TensorImages

    @property
    def unseen_identities(self) -> TensorImages:
        return self.test.subset(~is_training_identity(self.test.instances))


@lru_cache(maxsize=2)
def heldout_sets(data_seed: int, size: int = 64, spurious: float | None = None) -> HeldOut:
    """Render (once per process) the bank and test images for ``data_seed`` at ``size`` pixels.

    ``spurious`` renders both from the world whose backgrounds follow the class with that probability.
    """
    return HeldOut(synthetic_split(BANK_SIZE, data_seed, size=size, spurious=spurious),
                   synthetic_split(TEST_SIZE, data_seed + HELDOUT_OFFSET, size=size, spurious=spurious))


def entry_sets(entry: ZooEntry) -> HeldOut:
    """The held-out sets that score ``entry`` (its data seed, image size and background correlation)."""
    return heldout_sets(entry.data_seed, int(entry.model.get("image_size", 64)), entry.spurious)


def score(entry: ZooEntry, backbone: Backbone, sets: HeldOut) -> float:
    """The entry's held-out score of ``backbone`` (see the module docstring)."""
    if entry.score == "accuracy":
        return ev.classifier_accuracy(ev.extract(backbone, sets.test.images, "output"), sets.test.labels)
    if entry.score == "knn":
        bank = ev.extract(backbone, sets.bank.images, entry.features)
        test = ev.extract(backbone, sets.test.images, entry.features)
        return ev.knn_accuracy(bank, sets.bank.labels, test, sets.test.labels)
    if entry.score == "recall@1":
        unseen = sets.unseen_identities
        return ev.recall_at_1(ev.extract(backbone, unseen.images, "output"), unseen.instances)
    raise VitscopeValueError(f"unknown score kind '{entry.score}'")


def pixel_score(entry: ZooEntry, backbone: Backbone, sets: HeldOut) -> float:
    """The raw-pixel baseline for the entry's task (pixels normalised with the model's mean and std)."""
    mean, std = backbone.spec.mean, backbone.spec.std
    if entry.score == "recall@1":
        unseen = sets.unseen_identities
        return ev.recall_at_1(ev.pixel_features(unseen.images, mean, std), unseen.instances)
    bank = ev.pixel_features(sets.bank.images, mean, std)
    return ev.knn_accuracy(bank, sets.bank.labels, ev.pixel_features(sets.test.images, mean, std), sets.test.labels)
