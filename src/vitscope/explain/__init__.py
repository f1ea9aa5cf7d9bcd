"""Explanations of embeddings: paired similarity maps (paper 000)."""

from vitscope.explain.paired import Encoded, PairedSimilarity, PairExplanation

__all__ = ["Encoded", "PairExplanation", "PairedSimilarity"]
