"""Per-channel activation statistics: mean activations and the top-activating images (paper 001)."""
