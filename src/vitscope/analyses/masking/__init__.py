"""Analyses that run the model again on changed images: foreground and frequency masking, SIFT-guided masking."""
