"""The small dense LU written out entry by entry (`sciad.solvers.direct.
_small_lu`), which BDF's and Radau's dense iteration matrices of up to
`SMALL` states use: LAPACK's factor (the same pivots, the same entries to
rounding), solves with a backward error at rounding (`A x = b`, `A^T`,
`A^H`; one right-hand side and several), batched, and a singular matrix
giving values that are not finite (what the Newton iterations judge)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sciad.solvers.direct import _small_lu


def _matrices(rng, n, complex_, count=12):
    A = rng.normal(size=(count, n, n))
    if complex_:
        A = A + 1j * rng.normal(size=(count, n, n))
    if n > 1:
        A[::3, 0, 0] = 0.0   # a zero leading entry: a row swap
        A[1::4] *= np.resize([1e-8, 1.0, 1e8, 1.0], n)[:, None]  # rows of unlike scales
    return A


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9, 16])  # (5 to 16: by a loop over the columns)
@pytest.mark.parametrize("complex_", [False, True])
def test_factor_and_solves_against_lapack(rng, n, complex_):
    A = _matrices(rng, n, complex_)
    B = rng.normal(size=(A.shape[0], n, 2)) + (1j * rng.normal(size=(A.shape[0], n, 2))
                                               if complex_ else 0.0)

    def run(A, B):
        f = _small_lu.lu_factor(A)
        g = jax.scipy.linalg.lu_factor(A)
        xs = [_small_lu.lu_solve(f, b, t) for t in (0, 1, 2) for b in (B, B[:, 0])]
        return f.lu, g[0], xs

    lu, lapack, xs = jax.jit(jax.vmap(run))(jnp.asarray(A), jnp.asarray(B))
    assert isinstance(_small_lu.lu_factor(jnp.asarray(A[0])), _small_lu.SmallLU)
    # (the same pivots; above 4, LAPACK's recursive panels sum in another
    # order than the loop's rank-one updates: an entry can round 1e-12 apart)
    rtol = 1e-12 if n <= _small_lu.SMALL else 1e-10
    np.testing.assert_allclose(np.asarray(lu), np.asarray(lapack), rtol=rtol, atol=0)
    for (t, cols), x in zip([(t, c) for t in (0, 1, 2) for c in (True, False)], xs):
        x = np.asarray(x)
        M = A if t == 0 else np.swapaxes(A, 1, 2)
        M = np.conj(M) if t == 2 else M
        b = B if cols else B[:, :, 0]
        x = x if cols else x[:, :, None]
        b = b if cols else b[:, :, None]
        scale = np.abs(M).max(axis=(1, 2)) * np.abs(x).max(axis=(1, 2)) + np.abs(b).max(axis=(1, 2))
        backward = np.abs(M @ x - b).max(axis=(1, 2)) / scale
        assert np.all(backward < 20 * np.finfo(np.float64).eps), (t, backward)


@pytest.mark.parametrize("n", [3, 7])
def test_a_singular_matrix_gives_values_that_are_not_finite(n):
    A = np.eye(n)
    A[:3, :3] = [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]]
    for t in (0, 1):
        x = jax.jit(lambda A: _small_lu.lu_solve(_small_lu.lu_factor(A), jnp.ones(n), t))(A)
        assert not np.all(np.isfinite(np.asarray(x)))


def test_larger_matrices_are_lapacks():
    n = _small_lu.LOOPED + 1
    f = _small_lu.lu_factor(jnp.eye(n))
    assert not isinstance(f, _small_lu.SmallLU)
    np.testing.assert_array_equal(np.asarray(_small_lu.lu_solve(f, jnp.arange(n * 1.0), 1)),
                                  np.arange(n * 1.0))


@pytest.mark.parametrize("shape", [(6, 6, (6, 10)), (9, 8, (8, 1, 3)), (4, 4, (4,)),
                                   (9, 8, (8, 4, 200))])
def test_the_ode_loops_product_is_a_matrix_product(rng, shape):
    # `_steps.product`: written out as a broadcast sum where small (fused
    # into a loop), `@` where large, the same product either way
    from sciad.solvers.ode import _steps

    k, l, b = shape
    A, B = rng.standard_normal((k, l)), rng.standard_normal(b)
    got = np.asarray(_steps.product(jnp.asarray(A), jnp.asarray(B)))
    want = np.tensordot(A, B, axes=1)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
