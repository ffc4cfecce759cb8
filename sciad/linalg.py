"""Linear solves, dense and sparse, differentiated implicitly.

```python
import sciad as sd

def misfit(m):
    A = assemble_stiffness(snp.exp(m))          # sd.sparse matrix from parameters
    u = sd.linalg.solve(A, f)                    # one factorization ...
    return 0.5 * snp.sum((u - d) ** 2)

sd.grad(misfit)(m)                               # ... reused by the adjoint solve
```

The derivative of `x = A^-1 b` costs one more solve with the same matrix
(`A^-T xbar` in reverse mode, `A^-1 (db - dA x)` in forward mode), never a
differentiation through the solver's iterations, and for sparse `A` the
cotangent of `A` is kept on its pattern. After differentiation, sciad's
`share_factors` pass gives every direct solve with one matrix a single
factorization (`linalg.factor`), used by the forward and adjoint solves
(`linalg.backsolve`).
"""

from __future__ import annotations

import jax
import numpy as np

from .errors import DTypeError, ShapeError
from .graph import Tracer
from .graph._types import KNOWN_TAGS
from .primitives._linalg import (DENSE_DIRECT, ITERATIVE, SPARSE_DIRECT, _clean,
                                 linalg_solve_p)
from .sparse import astype as _sparse_astype, issparse

__all__ = ["solve", "SOLVERS"]

#: every solver name `solve` accepts, besides "auto"
SOLVERS = DENSE_DIRECT + SPARSE_DIRECT + ITERATIVE

_ASSUME = {None: frozenset(), "general": frozenset(), "symmetric": frozenset({"symmetric"}),
           "spd": frozenset({"spd", "symmetric"}), "pos": frozenset({"spd", "symmetric"}),
           "hermitian": frozenset({"hermitian"})}


def _choose(sparse: bool, tags: frozenset, dtype) -> str:
    """The solver "auto" picks: by kind, tags and platform."""
    if not sparse:
        return "cholesky" if "spd" in tags else "lu"
    return "splu" if jax.default_backend() == "cpu" else "spsolve"


def solve(A, b, solver: str = "auto", *, assume: str | None = None, tol: float | None = None,
          atol: float = 0.0, maxiter: int | None = None, preconditioner: str | None = None):
    """Solves `A x = b`.

    Differentiable in `A` (dense, or a sparse matrix's stored values) and
    `b`, in forward and reverse mode and at any order.

    **Arguments:**

    - `A`: a square dense array `(n, n)` or sparse matrix (`sd.sparse`).
    - `b`: right-hand side(s), shape `(n,)` or `(n, k)`.
    - `solver`: `"auto"` (the default: Cholesky for a dense `spd` matrix, else
      LU; for sparse, SuperLU on the CPU and `spsolve` on a GPU), a direct
      solver (`"lu"`, `"cholesky"` dense; `"splu"`, `"spsolve"` sparse), or an
      iterative one (`"cg"` for symmetric positive definite, `"gmres"`,
      `"bicgstab"`). The choice is a param of the `linalg.solve` node, so it
      shows in the printed graph.
    - `assume`: a structure you vouch for, as in SciPy: `"symmetric"`,
      `"spd"` (`"pos"`), `"hermitian"`, or `"general"`. It adds to `A`'s own
      tags; with a symmetric `A` the adjoint solve is the forward one.
    - `tol`, `atol`, `maxiter`, `preconditioner`: for iterative solvers: the
      relative and absolute tolerance on the residual (`tol` defaults to
      1e-10 in float64 and 1e-5 in float32), the iteration limit, and
      `"jacobi"` for a diagonal preconditioner. The adjoint solve uses the
      same settings with the transposed operator.

    **Returns:**

    `x`, with `b`'s shape and the promoted dtype of `A` and `b`.

    **Raises** (when the program runs, naming this call's line):
    `SingularMatrixError`, `NotPositiveDefiniteError`, `NonFiniteError` (NaN
    or inf in `A` or `b`), `ConvergenceError` (an iterative solve that did
    not reach its tolerance, with the residual and iteration count). A
    structurally singular sparse matrix fails at trace time.
    """
    from . import numpy as snp

    op = "linalg.solve"
    if assume not in _ASSUME:
        raise ShapeError(f"`assume` must be one of {sorted(k for k in _ASSUME if k)} or None, "
                         f"got {assume!r}.", op=op)
    sparse = issparse(A)
    if not sparse:
        A = snp.asarray(A)
    b = snp.asarray(b)
    dtype = np.result_type(A.dtype, b.dtype)
    if dtype.kind not in "fc":
        dtype = np.result_type(dtype, np.float64)
    b = snp.astype(b, dtype)
    if sparse:
        A = _sparse_astype(A, dtype)
        tags = A.type.tags | _ASSUME[assume]
        if tags != A.type.tags:
            from .primitives._sparse import assemble, gather
            from .sparse import _check_tags

            _check_tags(A.type.pattern, tags, op)
            A = assemble(gather(A), A.type.pattern, None, tags)
    else:
        A = snp.astype(A, dtype)
        tags = (A.type.tags if isinstance(A, Tracer) else frozenset()) | _ASSUME[assume]
    if solver == "auto":
        solver = _choose(sparse, tags, dtype)
    if solver not in SOLVERS:
        raise ShapeError(f"unknown solver {solver!r}; choose 'auto' or one of "
                         f"{', '.join(map(repr, SOLVERS))}.", op=op)
    params: dict = {"solver": solver}
    if sparse:
        params["pattern"] = A.type.pattern
    if solver in ITERATIVE:
        if tol is None:
            tol = 1e-10 if np.finfo(dtype).bits >= 64 else 1e-5
        params.update(rtol=float(tol), atol=float(atol),
                      maxiter=None if maxiter is None else int(maxiter),
                      preconditioner=preconditioner)
    elif (tol, maxiter, preconditioner) != (None, None, None) or atol != 0.0:
        raise ShapeError(f"the direct solver {solver!r} takes no `tol`, `atol`, `maxiter` "
                         "or `preconditioner`.", op=op)
    if not sparse and {"symmetric", "spd"} & tags:
        params["assume"] = "spd" if "spd" in tags else "symmetric"
    return linalg_solve_p.bind(A, b, **_clean(params))
