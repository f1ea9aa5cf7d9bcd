"""Sparse autoencoder modules, the tokens they read and their files (SAELens's layout, and other tools' files read in),
below the analyses so that an analysis can read an SAE; :mod:`vitscope.sae` trains and measures them."""
