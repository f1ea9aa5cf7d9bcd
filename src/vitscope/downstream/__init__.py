"""Downstream probes over whole benchmarks (paper 002 section 6): features extracted once, then scored.

Revisited Oxford/Paris retrieval, DAVIS label propagation and SPair keypoint transfer need a whole benchmark at
once, so they extract per-block features through the engine (:func:`vitscope.engine.extract.extract_features`,
cached on disk) and score them; :func:`probe_sweep` runs every probe the data allows, the streaming ones
(k-NN, linear, clustering) included.
"""

from vitscope.downstream.davis import davis_probe
from vitscope.downstream.keypoints import keypoint_probe
from vitscope.downstream.retrieval import retrieval_probe
from vitscope.downstream.sweep import probe_sweep

__all__ = ["davis_probe", "keypoint_probe", "probe_sweep", "retrieval_probe"]
