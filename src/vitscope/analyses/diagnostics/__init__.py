"""Analyses that check a model for known failure modes: artifacts (high-norm tokens, sinks, massive activations)."""
