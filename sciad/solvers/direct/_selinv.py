"""Sparse log-determinants and selected inverses on the host.

- `slogdet_host(pattern, d)`: NumPy's `(sign, log|det A|)` of the sparse
  matrix with values `d` on `pattern`, from the SuperLU factorization with
  partial pivoting that sparse solves make (`Pr A^T Pc = L U`, `L` unit
  lower: the product of `U`'s diagonal and the permutations' signs). An
  exactly singular matrix is `(0, -inf)`, as NumPy's.
- `selinv_host(pattern, d, rows, cols)`: the entries `(A^-1)[rows[k], cols[k]]`
  without the dense inverse: SuperLU factors `A` (its pattern symmetrized
  with stored zeros) in its symmetric mode without pivoting (the minimum
  degree ordering of `A + A^T`, `diag_pivot_thresh=0`: `P A P^T = L D U` on
  one structurally symmetric pattern), and Takahashi's recurrence
  (`csrc/selinv.cc`, built on first use; a NumPy version of the same loop
  where no compiler is found) gives `Z = A^-1` on the factor's filled
  pattern, which holds every requested entry that is in `A + A^T`'s pattern.

Real and complex matrices alike (the recurrence in double or complex
double). Without pivoting the factorization is that of a positive definite
or diagonally dominant matrix: a zero pivot is `SelinvBreakdown`, which the
caller reports. These are the host kernels of `solver="splu"` for
`sd.linalg.slogdet` and `sd.linalg.selected_inverse` (`primitives/_logdet.py`:
their derivatives are selected inverses of the block matrix `[[A, dA], [0,
A]]`, to every order); an spd matrix is read by the compiled sparse Cholesky
factor on the same kept structure instead (`_fill_cholesky`, whose reverse
mode is the symmetric recurrence). The ordering, the fill and the ordered
matrix's layout depend on the pattern alone and are kept per pattern
(sciad's analysis cache: the first call pays a second, structural
factorization). At 65,536 unknowns (a 2-D 5-point matrix) a later call
takes about 1.3 s here: 0.23 s SuperLU's numeric factorization, about 0.5 s
the recurrence, the rest NumPy's bookkeeping.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from .._build import Library

SOURCE = Path(__file__).parent.parent / "csrc" / "selinv.cc"

_P = ctypes.POINTER


def _setup(lib) -> None:
    i64, f64 = _P(ctypes.c_int64), _P(ctypes.c_double)
    for fn in (lib.sciad_selinv, lib.sciad_selinv_c128):  # (complex128: pairs of doubles)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int64, i64, i64, f64, f64, f64, f64, f64, f64]


LIBRARY = Library(SOURCE, "selinv", "libsciad_selinv.so", "sciad's selected inverse", _setup)


def _parity(perm: np.ndarray) -> int:
    """+1 for an even permutation, -1 for an odd one: `(-1)^(n - cycles)`,
    its cycles the components of the graph `i -> perm[i]`."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    n = np.size(perm)
    if n == 0:
        return 1
    graph = sp.csr_matrix((np.ones(n), (np.arange(n), np.asarray(perm))), shape=(n, n))
    cycles, _ = connected_components(graph, directed=False)
    return -1 if (n - cycles) % 2 else 1


def slogdet_host(pattern, d: np.ndarray) -> tuple:
    """`(sign, log|det A|)` (see the module docstring), from the SuperLU
    factor of `A^T` that sparse solves make (`_sparse_direct._factor_one`:
    the pattern's column order kept from its first factorization). For a
    complex `A` the sign is the determinant's phase, `det A / |det A|`."""
    from ._sparse_direct import _Ordered, _factor_one

    if pattern.shape[0] == 0:
        return 1.0, 0.0
    lu = _factor_one(pattern, d)  # (det A^T = det A)
    if lu is None:  # exactly singular
        return 0.0, -np.inf
    sign = 1
    if isinstance(lu, _Ordered):  # (of A^T[:, order]: its determinant times order's sign)
        sign, lu = _parity(lu.order), lu.lu
    u = lu.U.diagonal()
    if not np.all(u != 0):
        return 0.0, -np.inf
    phase = np.prod(u / np.abs(u))  # (+-1 for a real matrix)
    sign = sign * _parity(lu.perm_r) * _parity(lu.perm_c) * phase
    return (complex(sign) if np.iscomplexobj(u) else float(sign)), \
        float(np.sum(np.log(np.abs(u))))


class SelinvBreakdown(Exception):
    """A zero pivot of the factorization without pivoting, at the ordered
    `column` (None where SuperLU stopped without saying where)."""

    def __init__(self, column: int | None):
        super().__init__(column)
        self.column = column


