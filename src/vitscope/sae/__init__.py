"""Sparse autoencoders of a model's activations: the modules (:class:`SparseAutoencoder`), their training from the
stream of passes over the data (:func:`train`, :class:`SAETraining`; ``vitscope sae train``), their measurement on
held-out images (:func:`evaluate`; ``vitscope sae eval``) and their files in SAELens's layout (:func:`load`,
:func:`save`)."""

from vitscope.sae.evaluate import evaluate
from vitscope.sae.io import load, save
from vitscope.sae.model import KINDS, SparseAutoencoder
from vitscope.sae.training import SAETraining, train

__all__ = ["KINDS", "SAETraining", "SparseAutoencoder", "evaluate", "load", "save", "train"]
