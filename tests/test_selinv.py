"""The host kernels of sparse log-determinants and selected inverses
(`sciad.solvers.direct._selinv`): against NumPy's `slogdet` and the dense
inverse, with the compiled Takahashi recurrence and its NumPy twin."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sciad.graph._types import Pattern
from sciad.solvers.direct import _selinv


def _pattern(A):
    A = sp.csr_matrix(A)
    A.sum_duplicates()
    A.sort_indices()
    return A, Pattern(A.shape, A.indptr, A.indices)


def _poisson(n, shift=0.0):
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (n, n))
    return sp.kron(T, sp.eye(n)) + sp.kron(sp.eye(n), T) + shift * sp.eye(n * n)


def _nonsymmetric(rng, n=40, density=0.08):
    """A diagonally dominant matrix whose pattern is not symmetric."""
    R = sp.random(n, n, density, random_state=np.random.RandomState(rng.integers(2**31)))
    R.data = rng.uniform(-1.0, 1.0, R.nnz)
    return R + sp.diags(np.asarray(abs(R).sum(axis=1)).ravel() + 1.0)


@pytest.fixture(params=["compiled", "numpy"])
def kernel(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(_selinv.LIBRARY, "get", lambda: None)
    elif _selinv.LIBRARY.get() is None:
        pytest.skip(f"no C++ compiler: {_selinv.LIBRARY.failed}")
    return request.param


def _complex(rng):
    """`_nonsymmetric`'s entries turned by phases: complex arithmetic."""
    A = sp.csr_matrix(_nonsymmetric(rng)).astype(complex)
    A.data = A.data * np.exp(2j * np.pi * rng.uniform(size=A.nnz))
    return A


@pytest.mark.parametrize("which", ["spd", "nonsymmetric", "negated", "complex"])
def test_selected_inverse_is_the_dense_inverse_on_the_pattern(rng, kernel, which):
    A = {"spd": lambda: _poisson(7, 0.3), "nonsymmetric": lambda: _nonsymmetric(rng),
         "negated": lambda: -_nonsymmetric(rng), "complex": lambda: _complex(rng)}[which]()
    A, p = _pattern(A)
    inv = np.linalg.inv(A.toarray())
    r, c = p.rows, p.indices
    z = _selinv.selinv_host(p, A.data, r, c)
    np.testing.assert_allclose(z, inv[r, c], rtol=0, atol=1e-12 * np.abs(inv).max())
    # the transposed entries (A^-T on the pattern: a log-determinant's gradient),
    # in A + A^T's pattern, also where A's is not symmetric
    zt = _selinv.selinv_host(p, A.data, c, r)
    np.testing.assert_allclose(zt, inv[c, r], rtol=0, atol=1e-12 * np.abs(inv).max())


def test_an_entry_outside_the_pattern_is_refused(rng):
    A, p = _pattern(_poisson(4))
    with pytest.raises(RuntimeError, match="outside the factor's pattern"):
        _selinv.selinv_host(p, A.data, np.array([0]), np.array([15]))


def test_a_zero_pivot_without_pivoting_is_a_breakdown():
    # nonsingular, but its pivots without row exchanges meet a zero
    A, p = _pattern(sp.csr_matrix(np.array([[0.0, 1.0], [1.0, 0.0]])))
    with pytest.raises(_selinv.SelinvBreakdown):
        _selinv.selinv_host(p, A.data, p.rows, p.indices)


@pytest.mark.parametrize("which", ["spd", "nonsymmetric", "negated", "odd_permutation",
                                   "complex"])
def test_slogdet_is_numpys(rng, which):
    if which == "odd_permutation":  # rows swapped: the sign comes from the pivoting
        A = sp.csr_matrix(np.array([[0.0, 2.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, -1.5]]))
    else:
        A = {"spd": lambda: _poisson(6, 0.1), "nonsymmetric": lambda: _nonsymmetric(rng, 31),
             "negated": lambda: -_nonsymmetric(rng, 31), "complex": lambda: _complex(rng)}[which]()
    A, p = _pattern(A)
    # (the second factorization of a pattern keeps the first's column order:
    # its sign comes through that order's)
    for values in (A.data, -A.data):
        sign, logabs = _selinv.slogdet_host(p, values)
        want = np.linalg.slogdet(sp.csr_matrix((values, A.indices, A.indptr),
                                               shape=A.shape).toarray())
        if which == "complex":  # (the phase, to rounding)
            np.testing.assert_allclose(sign, want[0], rtol=1e-13)
        else:
            assert sign == want[0]
        np.testing.assert_allclose(logabs, want[1], rtol=1e-13)


def test_slogdet_of_a_singular_matrix_is_numpys():
    A, p = _pattern(sp.csr_matrix(np.array([[1.0, 2.0], [2.0, 4.0]])))
    assert _selinv.slogdet_host(p, A.data) == (0.0, -np.inf)
    assert tuple(np.linalg.slogdet(A.toarray())) == (0.0, -np.inf)
