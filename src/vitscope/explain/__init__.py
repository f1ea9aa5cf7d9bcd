"""Explanations of embeddings: paired similarity maps (paper 000), retrieval, class maps, faithfulness."""

from vitscope.explain.across_models import explain_pairs_across_models, retrieve_across_models
from vitscope.explain.class_maps import class_similarity_maps
from vitscope.explain.explained_retrieval import RetrievalExplanation, explain_retrieval, sop_tensors
from vitscope.explain.faithfulness import FaithfulnessCurves, faithfulness_curves
from vitscope.explain.paired import Encoded, PairedSimilarity, PairExplanation
from vitscope.explain.semantic import pose_similarity_at_k, scene_segmentations

__all__ = [
    "Encoded", "FaithfulnessCurves", "PairExplanation", "PairedSimilarity", "RetrievalExplanation",
    "class_similarity_maps", "explain_pairs_across_models", "explain_retrieval", "faithfulness_curves",
    "pose_similarity_at_k", "retrieve_across_models", "scene_segmentations", "sop_tensors",
]
