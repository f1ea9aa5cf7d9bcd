"""Representation similarity (paper 002): CKA between blocks and along the residual stream, its HSIC state."""
