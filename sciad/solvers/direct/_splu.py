"""`"splu"`: SciPy's SuperLU on the host, its factor held there (the program
holds a handle), checked and refined in the host calls that factor and solve
(`sciad.solvers.direct._sparse_direct`). "auto"'s choice for a sparse matrix on every
platform: on an H100 at 65,536 unknowns (the flagship's matrix at N = 256)
its forward solve took 0.29 s against 2.3 s for cuSOLVER's `spsolve`, which
also refactors for the adjoint (on a GPU, `solver="cg"` (spd) takes 0.07 s
there)."""

from __future__ import annotations

import numpy as np

from . import _sparse_direct
from .._linear import AbstractDirectSolver


class SuperLU(AbstractDirectSolver):
    """Sparse LU (SuperLU) on the host: the factor is `(handle,)`, an int32."""

    name = "splu"
    matrices = frozenset({"sparse"})
    sparse = True
    where = "host"
    held_on_host = True
    host_checks = True

    def preference(self, *, matrix, tags, dtype):
        return 1.0 if matrix == "sparse" else None

    def factor_layout(self, n, dtype, pattern):
        return (((), np.int32),)

    #: (a failed check's release of the run's factors: see `_sparse_direct`)
    release_now = staticmethod(_sparse_direct.release_now)

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        return _sparse_direct.factor(pattern, a, uses=uses, assume=assume, report=report)

    def solve(self, factor, a, b, *, pattern=None, transpose=False, **checks):
        return _sparse_direct.solve(pattern, factor, a, b, transpose, **checks)

    def rcond(self, factor, a, *, pattern=None):
        return _sparse_direct.rcond_estimate(pattern, factor, a)

    def factor_flops(self, n, fill):
        return fill.flops
