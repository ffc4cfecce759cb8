"""The banded LU in the program (`sciad.solvers.direct._band`, sciad's
`csrc/band_lu.cc`): its solves against dense ones (real and complex, `A`,
`A^T`, `A^H`, one or many right-hand sides, the pattern's own order and a
reverse Cuthill-McKee one), batches, a zero pivot, which patterns it takes;
and the stiff integrators' sparse iteration matrices on a banded pattern
factored by it, with no KLU call, to the KLU path's solution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from sciad.graph._types import Pattern
from sciad.solvers.direct import _band

pytestmark = pytest.mark.skipif(not _band.usable(np.float64),
                                reason="needs sciad's banded LU extension (a C++ compiler)")


def _pattern(A):
    A = sp.csr_matrix(A)
    A.sort_indices()
    return Pattern(A.shape, A.indptr.astype(np.int64), A.indices.astype(np.int64)), A


def _banded(rng, n, kl, ku, dtype=np.float64):
    """A well-conditioned random matrix with `kl` sub- and `ku`
    superdiagonals, whose pivots need row swaps (a small diagonal)."""
    offsets = range(-kl, ku + 1)
    diags = [rng.standard_normal(n - abs(k)) for k in offsets]
    if np.dtype(dtype).kind == "c":
        diags = [d + 1j * rng.standard_normal(d.size) for d in diags]
    A = sp.diags(diags, list(offsets), shape=(n, n), format="csr")
    return A + sp.eye(n) * 0.1  # (cond ~1e2-1e3 here)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("permuted", [False, True])
def test_solves_against_dense(rng, dtype, permuted):
    n, kl, ku = 40, 2, 3
    A = _banded(rng, n, kl, ku, dtype)
    if permuted:  # (its own order wide: the band comes from reverse Cuthill-McKee)
        p = rng.permutation(n)
        A = A[p][:, p]
    pattern, A = _pattern(A)
    band = _band.Band.of(pattern)
    assert band is not None and (band.perm is not None) == permuted
    assert band.kl + band.ku <= (10 if permuted else kl + ku)
    D = A.toarray()
    lu = jax.jit(band.factor)(jnp.asarray(A.data))
    B = rng.standard_normal((n, 3)).astype(dtype)
    for trans, op in ((0, D), (1, D.T), (2, D.conj().T)):
        for b in (B, B[:, 0]):
            x = np.asarray(band.solve(lu, jnp.asarray(b), trans))
            np.testing.assert_allclose(op @ x, b, atol=1e-11)


@pytest.mark.parametrize("dtype", [np.float64, pytest.param(np.complex128, marks=pytest.mark.slow)])
def test_one_right_hand_side_at_every_width(rng, dtype):
    """A single right-hand side takes substitutions specialized to the
    band's widths (kl 1..4, ku 0..4; a window of unknowns in registers),
    where the matrix is longer than two rows of the band; others the general
    loops. Each against dense solves and the many-right-hand-sides path, at
    the lengths on both sides of that limit, for `A`, `A^T` and `A^H`."""
    for kl, ku in ((1, 0), (1, 1), (2, 2), (3, 1), (4, 4), (2, 4), (5, 2), (1, 6)):
        limit = 2 * (2 * kl + ku + 1)
        for n in (limit, limit + 1):  # (the last general one, the first specialized)
            pattern, A = _pattern(_banded(rng, n, kl, ku, dtype))
            band = _band.Band.of(pattern)
            assert (band.kl, band.ku, band.perm) == (kl, ku, None)
            D = A.toarray()
            lu = band.factor(jnp.asarray(A.data))
            assert np.any(np.asarray(lu.piv) != np.arange(n))  # (rows were swapped)
            B = rng.standard_normal((n, 2)).astype(dtype)
            norm = np.abs(D).sum(axis=1).max()
            for trans, op in ((0, D), (1, D.T), (2, D.conj().T)):
                x = np.asarray(band.solve(lu, jnp.asarray(B[:, 0]), trans))
                # (backward error: random bands are conditioned up to 1e6 or so)
                r = np.abs(op @ x - B[:, 0]).max() / (norm * np.abs(x).max())
                assert r < 1e-14, f"kl={kl} ku={ku} n={n} trans={trans}: {r:.1e}"
                X = np.asarray(band.solve(lu, jnp.asarray(B), trans))
                np.testing.assert_allclose(x, X[:, 0], rtol=1e-9,
                                           atol=1e-12 * np.abs(x).max())


def test_a_real_right_hand_side_with_a_complex_factor_and_float32(rng):
    pattern, A = _pattern(_banded(rng, 12, 1, 1))
    band = _band.Band.of(pattern)
    C = A.astype(np.complex128) * (1 + 0.5j)
    b = rng.standard_normal(12)
    x = band.solve(band.factor(jnp.asarray(C.data)), jnp.asarray(b))
    assert x.dtype == np.complex128
    np.testing.assert_allclose(C.toarray() @ np.asarray(x), b, atol=1e-12)
    x32 = band.solve(band.factor(jnp.asarray(A.data, np.float32)),
                     jnp.asarray(b, np.float32))
    assert x32.dtype == np.float32
    np.testing.assert_allclose(A.toarray() @ np.asarray(x32, np.float64), b, atol=1e-4)


def test_a_batch_is_each_examples_factor(rng):
    pattern, A = _pattern(_banded(rng, 20, 2, 1))
    band = _band.Band.of(pattern)
    scales = np.array([1.0, -2.0, 0.5])
    values = jnp.asarray(np.outer(scales, A.data))
    b = rng.standard_normal((3, 20))
    x = jax.vmap(lambda v, bb: band.solve(band.factor(v), bb, 1))(values, jnp.asarray(b))
    for s, xi, bi in zip(scales, np.asarray(x), b):
        np.testing.assert_allclose((s * A.toarray()).T @ xi, bi, atol=1e-11)


def test_a_zero_pivot_gives_infinite_values_not_a_crash():
    pattern, A = _pattern(sp.diags([1.0, 2.0, 0.0, 4.0]))
    band = _band.Band.of(pattern)
    x = np.asarray(band.solve(band.factor(jnp.asarray(A.data)), jnp.ones(4)))
    assert np.isfinite(x[[0, 1, 3]]).all() and not np.isfinite(x[2])


def test_which_patterns_it_takes():
    # a 2-D five-point stencil: its band is a grid row wide, in any order
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(30, 30))
    assert _band.Band.of(_pattern(sp.kronsum(T, T))[0]) is None
    # a ring (periodic 1-D): wide as given, narrow after reverse Cuthill-McKee
    ring = T.tolil()
    ring[0, 29] = ring[29, 0] = -1.0
    band = _band.Band.of(_pattern(ring)[0])
    assert band is not None and band.perm is not None and band.kl + band.ku <= 4
    assert _band.Band.of(_pattern(sp.csr_matrix(np.ones((3, 4))))[0]) is None  # (not square)


def _chain(t, y, k):  # a stiff nonlinear 1-D reaction-diffusion chain
    lap = snp.pad(y, 1)[:-2] - 2.0 * y + snp.pad(y, 1)[2:]
    return 300.0 * k[0] * lap - k[1] * y ** 3


@pytest.mark.parametrize("solver", ["bdf", pytest.param("radau", marks=pytest.mark.slow)])
def test_the_integrators_factor_a_banded_pattern_with_it(monkeypatch, solver):
    """`jac="sparse"` on a tridiagonal field: the banded LU, no KLU factor or
    solve, the same solution and gradient as KLU's kept factors (to well
    within the tolerance: the factorizations round apart)."""
    from sciad.solvers.ode import _kept_klu

    y0, ts, k = np.linspace(0.5, 1.5, 30), np.array([0.0, 0.05, 0.2]), np.array([1.0, 2.0])

    def run():
        # (new functions: their programs lowered with the current path)
        def solve(k):
            return sd.ode.odeint(_chain, y0, ts, k, solver=solver, jac="sparse", rtol=1e-8,
                                 atol=1e-10)
        return (np.asarray(sd.function(solve)(k)),
                np.asarray(sd.function(sd.grad(lambda k: snp.sum(solve(k) ** 2)))(k)))

    with monkeypatch.context() as m:
        m.setattr(_band, "usable", lambda dtype: False)
        want = run()

    def refuse(*args, **kwargs):
        raise AssertionError("a KLU call")

    monkeypatch.setattr(_kept_klu, "swap", refuse)
    monkeypatch.setattr(_kept_klu, "solve", refuse)
    got = run()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9 * np.abs(w).max())
