"""Attention analyses (papers 001 and 003): statistics, maps, geometry, saliency, focus, rollout, SIFT interrelation.

They share one per-block pass over each attention pattern (:mod:`.suite`), declared by :mod:`.base`.
"""
