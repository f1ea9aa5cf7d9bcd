"""Linear CKA, full-batch and minibatch (docs/methods.md, Representations, "Linear CKA" and "Minibatch CKA").

Pure tensor functions: no I/O, no plotting, no global state. All HSIC arithmetic runs in float64
whatever the input dtype; scalars come back as Python floats.

Conventions (docs/methods.md, Representations):

- Gram ``K = X X^T`` of the raw features, double-centred before either estimator (both are invariant to it;
  it keeps a large common offset of the features from cancelling in float64 sums).
- Biased HSIC: ``tr(K H L H) / (n-1)^2`` with ``H = I - 1/n``.
- Unbiased HSIC (Song et al. 2012): zero the diagonals of K and L, then
  ``[tr(K L) + 1^T K 1 * 1^T L 1 / ((n-1)(n-2)) - 2/(n-2) * 1^T K L 1] / (n (n-3))``.
- ``CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))``.
- Minibatch CKA (Nguyen et al. 2021): per consecutive minibatch the three unbiased HSICs, each averaged
  over minibatches weighted by minibatch size; a final minibatch of fewer than 4 examples is dropped.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from vitscope.errors import VitscopeTypeError, VitscopeValueError

__all__ = [
    "centred_grams",
    "features_for_cka",
    "gram_linear",
    "hsic",
    "linear_cka",
    "minibatch_cka",
    "minibatch_hsic_terms",
]

TokenSelection = Literal["all", "cls", "spatial", "spatial_mean"]
_TOKEN_MODES = ("all", "cls", "spatial", "spatial_mean")
_MIN_UNBIASED = 4  # the unbiased estimator divides by n (n - 3) and (n - 2)
#: a centred Gram this small against its Gram is round-off: the representation has no variance over the examples
_FLAT = 1e-10


def _as_examples(x: torch.Tensor, name: str) -> torch.Tensor:
    """``[n, ...]`` tensor -> ``[n, F]`` float64 (trailing dims flattened)."""
    if not isinstance(x, torch.Tensor):
        raise VitscopeTypeError(f"{name} must be a torch.Tensor [n, d], got {type(x).__name__}")
    if x.dim() < 2:
        raise VitscopeValueError(f"{name} must be [n, d] (one row per example), got shape {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise VitscopeValueError(f"{name} has no examples (shape {tuple(x.shape)}); CKA needs at least 2")
    return x.detach().reshape(x.shape[0], -1).to(torch.float64)


def _check_pair(x: torch.Tensor, y: torch.Tensor) -> None:
    if x.shape[0] != y.shape[0]:
        raise VitscopeValueError(f"x and y must hold the same examples: got {x.shape[0]} and {y.shape[0]} rows")


def gram_linear(x: torch.Tensor) -> torch.Tensor:
    """Linear Gram matrix ``K = X X^T`` in float64.

    Args:
        x: ``[n, d]`` features, one row per example (trailing dims are flattened).

    Returns:
        ``[n, n]`` float64 Gram matrix.
    """
    x = _as_examples(x, "x")
    return x @ x.T


def _check_gram(k: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(k, torch.Tensor):
        raise VitscopeTypeError(f"{name} must be a torch.Tensor Gram matrix [n, n], got {type(k).__name__}")
    if k.dim() != 2 or k.shape[0] != k.shape[1]:
        raise VitscopeValueError(f"{name} must be a square Gram matrix [n, n], got shape {tuple(k.shape)}")
    return k.detach().to(torch.float64)


def centred_grams(k: torch.Tensor) -> torch.Tensor:
    """``H K H`` of each symmetric Gram, with ``H = I - 1/n``.

    Both estimators are invariant to it (the unbiased one annihilates every ``a_i + a_j + c``), and it keeps a
    large common offset of the features from cancelling inside their sums. A Gram whose centred part is under
    ``1e-10`` of its Frobenius norm (a representation without variance across the examples, up to round-off)
    becomes exactly zero, so its self-HSIC is 0 and its CKA NaN instead of round-off over round-off.

    Args:
        k: ``[..., n, n]`` float64 Grams.

    Returns:
        ``[..., n, n]`` float64, a new tensor.
    """
    kc = k.clone()  # one copy, centred in place: the Grams of a large n are what bounds memory
    kc.sub_(k.mean(dim=-2, keepdim=True)).sub_(k.mean(dim=-1, keepdim=True)).add_(k.mean(dim=(-2, -1), keepdim=True))
    flat = kc.flatten(-2).norm(dim=-1) <= _FLAT * k.flatten(-2).norm(dim=-1)
    if flat.dim() == 0:
        return kc.zero_() if bool(flat) else kc
    kc[flat] = 0.0
    return kc


def hsic(k: torch.Tensor, l: torch.Tensor, unbiased: bool = False) -> float:  # noqa: E741
    """Hilbert-Schmidt independence criterion of two Gram matrices.

    Biased: ``tr(K H L H) / (n-1)^2`` with ``H = I - 1/n``. Unbiased (Song et al. 2012): the
    diagonals of copies of K and L are zeroed here (the caller's tensors are untouched), then
    ``[tr(K L) + 1^T K 1 * 1^T L 1 / ((n-1)(n-2)) - 2/(n-2) * 1^T K L 1] / (n (n-3))``.
    Computed in float64.

    Args:
        k: ``[n, n]`` Gram matrix of the first representation.
        l: ``[n, n]`` Gram matrix of the second representation.
        unbiased: use the unbiased estimator (needs n >= 4) instead of the biased one (n >= 2).

    Returns:
        The HSIC estimate. The unbiased estimate can be slightly negative.

    Raises:
        ValueError: if the matrices are not square, differ in size, or n is too small.
    """
    k = _check_gram(k, "k")
    l = _check_gram(l, "l")  # noqa: E741
    if k.shape != l.shape:
        raise VitscopeValueError(f"k and l must have the same shape, got {tuple(k.shape)} and {tuple(l.shape)}")
    n = k.shape[0]
    if n < (_MIN_UNBIASED if unbiased else 2):
        kind = "unbiased" if unbiased else "biased"
        raise VitscopeValueError(f"{kind} HSIC needs at least {_MIN_UNBIASED if unbiased else 2} examples, got n={n}")
    k, l = centred_grams(k), centred_grams(l)  # noqa: E741 - new tensors: the caller's are untouched
    if unbiased:
        k.fill_diagonal_(0.0)
        l.fill_diagonal_(0.0)
        trace_kl = (k * l.T).sum()  # tr(K L)
        sum_k, sum_l = k.sum(), l.sum()  # 1^T K 1, 1^T L 1
        k_l_ones = k.sum(dim=0) @ l.sum(dim=1)  # 1^T K L 1
        value = (trace_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * k_l_ones) / (n * (n - 3))
        return float(value)
    return float((k * l.T).sum() / (n - 1) ** 2)  # tr(HKH HLH) = tr(K H L H)


def _cka_ratio(hsic_xy: float, hsic_xx: float, hsic_yy: float) -> float:
    """``hsic_xy / sqrt(hsic_xx * hsic_yy)``; NaN when the denominator is not positive."""
    denom = hsic_xx * hsic_yy
    if not denom > 0.0:
        return math.nan
    return hsic_xy / math.sqrt(denom)


def linear_cka(x: torch.Tensor, y: torch.Tensor, unbiased: bool = False) -> float:
    """Linear centred kernel alignment between two representations of the same examples.

    Args:
        x: ``[n, d1]`` features (trailing dims are flattened).
        y: ``[n, d2]`` features of the same n examples, in the same order.
        unbiased: use the unbiased HSIC estimator (needs n >= 4).

    Returns:
        ``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` with linear Grams; NaN when a representation
        has no variance (or, unbiased, when a self-HSIC estimate is not positive).
    """
    xk, yk = _as_examples(x, "x"), _as_examples(y, "y")
    _check_pair(xk, yk)
    n = xk.shape[0]
    if n * n > xk.shape[1] * yk.shape[1]:  # more examples than features: [n, n] Grams would be the larger
        return _cka_ratio(*_feature_hsics(xk, yk, unbiased))
    k, l = xk @ xk.T, yk @ yk.T  # noqa: E741
    return _cka_ratio(hsic(k, l, unbiased), hsic(k, k, unbiased), hsic(l, l, unbiased))


def _feature_hsics(x: torch.Tensor, y: torch.Tensor, unbiased: bool) -> tuple[float, float, float]:
    """``HSIC(K, L), HSIC(K, K), HSIC(L, L)`` of the linear Grams of ``x [n, d1]`` and ``y [n, d2]`` (float64)
    from the features: memory ``d1 d2`` instead of ``n^2`` (50,000 images: 20 GB a Gram), time ``n d1 d2``.

    The same estimators as :func:`hsic` of the double-centred Grams: with centred features ``A``, the Gram is
    ``A A^T``, so ``tr(K L) = ||A^T B||_F^2``; the unbiased one zeroes its diagonal ``a_i = ||A_i||^2``, which
    takes ``sum_i a_i b_i`` from that trace, and ``K 1 = A (A^T 1) - a``.
    """
    n = x.shape[0]
    if n < (_MIN_UNBIASED if unbiased else 2):
        raise VitscopeValueError(f"{'unbiased' if unbiased else 'biased'} HSIC needs at least "
                                 f"{_MIN_UNBIASED if unbiased else 2} examples, got n={n}")
    a, b = _centred_features(x), _centred_features(y)
    a_t_b = a.T @ b

    def one(p: torch.Tensor, q: torch.Tensor, p_t_q: torch.Tensor) -> float:
        if not unbiased:
            return float(p_t_q.square().sum() / (n - 1) ** 2)
        rp, rq = p.square().sum(dim=1), q.square().sum(dim=1)  # the diagonals zeroed
        trace_kl = p_t_q.square().sum() - rp @ rq
        sum_k, sum_l = p.sum(dim=0).square().sum() - rp.sum(), q.sum(dim=0).square().sum() - rq.sum()
        k_l_ones = (p @ p.sum(dim=0) - rp) @ (q @ q.sum(dim=0) - rq)
        return float((trace_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * k_l_ones) / (n * (n - 3)))

    return one(a, b, a_t_b), one(a, a, a.T @ a), one(b, b, b.T @ b)


def _centred_features(x: torch.Tensor) -> torch.Tensor:
    """``x`` minus its mean row; zero when its centred Gram is round-off against its Gram (:data:`_FLAT`, as
    :func:`centred_grams`: ``||A A^T||_F = ||A^T A||_F``)."""
    a = x - x.mean(dim=0, keepdim=True)
    if (a.T @ a).norm() <= _FLAT * (x.T @ x).norm():
        return torch.zeros_like(a)
    return a


def _minmax_gram(k: torch.Tensor) -> torch.Tensor:
    """Rescale as the 002 code: ``K <- K - min(K)`` then ``K <- K / max(K)`` (the shifted max)."""
    k = k - k.min()
    top = k.max()
    return k / top if top > 0 else k


def minibatch_hsic_terms(
    x_batch: torch.Tensor, y_batch: torch.Tensor, gram_minmax: bool = False
) -> tuple[float, float, float]:
    """The three unbiased HSICs of one minibatch.

    Args:
        x_batch: ``[b, d1]`` features of the minibatch (trailing dims flattened), b >= 4.
        y_batch: ``[b, d2]`` features of the same examples.
        gram_minmax: rescale each Gram as the 002 code did, ``K - min(K)`` then divided by its
            (shifted) maximum, before the diagonal is zeroed. Not a consistent estimator.

    Returns:
        ``(hsic_xy, hsic_xx, hsic_yy)``, unbiased estimates in float64 precision.
    """
    xk, yk = _as_examples(x_batch, "x_batch"), _as_examples(y_batch, "y_batch")
    _check_pair(xk, yk)
    k, l = xk @ xk.T, yk @ yk.T  # noqa: E741
    if gram_minmax:
        k, l = _minmax_gram(k), _minmax_gram(l)  # noqa: E741
    return hsic(k, l, unbiased=True), hsic(k, k, unbiased=True), hsic(l, l, unbiased=True)


def minibatch_cka(x: torch.Tensor, y: torch.Tensor, batch: int = 64, gram_minmax: bool = False) -> float:
    """Minibatch linear CKA (Nguyen et al. 2021) over consecutive minibatches of the rows.

    Each minibatch of ``batch`` consecutive examples gives three unbiased HSICs; each is averaged over
    minibatches weighted by minibatch size; a final minibatch of fewer than 4 examples is dropped;
    the result is ``mean_xy / sqrt(mean_xx * mean_yy)``.

    Args:
        x: ``[n, d1]`` features (trailing dims flattened), in stream order.
        y: ``[n, d2]`` features of the same examples.
        batch: minibatch size (>= 4). The 002 code used 8; the default is 64.
        gram_minmax: min-max rescale each minibatch Gram first (see :func:`minibatch_hsic_terms`).

    Returns:
        The minibatch CKA; NaN when no minibatch of at least 4 examples exists or a self-HSIC average
        is not positive.
    """
    if int(batch) != batch or batch < _MIN_UNBIASED:
        raise VitscopeValueError(f"batch must be an integer >= {_MIN_UNBIASED}, got {batch!r}")
    batch = int(batch)
    xk, yk = _as_examples(x, "x"), _as_examples(y, "y")
    _check_pair(xk, yk)
    sums = [0.0, 0.0, 0.0]
    weight = 0
    for start in range(0, xk.shape[0], batch):
        xb, yb = xk[start : start + batch], yk[start : start + batch]
        b = xb.shape[0]
        if b < _MIN_UNBIASED:
            continue  # only the final minibatch can be this small
        for i, term in enumerate(minibatch_hsic_terms(xb, yb, gram_minmax=gram_minmax)):
            sums[i] += b * term
        weight += b
    if weight == 0:
        return math.nan
    hxy, hxx, hyy = (s / weight for s in sums)
    return _cka_ratio(hxy, hxx, hyy)


def features_for_cka(x: torch.Tensor, num_prefix: int, tokens: TokenSelection = "all") -> torch.Tensor:
    """One feature vector per image from its tokens (docs/methods.md, Representations, "Features for CKA").

    Args:
        x: ``[B, N, D]`` tokens (prefix tokens first, then the spatial tokens).
        num_prefix: number P of prefix tokens (CLS, distillation, registers).
        tokens: ``"all"`` -> ``[B, N*D]``; ``"cls"`` -> token 0, ``[B, D]`` (needs P >= 1);
            ``"spatial"`` -> the spatial tokens flattened, ``[B, (N-P)*D]``; ``"spatial_mean"`` -> the
            mean of the spatial tokens, ``[B, D]``.

    Returns:
        ``[B, F]`` features in the dtype of ``x``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise VitscopeValueError(f"x must be a token tensor [B, N, D], got {shape}")
    if tokens not in _TOKEN_MODES:
        raise VitscopeValueError(f"tokens must be one of {_TOKEN_MODES}, got {tokens!r}")
    n = x.shape[1]
    if int(num_prefix) != num_prefix or not 0 <= num_prefix <= n:
        raise VitscopeValueError(f"num_prefix must be an integer in [0, {n}], got {num_prefix!r}")
    num_prefix = int(num_prefix)
    if tokens == "all":
        return x.reshape(x.shape[0], -1)
    if tokens == "cls":
        if num_prefix < 1:
            raise VitscopeValueError("tokens='cls' needs a CLS token (num_prefix >= 1); use 'spatial_mean' instead")
        return x[:, 0]
    spatial = x[:, num_prefix:]
    if spatial.shape[1] == 0:
        raise VitscopeValueError(f"no spatial tokens: N={n} tokens, all of them prefix (num_prefix={num_prefix})")
    if tokens == "spatial":
        return spatial.reshape(x.shape[0], -1)
    return spatial.mean(dim=1)
