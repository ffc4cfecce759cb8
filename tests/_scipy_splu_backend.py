"""A sparse direct backend in one file: SciPy's `splu` behind the direct
solvers' protocol (the test of the design, `test_solver_records.py`).

Its factor is the matrix's values (nothing to free); each solve factors on
the host with SciPy's `splu` and solves (plain or transposed) in one host
call, batched over `jax.vmap`'s leading axes. Everything else (derivatives,
checks, batching, `sd.to_jax`, the condition estimate, the cost) comes
from the protocol's defaults and `linalg.solve`'s rules.
"""

from __future__ import annotations

import jax
import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from sciad.solvers._host import host_call
from sciad.solvers._linear import AbstractDirectSolver
from sciad.solvers.direct._sparse_direct import rcond_unfactored


class ScipySplu(AbstractDirectSolver):
    """Sparse LU by SciPy's `splu` on the host, factored at every solve."""

    name = "scipy_splu"
    matrices = frozenset({"sparse"})
    sparse = True
    where = "host"

    def factor_layout(self, n, dtype, pattern):
        return (((pattern.nnz,), dtype),)

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        return (a,)

    def solve(self, factor, a, b, *, pattern=None, transpose=False, **checks):
        def host(d, rhs):  # (leading axes: a batch)
            batch = np.broadcast_shapes(d.shape[:-1], rhs.shape[:rhs.ndim - b.ndim])
            ds = np.broadcast_to(d, batch + d.shape[-1:]).reshape(-1, d.shape[-1])
            bs = np.broadcast_to(rhs, batch + b.shape).reshape((-1,) + b.shape)
            out = np.empty(bs.shape, b.dtype)
            for i, (di, bi) in enumerate(zip(ds, bs)):
                A = sp.csc_matrix(sp.csr_matrix((di, pattern.indices, pattern.indptr),
                                                shape=pattern.shape))
                try:
                    out[i] = spla.splu(A).solve(bi, trans="T" if transpose else "N")
                except RuntimeError:  # (exactly singular: NaN, which the checks judge)
                    out[i] = np.nan
            return (out.reshape(batch + b.shape),)

        return host_call(host, (jax.ShapeDtypeStruct(b.shape, b.dtype),), factor[0], b)[0]

    def rcond(self, factor, a, *, pattern=None):
        return rcond_unfactored(pattern, a)

    def factor_flops(self, n, fill):
        return fill.flops
