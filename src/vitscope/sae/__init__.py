"""Sparse autoencoders of a model's activations: the modules (:class:`SparseAutoencoder`), their training from the
stream of passes over the data (:func:`train`, :class:`SAETraining`; ``vitscope sae train``), their measurement on
held-out images (:func:`evaluate`; ``vitscope sae eval``), steering and ablating their latents through
``backbone.intervene`` (:func:`steer_latent` beside :func:`random_direction`, :func:`ablate_latents`), their files
in SAELens's layout (:func:`load`, :func:`save`), and how well their latents recover the synthetic world's known
concepts beside PCA, ICA, k-means, random directions and the model's neurons (:func:`benchmark`,
:class:`SAEBenchmark`, :func:`concept_labels`; ``vitscope sae benchmark``)."""

from vitscope.autoencoders.files import load, save
from vitscope.autoencoders.model import KINDS, SparseAutoencoder
from vitscope.sae.benchmark import SAEBenchmark, benchmark
from vitscope.sae.concepts import Concept, concept_labels, world_concepts
from vitscope.sae.edits import ablate_latents, random_direction, steer_latent
from vitscope.sae.evaluate import evaluate
from vitscope.sae.training import SAETraining, train

__all__ = ["KINDS", "Concept", "SAEBenchmark", "SAETraining", "SparseAutoencoder", "ablate_latents", "benchmark",
           "concept_labels", "evaluate", "load", "random_direction", "save", "steer_latent", "train",
           "world_concepts"]
