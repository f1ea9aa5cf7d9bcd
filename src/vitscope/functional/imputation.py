"""Noisy linear imputation (ROAD: Rong et al. 2022, "A Consistent and Efficient Evaluation Strategy for Attribution
Methods"): removed pixels are filled so that each equals the weighted mean of its 8 neighbours (direct neighbours
1/6, diagonal ones 1/12, renormalised at the image's border), known pixels fixed, then Gaussian noise is added.
Unlike a constant fill, the filled image carries no outline of what was removed, so a deletion curve measures the
information removed rather than an out-of-distribution artefact. One sparse linear system per image (SciPy)."""

from __future__ import annotations

import numpy as np
import torch

from vitscope.errors import VitscopeValueError

__all__ = ["NEIGHBOURS", "noisy_linear_imputation"]

#: (dy, dx) -> weight of a neighbour (ROAD's)
NEIGHBOURS: tuple[tuple[int, int, float], ...] = (
    (0, 1, 1 / 6), (0, -1, 1 / 6), (1, 0, 1 / 6), (-1, 0, 1 / 6),
    (1, 1, 1 / 12), (1, -1, 1 / 12), (-1, 1, 1 / 12), (-1, -1, 1 / 12),
)


def _impute_one(image: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """``[C, H, W]`` float64 with the ``removed`` ``[H, W]`` pixels solved for."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.linalg import spsolve

    c, h, w = image.shape
    ys, xs = np.nonzero(removed)
    n = len(ys)
    if n == 0:
        return image
    if n == h * w:  # nothing known to interpolate from: the mean colour (0 in the model's normalisation)
        return np.zeros_like(image)
    index = -np.ones((h, w), dtype=np.int64)
    index[ys, xs] = np.arange(n)
    total = np.zeros(n)
    for dy, dx, weight in NEIGHBOURS:
        ny, nx = ys + dy, xs + dx
        total += weight * ((ny >= 0) & (ny < h) & (nx >= 0) & (nx < w))
    rows, cols, vals = [np.arange(n)], [np.arange(n)], [np.ones(n)]
    rhs = np.zeros((n, c))
    for dy, dx, weight in NEIGHBOURS:
        ny, nx = ys + dy, xs + dx
        inside = (ny >= 0) & (ny < h) & (nx >= 0) & (nx < w)
        share = np.where(inside, weight / total, 0.0)
        ny, nx = np.clip(ny, 0, h - 1), np.clip(nx, 0, w - 1)
        neighbour = index[ny, nx]
        unknown = inside & (neighbour >= 0)
        rows.append(np.nonzero(unknown)[0])
        cols.append(neighbour[unknown])
        vals.append(-share[unknown])
        known = inside & (neighbour < 0)
        rhs[known] += share[known, None] * image[:, ny[known], nx[known]].T
    a = csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    solved = spsolve(a, rhs)
    out = image.copy()
    out[:, ys, xs] = np.asarray(solved).reshape(n, c).T
    return out


def noisy_linear_imputation(images: torch.Tensor, removed: torch.Tensor, noise: float = 0.01,
                            generator: torch.Generator | None = None, draws: torch.Tensor | None = None
                            ) -> torch.Tensor:
    """Fill the ``removed`` pixels of every image by noisy linear imputation.

    Args:
        images: ``[B, C, H, W]`` (the model's normalised input, say).
        removed: ``[B, H, W]`` bool, True where a pixel is removed.
        noise: the standard deviation of the Gaussian noise added to the filled pixels (ROAD's 0.01).
        generator: the noise's random generator.
        draws: ``[B, C, H, W]`` standard normal draws to use instead of drawing from ``generator`` (so that an
            image's noise can come from a generator of its own, whatever else is in the batch).

    Returns:
        ``[B, C, H, W]`` in ``images``' dtype and device; known pixels unchanged.
    """
    if images.dim() != 4 or removed.shape != (images.shape[0], *images.shape[-2:]):
        raise VitscopeValueError(f"images [B, C, H, W] and removed [B, H, W] needed, got {tuple(images.shape)} and "
                                 f"{tuple(removed.shape)}")
    if noise < 0:
        raise VitscopeValueError(f"noise must be >= 0, got {noise}")
    filled = np.stack([_impute_one(im, m) for im, m in zip(images.detach().cpu().double().numpy(),
                                                          removed.detach().cpu().bool().numpy())])
    out = torch.from_numpy(filled)
    if noise > 0:
        if draws is None:
            draws = torch.randn(out.shape, generator=generator, dtype=torch.float64)
        elif tuple(draws.shape) != tuple(out.shape):
            raise VitscopeValueError(f"draws must be {list(out.shape)}, got {list(draws.shape)}")
        out = out + removed.cpu()[:, None].double() * draws.cpu().double() * noise
    return out.to(images.device, images.dtype)
