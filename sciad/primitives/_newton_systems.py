"""The Newton systems of the nodes that solve them (a root's residual, an
implicit ODE stepper's stages): dense, or sparse on the pattern detected
from the node's body (`sciad.graph._sparsity`)."""

from __future__ import annotations

import scipy.sparse as sp

from ..graph._sparsity import graph_sparsity
from ..graph._types import Pattern
from ..solvers.nonlinear._root_methods import sparse_jacobian


def _pattern(p: sp.csr_matrix) -> Pattern:
    p = sp.csr_matrix(p, dtype=bool)
    p.sum_duplicates()
    p.sort_indices()
    return Pattern(p.shape, p.indptr, p.indices)


#: `newton_jacobian(jac=None)` takes a dense Jacobian up to this many unknowns,
#: or where the detected pattern fills more than `DENSE_ABOVE` of the matrix
DENSE_UP_TO = 64
DENSE_ABOVE = 0.2


def newton_jacobian(graph, jac: str | None, *, identity: bool = False):
    """`(jac, pattern)` for the Newton systems of a node whose body `graph`
    maps `(..., x)` to a residual of `x`'s size (a root's residual, an ODE's
    vector field): `jac` as given, or for None dense up to `DENSE_UP_TO`
    unknowns or above `DENSE_ABOVE` fill, else sparse; `pattern`, for
    sparse, detected from `graph` in its last input, with the diagonal added
    if `identity` (an `I - c J` matrix)."""
    n = graph.inputs[-1].type.size
    if jac is None and n <= DENSE_UP_TO:
        return "dense", None
    if jac is not None and not sparse_jacobian(jac):
        return jac, None
    p = graph_sparsity(graph, [False] * (len(graph.inputs) - 1) + [True])
    if identity:
        p = (p + sp.eye(n, dtype=bool, format="csr")).astype(bool)
    if jac is None:
        jac = "dense" if p.nnz > DENSE_ABOVE * n * n else "sparse"
    return jac, _pattern(p) if sparse_jacobian(jac) else None
