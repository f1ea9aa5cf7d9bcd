"""Sparse autoencoders of a model's activations: the modules (:class:`SparseAutoencoder`) and their files in
SAELens's layout (:func:`load`, :func:`save`)."""

from vitscope.sae.io import load, save
from vitscope.sae.model import KINDS, SparseAutoencoder

__all__ = ["KINDS", "SparseAutoencoder", "load", "save"]
