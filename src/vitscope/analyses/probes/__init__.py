"""Streaming per-block probes: k-NN, linear and clustering on rows kept on disk, and their result type."""
