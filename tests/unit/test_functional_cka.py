"""Linear CKA, HSIC estimators and minibatch CKA (docs/methods.md, Representations)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from vitscope.functional.cka import (
    features_for_cka,
    gram_linear,
    hsic,
    linear_cka,
    minibatch_cka,
    minibatch_hsic_terms,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _correlated(
    n: int, d1: int = 12, d2: int = 9, noise: float = 0.7, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    x = torch.randn(n, d1, generator=g, dtype=torch.float64)
    y = x @ torch.randn(d1, d2, generator=g, dtype=torch.float64) + noise * torch.randn(
        n, d2, generator=g, dtype=torch.float64
    )
    return x, y


def _orthogonal(d: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=_gen(seed), dtype=torch.float64))
    return q


def _song_unbiased_by_definition(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    """Song et al. 2012 U-statistic straight from its definition: mean over ordered distinct 4-tuples
    (i, j, q, r) of K_ij L_ij + K_ij L_qr - 2 K_ij L_iq (symmetrising h over permutations is redundant
    when summing over all ordered tuples)."""
    n = k.shape[0]
    total, count = 0.0, 0
    for i, j, q, r in itertools.permutations(range(n), 4):
        total += k[i, j] * l[i, j] + k[i, j] * l[q, r] - 2.0 * k[i, j] * l[i, q]
        count += 1
    return total / count


# ----------------------------------------------------------------------------------------- HSIC


def test_biased_hsic_equals_explicit_trace_formula() -> None:
    x, y = _correlated(9, seed=1)
    k, l = (x @ x.T).numpy(), (y @ y.T).numpy()  # noqa: E741
    n = k.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    expected = np.trace(k @ h @ l @ h) / (n - 1) ** 2
    got = hsic(torch.from_numpy(k), torch.from_numpy(l))
    assert isinstance(got, float)
    assert got == pytest.approx(expected, rel=1e-12)


def test_unbiased_hsic_equals_song_definition() -> None:
    x, y = _correlated(7, d1=3, d2=4, seed=2)
    k, l = gram_linear(x), gram_linear(y)  # noqa: E741
    k_before, l_before = k.clone(), l.clone()
    expected = _song_unbiased_by_definition(k.numpy(), l.numpy())
    assert hsic(k, l, unbiased=True) == pytest.approx(expected, rel=1e-10)
    # diagonal is zeroed inside, so a nonzero diagonal must not change the answer
    k_shift = k + torch.diag(torch.arange(7, dtype=torch.float64))
    assert hsic(k_shift, l, unbiased=True) == pytest.approx(expected, rel=1e-10)
    # ... and the caller's tensors are untouched (compared with copies, not with a recomputed
    # diagonal: x @ x.T and (x * x).sum can differ in the last bit across BLAS paths)
    assert torch.equal(k, k_before) and torch.equal(l, l_before)
    assert torch.diagonal(k).ne(0).all()


def test_biased_and_unbiased_differ() -> None:
    x, y = _correlated(8, seed=3)
    k, l = gram_linear(x), gram_linear(y)  # noqa: E741
    assert hsic(k, l) != pytest.approx(hsic(k, l, unbiased=True), rel=1e-3)


def test_hsic_input_errors() -> None:
    k = torch.eye(3)
    with pytest.raises(ValueError, match="at least 4"):
        hsic(k, k, unbiased=True)
    with pytest.raises(ValueError, match="square"):
        hsic(torch.ones(3, 4), torch.ones(3, 4))
    with pytest.raises(ValueError, match="same shape"):
        hsic(torch.eye(4), torch.eye(5))


# ------------------------------------------------------------------------------------------ CKA


@pytest.mark.parametrize("unbiased", [False, True])
def test_cka_of_a_representation_with_itself_is_one(unbiased: bool) -> None:
    x, _ = _correlated(30, seed=4)
    assert linear_cka(x, x, unbiased=unbiased) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x.float(), x.float(), unbiased=unbiased) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("unbiased", [False, True])
def test_cka_invariant_to_orthogonal_transform_and_isotropic_scale(unbiased: bool) -> None:
    x, y = _correlated(40, seed=5)
    base = linear_cka(x, y, unbiased=unbiased)
    assert 0.2 < base < 0.99
    xq = 3.7 * (x @ _orthogonal(x.shape[1], seed=6))
    yq = 0.2 * (y @ _orthogonal(y.shape[1], seed=7))
    assert linear_cka(xq, yq, unbiased=unbiased) == pytest.approx(base, abs=1e-10)


@pytest.mark.parametrize("unbiased", [False, True])
def test_cka_not_invariant_to_anisotropic_scale(unbiased: bool) -> None:
    x, y = _correlated(40, seed=8)
    base = linear_cka(x, y, unbiased=unbiased)
    scale = torch.ones(x.shape[1], dtype=torch.float64)
    scale[0] = 25.0
    assert abs(linear_cka(x * scale, y, unbiased=unbiased) - base) > 1e-3


def test_biased_cka_matches_centered_feature_formula() -> None:
    # Kornblith et al. eq.: ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)
    x, y = _correlated(25, seed=9)
    xc, yc = x - x.mean(0), y - y.mean(0)
    expected = torch.linalg.norm(yc.T @ xc) ** 2 / (torch.linalg.norm(xc.T @ xc) * torch.linalg.norm(yc.T @ yc))
    assert linear_cka(x, y) == pytest.approx(float(expected), rel=1e-12)


def test_cka_constant_representation_is_nan() -> None:
    x, _ = _correlated(10, seed=10)
    assert math.isnan(linear_cka(x, torch.ones(10, 3)))


@pytest.mark.parametrize("seed", range(6))
def test_a_representation_without_variance_is_nan_not_round_off(seed: int) -> None:
    """A row repeated for every image (the CLS token at norm1 of block 0) with values that do not cancel
    exactly: its self-HSIC is round-off, whose ratio was anything in [-1, 1]."""
    from vitscope.functional.cka_grams import cka_from_hsic, hsic_matrix

    g = _gen(seed)
    x = torch.randn(1, 83, generator=g, dtype=torch.float64).expand(14, 83) * 3.7 + 0.1
    y = torch.randn(14, 5, generator=g, dtype=torch.float64)
    for unbiased in (False, True):
        assert math.isnan(linear_cka(x, y, unbiased)) and math.isnan(linear_cka(x, x, unbiased))
        k = torch.stack([x @ x.T, y @ y.T])
        h = hsic_matrix(k, unbiased=unbiased)
        cka = cka_from_hsic(h, h.diagonal(), h.diagonal())
        assert torch.isnan(cka[0]).all() and cka[1, 1] == pytest.approx(1.0)
    assert math.isnan(minibatch_cka(x, x, batch=7)) and math.isnan(minibatch_cka(x, y, batch=7))


@pytest.mark.parametrize("unbiased", [False, True])
def test_a_common_feature_offset_changes_nothing(unbiased: bool) -> None:
    """CKA is invariant to adding one vector to every example; an offset 10^4 times the spread cancelled in the
    sums of the uncentred Grams (0.27 instead of 0.64)."""
    x, y = _correlated(64, d1=32, d2=16, seed=3)
    g = _gen(4)
    shift_x, shift_y = torch.randn(32, generator=g, dtype=torch.float64), torch.randn(16, generator=g,
                                                                                       dtype=torch.float64)
    exact = linear_cka(x, y, unbiased)
    for offset in (1e2, 1e4):
        assert linear_cka(x + offset * shift_x, y + offset * shift_y, unbiased) == pytest.approx(exact, rel=1e-6)


def test_cka_row_count_mismatch() -> None:
    with pytest.raises(ValueError, match="same examples"):
        linear_cka(torch.randn(5, 2), torch.randn(6, 2))


# -------------------------------------------------------------------------------- minibatch CKA


def test_minibatch_terms_are_the_unbiased_hsics() -> None:
    x, y = _correlated(16, seed=11)
    k, l = gram_linear(x), gram_linear(y)  # noqa: E741
    hxy, hxx, hyy = minibatch_hsic_terms(x, y)
    assert hxy == pytest.approx(hsic(k, l, unbiased=True), rel=1e-12)
    assert hxx == pytest.approx(hsic(k, k, unbiased=True), rel=1e-12)
    assert hyy == pytest.approx(hsic(l, l, unbiased=True), rel=1e-12)


def test_minibatch_cka_close_to_full_batch_unbiased() -> None:
    x, y = _correlated(2048, d1=16, d2=10, noise=1.5, seed=12)
    full = linear_cka(x, y, unbiased=True)
    assert 0.3 < full < 0.95
    assert minibatch_cka(x, y, batch=64) == pytest.approx(full, abs=0.02)


def test_minibatch_cka_weighted_average_by_hand() -> None:
    x, y = _correlated(20, seed=13)
    parts = [
        minibatch_hsic_terms(x[:8], y[:8]),
        minibatch_hsic_terms(x[8:16], y[8:16]),
        minibatch_hsic_terms(x[16:], y[16:]),
    ]
    weights = [8, 8, 4]
    avg = [sum(w * p[i] for w, p in zip(weights, parts)) / 20 for i in range(3)]
    expected = avg[0] / math.sqrt(avg[1] * avg[2])
    assert minibatch_cka(x, y, batch=8) == pytest.approx(expected, rel=1e-12)
    # the unweighted mean differs, so the weighting is really applied
    unweighted = [sum(p[i] for p in parts) / 3 for i in range(3)]
    assert expected != pytest.approx(unweighted[0] / math.sqrt(unweighted[1] * unweighted[2]), rel=1e-6)


def test_minibatch_cka_drops_final_minibatch_smaller_than_four() -> None:
    x, y = _correlated(64 * 2 + 3, seed=14)
    ref = minibatch_cka(x, y, batch=64)
    assert ref == pytest.approx(minibatch_cka(x[:128], y[:128], batch=64), rel=1e-12)
    g = _gen(15)
    x2, y2 = x.clone(), y.clone()
    x2[128:] = 1e3 * torch.randn(3, x.shape[1], generator=g, dtype=torch.float64)
    y2[128:] = -1e3 * torch.randn(3, y.shape[1], generator=g, dtype=torch.float64)
    assert minibatch_cka(x2, y2, batch=64) == pytest.approx(ref, rel=1e-12)
    # a final minibatch of exactly 4 is kept and does change the answer
    x4, y4 = _correlated(64 * 2 + 4, seed=14)
    x4[128:] = 1e3 * torch.randn(4, x.shape[1], generator=g, dtype=torch.float64)
    assert minibatch_cka(x4, y4, batch=64) != pytest.approx(minibatch_cka(x4[:128], y4[:128], batch=64), rel=1e-6)


def test_gram_minmax_changes_values_and_follows_the_002_rescaling() -> None:
    x, y = _correlated(32, seed=16)
    plain = minibatch_cka(x, y, batch=8)
    scaled = minibatch_cka(x, y, batch=8, gram_minmax=True)
    assert abs(plain - scaled) > 1e-3
    # by hand for one minibatch: K - min, divided by the max of the shifted K, then unbiased HSIC
    xb, yb = x[:8], y[:8]
    k, l = xb @ xb.T, yb @ yb.T  # noqa: E741
    k = (k - k.min()) / (k - k.min()).max()
    l = (l - l.min()) / (l - l.min()).max()  # noqa: E741
    expected = (hsic(k, l, True), hsic(k, k, True), hsic(l, l, True))
    assert minibatch_hsic_terms(xb, yb, gram_minmax=True) == pytest.approx(expected, rel=1e-12)


def test_minibatch_cka_identity_and_errors() -> None:
    x, _ = _correlated(50, seed=17)
    assert minibatch_cka(x, x, batch=16) == pytest.approx(1.0, abs=1e-12)
    assert math.isnan(minibatch_cka(x[:3], x[:3], batch=16))  # only a minibatch of 3: dropped
    with pytest.raises(ValueError, match="batch"):
        minibatch_cka(x, x, batch=3)


# ---------------------------------------------------------------------------- features for CKA


def test_features_for_cka_modes() -> None:
    b, n, d, p = 2, 1 + 2 + 4, 3, 3  # CLS + 2 registers + 2x2 spatial
    tokens = torch.arange(b * n * d, dtype=torch.float32).reshape(b, n, d)
    assert torch.equal(features_for_cka(tokens, p), tokens.reshape(b, n * d))
    assert torch.equal(features_for_cka(tokens, p, tokens="cls"), tokens[:, 0])
    assert torch.equal(features_for_cka(tokens, p, tokens="spatial"), tokens[:, p:].reshape(b, 4 * d))
    assert torch.allclose(features_for_cka(tokens, p, tokens="spatial_mean"), tokens[:, p:].mean(1))
    assert features_for_cka(tokens, p, tokens="spatial_mean").shape == (b, d)
    with pytest.raises(ValueError, match="cls"):
        features_for_cka(tokens, 0, tokens="cls")
    with pytest.raises(ValueError, match="tokens must be one of"):
        features_for_cka(tokens, p, tokens="patch")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[B, N, D\]"):
        features_for_cka(tokens[0], p)


@pytest.mark.parametrize("unbiased", [False, True])
@pytest.mark.parametrize(("n", "d1", "d2", "offset"), [(50, 4, 7, 0.0), (200, 16, 8, 100.0), (12, 2, 5, 0.0)])
def test_more_examples_than_features_computes_the_grams_estimators_from_the_features(n, d1, d2, offset, unbiased):
    """compare's CKA between models built [n, n] Grams: 20 GB each at 50,000 images. From the features it is the
    same estimator (the Gram path, forced, is the reference)."""
    from vitscope.functional.cka import _cka_ratio

    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, d1, generator=gen, dtype=torch.float64) + offset
    y = 0.3 * x[:, :1].repeat(1, d2) + torch.randn(n, d2, generator=gen, dtype=torch.float64)
    k, l = x @ x.T, y @ y.T  # noqa: E741
    gram = _cka_ratio(hsic(k, l, unbiased), hsic(k, k, unbiased), hsic(l, l, unbiased))
    assert linear_cka(x, y, unbiased=unbiased) == pytest.approx(gram, rel=1e-9, abs=1e-12)


def test_many_examples_need_no_gram(monkeypatch):
    """20,000 examples of 8 features: a Gram would be 3.2 GB; the features' path makes none."""
    import vitscope.functional.cka as cka

    def no_gram(*args, **kwargs):
        raise AssertionError("a Gram matrix was built")

    monkeypatch.setattr(cka, "hsic", no_gram)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, 8, generator=gen, dtype=torch.float64)
    assert linear_cka(x, x, unbiased=True) == pytest.approx(1.0, abs=1e-12)
    assert math.isnan(linear_cka(torch.ones(20_000, 3, dtype=torch.float64), x))  # no variance: NaN, as a Gram's
