"""Coloring of a sparsity pattern's columns (or rows): structurally
orthogonal groups, so that one JVP (VJP) per color, seeded with the sum of
its columns' unit vectors, recovers a sparse Jacobian's values
(Curtis-Powell-Reid).

Plain NumPy/SciPy on index arrays, no graph: the solvers (the ODE steppers'
sparse Newton matrices, the nonlinear solvers) and the layers above (sparse
Jacobians, roots) share it.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def color_columns(pattern: sp.csr_matrix) -> np.ndarray:
    """A distance-1 coloring of the column intersection graph: columns that
    share no row get the same color, so one JVP per color, seeded with the
    sum of its columns' unit vectors, recovers all of them (Curtis-Powell-
    Reid). Greedy, in order of decreasing degree (largest first), which is
    near-optimal on stencils. Returns each column's color."""
    p = sp.csr_matrix(pattern, dtype=bool)
    n = p.shape[1]
    if n == 0:
        return np.zeros(0, np.int64)
    adj = (p.T.astype(np.int32) @ p.astype(np.int32)).tocsr()  # columns sharing a row
    degree = np.diff(adj.indptr)
    order = np.argsort(-degree, kind="stable")
    colors = np.full(n, -1, np.int64)
    seen = np.full(int(degree.max()) + 2, -1, np.int64)  # color -> last column that saw it
    indptr, indices = adj.indptr, adj.indices
    for j in order.tolist():
        nb = colors[indices[indptr[j]:indptr[j + 1]]]
        seen[nb[nb >= 0]] = j
        c = 0
        while seen[c] == j:
            c += 1
        colors[j] = c
    return colors


def color_seeds(colors: np.ndarray, n: int, dtype=np.float64) -> np.ndarray:
    """The `(n_colors, n)` seed vectors of a coloring: row `c` is the sum of
    the unit vectors of the columns (rows) of color `c`."""
    seeds = np.zeros((int(colors.max(initial=-1)) + 1, n), dtype)
    seeds[colors, np.arange(n)] = 1
    return seeds


def _pattern_key(p: sp.csr_matrix):
    return (p.shape, p.indptr.tobytes(), p.indices.tobytes())


_COLORINGS: dict = {}


def coloring(pattern, *, rows: bool = False) -> np.ndarray:
    """`color_columns` of `pattern` (a boolean CSR matrix or a `Pattern`; its
    transpose's, `rows=True`), computed once per pattern."""
    if not sp.issparse(pattern):  # a `Pattern` (shape, indptr, indices)
        pattern = sp.csr_matrix((np.ones(pattern.nnz, bool), pattern.indices, pattern.indptr),
                                shape=pattern.shape)
    p = sp.csr_matrix(pattern, dtype=bool)
    if rows:
        p = p.T.tocsr()
    p.sort_indices()
    key = _pattern_key(p)
    out = _COLORINGS.get(key)
    if out is None:
        if len(_COLORINGS) > 64:
            _COLORINGS.clear()
        out = _COLORINGS[key] = color_columns(p)
        out.setflags(write=False)
    return out
