"""The supernodal kernels of sciad's sparse Cholesky factor
(`csrc/fill_cholesky.cc`) against their dense definitions, on structures
that make every kind of supernode: one column each (a tridiagonal matrix),
one dense panel, an arrow (a dense last row under width-1 columns), blocks
along the diagonal, a 2-D grid (nested panels of many widths) and a random
pattern; and the supernodes themselves against the fill."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sciad.graph._types import Pattern
from sciad.solvers.direct import _fill_cholesky as fc


def _tridiagonal(rng):
    return sp.diags([-1.0, 3.0, -1.0], [-1, 0, 1], (9, 9))


def _dense(rng):
    D = rng.standard_normal((12, 12))
    return sp.coo_matrix(D @ D.T + 12 * np.eye(12))


def _arrow(rng):
    n = 10
    A = sp.lil_matrix(4.0 * np.eye(n))
    A[n - 1, :n - 1] = rng.uniform(0.1, 0.3, n - 1)
    A[:n - 1, n - 1] = A[n - 1, :n - 1].T
    return A.tocoo()


def _blocks(rng):
    return sp.block_diag([_dense(rng), 3.0 * sp.eye(2), _tridiagonal(rng)])


def _grid(rng, k=11):
    T = sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (k, k))
    return sp.kron(sp.eye(k), T) + sp.kron(T, sp.eye(k))


def _random(rng, n=40):
    R = sp.random(n, n, 0.08, random_state=np.random.RandomState(rng.integers(2**31)))
    return R + R.T + sp.diags(np.asarray(abs(R + R.T).sum(axis=1)).ravel() + 1.0)


STRUCTURES = [_tridiagonal, _dense, _arrow, _blocks, _grid, _random]


def _layout(A):
    A = sp.coo_matrix(A)
    pattern, index = Pattern.from_coo(A.shape, A.row, A.col)
    values = np.zeros(pattern.nnz)
    np.add.at(values, index, A.data)
    an = fc.Layout(pattern)
    e = np.zeros(an.size)
    np.add.at(e, an.slot, an.weight * values)
    return an, e


@pytest.mark.parametrize("make", STRUCTURES, ids=lambda f: f.__name__.strip("_"))
def test_the_kernels_are_their_dense_definitions(rng, make):
    an, e = _layout(make(rng))
    n = an.n

    def dense(v):
        M = np.zeros((n, n))
        M[an.rows, an.cols] = v
        return M

    def lower(M):
        return M[an.rows, an.cols]

    l, status = fc.chol(an, e)
    assert status == 0
    L, E = dense(l), dense(e)
    np.testing.assert_allclose(L @ L.T, E + np.tril(E, -1).T, atol=1e-12)
    x, y, c = (rng.standard_normal(an.size) for _ in range(3))
    X, Y, C = dense(x), dense(y), dense(c)
    t = fc.tangent(an, l, x)
    np.testing.assert_allclose(lower(dense(t) @ L.T + L @ dense(t).T), x, atol=1e-11)
    a = fc.adjoint(an, l, y)  # (the tangent map's transpose: the dot-product test)
    np.testing.assert_allclose(a @ x, y @ t, rtol=1e-12)
    np.testing.assert_allclose(fc.symprod(an, x, y), lower(X @ Y.T + Y @ X.T), atol=1e-12)
    np.testing.assert_allclose(fc.symmul(an, c, y), lower((C + C.T) @ Y), atol=1e-12)


@pytest.mark.parametrize("make", STRUCTURES, ids=lambda f: f.__name__.strip("_"))
def test_the_supernodes_partition_the_fill(rng, make):
    """Each supernode's columns nest (column j's rows below it are j + 1 and
    column j + 1's), no two consecutive supernodes could be one, each
    panel's rows are its columns then its last column's, and each pair (K,
    J) names exactly the rows of K in J."""
    an, _ = _layout(make(rng))
    s, n = an.supernodes, an.n
    rows = [set(an.Si[an.Sp[j]:an.Sp[j + 1]]) for j in range(n)]
    first = s["first"]
    for J in range(first.size - 1):
        f, last = first[J], first[J + 1] - 1
        for j in range(f, last):
            assert rows[j] == {j + 1} | rows[j + 1]
        if J:  # (maximal: the previous column could not have joined)
            assert rows[f - 1] != {f} | rows[f]
        panel = s["ridx"][s["rptr"][J]:s["rptr"][J + 1]]
        np.testing.assert_array_equal(panel, np.r_[np.arange(f, last + 1),
                                                   sorted(rows[last])])
        got = {(int(k), int(a), int(b))
               for k, *_, a, b in s["pairs"][s["uptr"][J]:s["uptr"][J + 1]]}
        want = set()
        for K in range(J):
            kr = s["ridx"][s["rptr"][K]:s["rptr"][K + 1]]
            inside = np.flatnonzero((kr >= f) & (kr <= last))
            if inside.size:
                want.add((K, int(inside[0]), int(inside[-1]) + 1))
        assert got == want


def test_a_pivot_that_is_not_positive_is_named(rng):
    """The first ordered column whose pivot is not positive (NaN included):
    the columns before it never read the entry."""
    A = _grid(rng, 6).tolil()
    A[20, 20] = -5.0
    an, e = _layout(A)
    assert fc.chol(an, e)[1] == an.perm[20] + 1
    an, e = _layout(_grid(rng, 6))
    assert fc.chol(an, e)[1] == 0
    e[an.perm[3]] = np.nan  # (the diagonal's slots come first, in the ordered columns)
    assert fc.chol(an, e)[1] == an.perm[3] + 1


def _calls(an, e, rng):
    """Each kernel once on random inputs: `[(kernel, args)]`."""
    l, status = fc.chol(an, e)
    assert status == 0
    x, y = rng.standard_normal((2, an.size))
    return [(fc.chol, (e,)), (fc.tangent, (l, x)), (fc.adjoint, (l, y)),
            (fc.symprod, (x, y)), (fc.symmul, (x, y))]


def _result(kernel, an, args):
    out = kernel(an, *args)
    return out[0] if kernel is fc.chol else out


def test_a_kept_workspace_is_never_read_before_it_is_written(rng):
    """The kernels keep one workspace per layout between calls (its page
    faults are a third of a call's time at 65,536 unknowns): filled with NaN
    beforehand, it leaves every result as a fresh one gives, bit for bit."""
    an, e = _layout(_grid(rng, 9))
    for kernel, args in _calls(an, e, rng):
        want = _result(kernel, an, args)
        assert an._work is not None and an._work.size == an.work_size
        an._work[:] = np.nan
        np.testing.assert_array_equal(_result(kernel, an, args), want)


def test_kernels_called_from_many_threads_at_once(rng):
    """Calls that overlap take a workspace each (one is kept): the results
    are the serial ones, bit for bit."""
    from concurrent.futures import ThreadPoolExecutor

    an, e = _layout(_grid(rng, 12))
    calls = _calls(an, e, rng) * 4
    want = [_result(k, an, a) for k, a in calls]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda c: _result(c[0], an, c[1]), calls))
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    assert an._work is not None


def test_a_large_workspace_is_not_kept(rng, monkeypatch):
    an, e = _layout(_grid(rng, 5))
    monkeypatch.setattr(fc, "KEEP_WORKSPACE_BYTES", 8 * an.work_size - 1)
    l, status = fc.chol(an, e)
    assert status == 0 and an._work is None
    out = np.empty(an.size)
    assert fc.tangent(an, l, e, out) is out and an._work is None
    with pytest.raises(ValueError, match="contiguous float64 vector"):
        fc.adjoint(an, l, e, np.empty(an.size - 1))
