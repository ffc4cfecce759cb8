"""The compiled checks of a sparse direct solve (`sciad.solvers._sparse_checks`,
`csrc/sparse_checks.cc`) against the XLA measures they replace
(`sciad.primitives._linalg_run`): the same numbers on fresh random matrices,
with NaN, infinities, zero rows and missing diagonal entries, transposed,
with several right-hand sides, batched."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
from sciad.primitives import _linalg_run
from sciad.solvers import _sparse_checks
from sciad.solvers._indices import pattern_matmul

pytestmark = pytest.mark.skipif(not _sparse_checks.available(np.float64),
                                reason="the extension cannot be built here (no compiler)")


def _matrix(rng, n, *, symmetric=False, drop_diagonal=None):
    B = sp.random(n, n, density=0.3, random_state=int(rng.integers(2**31)))
    M = sp.csr_array(B + B.T + n * sp.eye(n)) if symmetric else sp.csr_array(B + n * sp.eye(n))
    if drop_diagonal is not None:
        M = M.tolil()
        M[drop_diagonal, drop_diagonal] = 0
        M = sp.csr_array(M)
        M.eliminate_zeros()
    M.sum_duplicates()
    M.sort_indices()
    pattern = sd.sparse.csr_matrix((M.data, M.indices, M.indptr), shape=M.shape).pattern
    return M, pattern


def _xla(pattern, a, assume):
    m = _linalg_run._matrix_measures(a, None, None)  # (nonfinite alone: no kernel)
    if assume:
        m["asymmetry"] = _linalg_run._asymmetry(a, pattern)
    if assume == "spd":
        m["min_diagonal"] = _linalg_run._min_diagonal(a, pattern)
    m["zero_line"] = _linalg_run._zero_line(a, pattern, lambda v, x, t: pattern_matmul(
        pattern, v, x, t))
    return m


def _assert_same(got, want):
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k], float), np.asarray(want[k], float),
                                   rtol=1e-13, atol=0, err_msg=k)


MATRIX_CASES = ["plain", "nan", "inf", "zero row", "negative diagonal", "asymmetric"]


@pytest.mark.parametrize("drop_diagonal", [None, 3])
def test_matrix_measures_match_xla(rng, drop_diagonal):
    n = 12
    M, pattern = _matrix(rng, n, symmetric=True, drop_diagonal=drop_diagonal)
    rows = np.repeat(np.arange(n), np.diff(M.indptr))
    for assume in (None, "symmetric", "spd"):  # (one program each, every case through it)
        run = jax.jit(lambda a: _sparse_checks.matrix_measures(
            pattern, a, symmetric=assume is not None, diagonal=assume == "spd"))
        for case in MATRIX_CASES:
            d = M.data.copy()
            if case == "nan":
                d[5] = np.nan
            elif case == "inf":
                d[2] = -np.inf
            elif case == "zero row":
                d[rows == 4] = 0.0
            elif case == "negative diagonal":
                d[(rows == M.indices) & (rows == 7)] = -1.0
            elif case == "asymmetric":
                d[np.flatnonzero(rows != M.indices)[0]] += 0.5
            _assert_same(run(d), _xla(pattern, jnp.asarray(d), assume))


SOLVE_CASES = ["plain", "nan x", "inf b", "zero b", "all nan"]


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("k", [None, 3])
def test_solve_measures_match_xla(rng, transpose, k):
    n = 15
    M, pattern = _matrix(rng, n)
    shape = (n,) if k is None else (n, k)
    a = jnp.asarray(M.data)
    run = jax.jit(lambda a, x, b: _sparse_checks.solve_measures(pattern, a, x, b,
                                                                transpose=transpose))
    apply = _linalg_run._matvec(a, pattern, transpose)
    anorm = _linalg_run._norm_inf(a, pattern, transpose)
    for case in SOLVE_CASES:
        b = rng.standard_normal(shape)
        x = np.linalg.solve(M.toarray().T if transpose else M.toarray(), b)
        x = x + 1e-6 * rng.standard_normal(shape)  # (a residual to measure)
        if case == "nan x":
            x.flat[3] = np.nan
        elif case == "inf b":
            b.flat[1] = np.inf
        elif case == "zero b":
            b[:] = 0.0
            x[:] = 0.0
        elif case == "all nan":
            x[:] = np.nan
        eta, rel, bn, all_nan = run(a, x, b)
        _, weta, wrel, wbn = _linalg_run._measures(apply, jnp.asarray(x), jnp.asarray(b),
                                                   anorm)
        for g, w in ((eta, weta), (rel, wrel), (bn, wbn)):
            np.testing.assert_allclose(float(g), float(w), rtol=1e-9, atol=1e-300,
                                       err_msg=case)
        assert bool(all_nan) == (case == "all nan")


def test_batched(rng):
    n, B = 10, 4
    M, pattern = _matrix(rng, n, symmetric=True)
    d = np.stack([M.data * s for s in (1.0, 2.0, 3.0, 4.0)])
    d[2, 0] = np.nan
    got = jax.jit(jax.vmap(lambda a: _sparse_checks.matrix_measures(
        pattern, a, symmetric=True, diagonal=True)))(d)
    for i in range(B):
        _assert_same({k: v[i] for k, v in got.items()}, _xla(pattern, jnp.asarray(d[i]), "spd"))
    x = rng.standard_normal((B, n))
    b = rng.standard_normal((B, n))
    # (the matrix unbatched, x and b batched; and all three batched)
    one = jax.jit(jax.vmap(lambda x, b: _sparse_checks.solve_measures(
        pattern, jnp.asarray(M.data), x, b, transpose=False)))(x, b)
    each = [_sparse_checks.solve_measures(pattern, jnp.asarray(M.data), x[i], b[i],
                                          transpose=False) for i in range(B)]
    for j in range(4):
        np.testing.assert_allclose(np.asarray(one[j], float),
                                   [float(e[j]) for e in each], rtol=1e-13)


def test_a_solve_through_the_public_path_uses_them(rng):
    M, _ = _matrix(rng, 20, symmetric=True)
    f = jax.jit(sd.to_jax(lambda d, b: sd.linalg.solve(
        sd.sparse.csr_matrix((d, M.indices, M.indptr), shape=M.shape), b, solver="klu")))
    text = f.lower(M.data, np.ones(20)).as_text()
    assert "sciad_matrix_measures" in text and "sciad_solve_measures" in text
    np.testing.assert_allclose(np.asarray(f(M.data, np.ones(20))),
                               np.linalg.solve(M.toarray(), np.ones(20)), rtol=1e-10)


def test_a_batch_is_judged_example_by_example():
    """The host judges each measured example of a batch on its own, in order,
    naming it: a NaN (a singular example) is not hidden by a finite measure of
    a later one, and no example's residual meets another's condition number."""
    from sciad.solvers.direct._sparse_direct import _report_each

    seen = []

    def report(example=None, **status):
        seen.append((example, status["residual"], status["rcond"]))

    ok = dict(nonfinite=False, backward_error=1e-17, residual=1e-6, rcond=0.3,
              refined=False)
    bad = dict(ok, backward_error=np.nan, residual=np.nan, rcond=0.0)
    _report_each(report, [(0, ok), (1, bad), (2, ok)], (3,))
    assert [e for e, _, _ in seen] == [(0, (3,)), (1, (3,)), (2, (3,))]
    assert np.isnan(seen[1][1]) and seen[1][2] == 0.0
    assert seen[0][1:] == seen[2][1:] == (1e-6, 0.3)