class _Analysis:
    """What a pattern's selected inverses share (sciad's analysis cache keeps
    it per pattern): the ordering `perm`, the fill `S` of the ordered
    `A + A^T` (CSC, strictly lower: `Sp`, `Si`, and its column-major keys
    `key`), and the ordered matrix's CSC layout (`indptr`, `indices`) with,
    for each of its entries, the data index of `A` it holds (-1: a stored
    zero, where only `A^T` has an entry)."""

    __slots__ = ("perm", "Sp", "Si", "key", "indptr", "indices", "src")

    def __init__(self, pattern):
        import scipy.sparse as sp
        import scipy.sparse.linalg as spl

        n = pattern.shape[0]
        r = np.asarray(pattern.rows, np.int64)
        c = np.asarray(pattern.indices, np.int64)
        # the pattern of A + A^T, each entry's source in A (or -1)
        key_a = c * n + r                     # (column-major keys of A's entries)
        key_t = r * n + c                     # (those of A^T's)
        keys, first = np.unique(np.concatenate([key_a, key_t]), return_index=True)
        src = np.where(first < r.size, first, -1)
        # the fill: the factor of a matrix on that pattern whose values cannot
        # cancel (symmetric, diagonally dominant, positive definite), ordered
        # by minimum degree on A + A^T
        rr, cc = keys % n, keys // n
        M = sp.csc_matrix((-np.ones(keys.size), (rr, cc)), shape=(n, n))
        M = M + sp.diags(np.asarray(abs(M).sum(axis=1)).ravel() + 2.0)
        fill = spl.splu(M.tocsc(), permc_spec="MMD_AT_PLUS_A", **_UNPIVOTED)
        perm = np.asarray(fill.perm_c, np.int64)
        if not np.array_equal(fill.perm_r, perm):
            raise RuntimeError("sciad's selected inverse: SuperLU pivoted a positive definite "
                               "matrix")
        F = sp.tril(fill.L, -1).tocoo()
        key = F.row.astype(np.int64) + n * F.col.astype(np.int64)
        if not np.all(key[1:] > key[:-1]):  # (SuperLU's columns come sorted: rarely taken)
            key = np.unique(key)
        self.perm, self.key = perm, key
        self.Si = key % n
        self.Sp = np.concatenate([[0], np.cumsum(np.bincount(key // n, minlength=n))]).astype(
            np.int64)
        # the ordered matrix B[perm[i], perm[j]] = A[i, j], in CSC order
        order = np.argsort(perm[cc] * n + perm[rr], kind="stable")
        self.src = src[order]
        self.indices = perm[rr][order].astype(np.int32)
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(perm[cc], minlength=n))]
                                     ).astype(np.int32)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, k).nbytes for k in self.__slots__)


_UNPIVOTED = dict(diag_pivot_thresh=0.0, options=dict(SymmetricMode=True))


def _analysis(pattern) -> _Analysis:
    from ... import _cache

    return _cache.cached(pattern, "selected inverse", None, lambda: _Analysis(pattern),
                         nbytes=lambda a: a.nbytes)


def _factor_unpivoted(pattern, d: np.ndarray):
    """`(analysis, Lx, Ux, dg)`: `P A P^T = L D U` on the analysis's filled
    pattern `S` (CSC, strictly lower; see `csrc/selinv.cc`; `A[i, j]` is the
    ordered matrix's `[perm[i], perm[j]]`)."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spl

    n = pattern.shape[0]
    an = _analysis(pattern)
    data = np.where(an.src >= 0, d[np.maximum(an.src, 0)], 0.0).astype(d.dtype)
    B = sp.csc_matrix((data, an.indices, an.indptr), shape=(n, n))
    try:
        lu = spl.splu(B, permc_spec="NATURAL", **_UNPIVOTED)
    except RuntimeError:
        raise SelinvBreakdown(None) from None
    ident = np.arange(n)
    if not (np.array_equal(lu.perm_r, ident) and np.array_equal(lu.perm_c, ident)):
        raise SelinvBreakdown(None)
    U = lu.U.tocsc()
    wide = np.complex128 if np.iscomplexobj(d) else np.float64
    dg = U.diagonal().astype(wide)
    bad = ~(np.abs(dg) > 0) | ~np.isfinite(dg)
    if np.any(bad):
        raise SelinvBreakdown(int(np.flatnonzero(bad)[0]))
    L = sp.tril(lu.L, -1).tocoo()
    Ut = (sp.diags(1.0 / dg) @ sp.triu(U, 1)).T.tocoo()   # U's unit upper part, transposed
    Lx, Ux = np.zeros(an.key.size, wide), np.zeros(an.key.size, wide)
    for vals, M in ((Lx, L), (Ux, Ut)):
        key = M.row.astype(np.int64) + n * M.col.astype(np.int64)
        at = np.minimum(np.searchsorted(an.key, key), max(an.key.size - 1, 0))
        if key.size and not np.array_equal(an.key[at], key):
            raise RuntimeError("sciad's selected inverse: the factor has an entry outside "
                               "its fill")
        np.add.at(vals, at, M.data)
    return an, Lx, Ux, dg


def _takahashi_numpy(n, Sp, Si, Lx, Ux, d):
    """The loop of `csrc/selinv.cc`, in Python (where no compiler is found)."""
    dt = np.result_type(Lx, Ux, d)
    Zl, Zu, Zd = np.zeros(Si.size, dt), np.zeros(Si.size, dt), np.zeros(n, dt)
    pos = -np.ones(n, np.int64)
    for j in range(n - 1, -1, -1):
        b, e = Sp[j], Sp[j + 1]
        for q in range(b, e):
            k = Si[q]
            lk, uk = Lx[q], Ux[q]
            Zl[q] -= Zd[k] * lk
            Zu[q] -= uk * Zd[k]
            cols = slice(Sp[k], Sp[k + 1])
            pos[Si[cols]] = np.arange(Sp[k], Sp[k + 1])
            t = np.arange(q + 1, e)
            p = pos[Si[t]]
            if np.any(p < 0):
                return None, -(j + 1)
            zrk, zkr = Zl[p], Zu[p]
            Zl[t] -= zrk * lk
            Zl[q] -= np.dot(zkr, Lx[t])
            Zu[q] -= np.dot(Ux[t], zrk)
            Zu[t] -= uk * zkr
            pos[Si[cols]] = -1
        Zd[j] = 1.0 / d[j] - np.dot(Ux[b:e], Zl[b:e])
    return (Zl, Zu, Zd), 0


def selinv_host(pattern, d: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """`(A^-1)[rows, cols]` (see the module docstring); `SelinvBreakdown` at
    a zero pivot. Each `(rows[k], cols[k])` must be in the pattern of
    `A + A^T`."""
    n = pattern.shape[0]
    if n == 0:
        return np.zeros(np.size(rows), d.dtype)
    an, Lx, Ux, dg = _factor_unpivoted(pattern, d)
    perm, Sp, Si = an.perm, an.Sp, an.Si
    lib = LIBRARY.get()
    if lib is not None:
        wide = dg.dtype  # (float64 or complex128)
        Zl, Zu, Zd = np.zeros(Si.size, wide), np.zeros(Si.size, wide), np.zeros(n, wide)
        ptr = lambda a: a.ctypes.data_as(_P(ctypes.c_int64 if a.dtype == np.int64  # noqa: E731
                                            else ctypes.c_double))
        Sp, Si = np.ascontiguousarray(Sp), np.ascontiguousarray(Si)
        Lx, Ux, dg = (np.ascontiguousarray(x, wide) for x in (Lx, Ux, dg))
        fn = lib.sciad_selinv_c128 if wide == np.complex128 else lib.sciad_selinv
        status = fn(n, ptr(Sp), ptr(Si), ptr(Lx), ptr(Ux), ptr(dg), ptr(Zl), ptr(Zu), ptr(Zd))
    else:
        got, status = _takahashi_numpy(n, Sp, Si, Lx, Ux, dg)
        if got is not None:
            Zl, Zu, Zd = got
    if status < 0:  # (not expected: the recurrence's pattern is the factor's fill)
        raise RuntimeError(f"sciad's selected inverse: the factor's pattern is not closed at "
                           f"column {-status - 1}")
    if status > 0:
        raise SelinvBreakdown(status - 1)
    # A^-1 = Pc (LU)^-1 Pr: (A^-1)[a, b] = Z[perm[a], perm[b]]
    x, y = perm[np.asarray(rows, np.int64)], perm[np.asarray(cols, np.int64)]
    lo, hi = np.maximum(x, y), np.minimum(x, y)   # S's (row, col) of the entry
    key_s = an.key
    where = np.searchsorted(key_s, lo + n * hi)
    where = np.minimum(where, max(Si.size - 1, 0))
    out = np.where(x > y, Zl[where] if Si.size else 0.0, 0.0)
    out = np.where(x < y, Zu[where] if Si.size else 0.0, out)
    out = np.where(x == y, Zd[x], out)
    off = x != y
    if Si.size and np.any(key_s[where[off]] != (lo + n * hi)[off]):
        raise RuntimeError("sciad's selected inverse: an entry asked for is outside the "
                           "factor's pattern")
    return out
