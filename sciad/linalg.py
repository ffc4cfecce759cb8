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

from typing import NamedTuple

import numpy as np

from .errors import DTypeError, ShapeError
from .graph import Tracer
from .primitives._linalg import (DENSE_DIRECT, ITERATIVE, SPARSE_DIRECT, _clean,
                                 linalg_solve_p)
from .sparse import astype as _sparse_astype, issparse

__all__ = ["solve", "operator", "Operator", "SolveInfo", "SOLVERS"]

#: every solver name `solve` accepts, besides "auto"
SOLVERS = DENSE_DIRECT + SPARSE_DIRECT + ITERATIVE

_ASSUME = {None: frozenset(), "general": frozenset(), "symmetric": frozenset({"symmetric"}),
           "spd": frozenset({"spd", "symmetric"}), "pos": frozenset({"spd", "symmetric"}),
           "hermitian": frozenset({"hermitian"})}


def _choose(sparse: bool, tags: frozenset, dtype) -> str:
    """The solver "auto" picks: by kind and tags.

    Sparse matrices get SuperLU on the host on every platform: on an H100 at
    65,536 unknowns (the flagship's matrix at N = 256) its forward solve took
    0.29 s against 2.3 s for cuSOLVER's `spsolve`, which also refactors for
    the adjoint. On a GPU, `solver="cg"` (spd) takes 0.07 s there."""
    if not sparse:
        return "cholesky" if "spd" in tags else "lu"
    return "splu"


class Operator:
    """A matrix-free linear operator `v -> matvec(v)`; see `operator`."""

    def __init__(self, matvec, shape, dtype, tags: frozenset):
        self.matvec = matvec
        self.shape = shape
        self.dtype = dtype
        self.tags = tags

    def __matmul__(self, v):
        return self.matvec(v)

    def __repr__(self) -> str:
        return f"Operator(shape={self.shape}, dtype={self.dtype}, tags={sorted(self.tags)})"


def operator(matvec, shape, dtype=np.float64, *, tags=()) -> Operator:
    """A matrix-free linear operator for `solve` with an iterative solver.

    **Arguments:**

    - `matvec`: `v -> A v` for a vector `v` of shape `(n,)`, written with
      sciad ops. It must be linear in `v`; it may close over traced values
      (parameters `p` of `A(p)`), and the solve is differentiable in them:
      `pbar = -(d(A(p) x)/dp)^T lam`, through the VJP of `matvec`'s own graph.
    - `shape`: `(n, n)`.
    - `dtype`: of `v` (real: the Krylov solvers here take real operators).
    - `tags`: `"symmetric"` (or `"spd"`, which CG needs): the adjoint solve is
      then the forward one. Otherwise the adjoint uses the transpose of
      `matvec`, derived by JAX (`jax.linear_transpose`) when it runs.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ShapeError(f"a square shape (n, n) is needed, got {shape}.", op="linalg.operator")
    tags = frozenset([tags] if isinstance(tags, str) else tags)
    if tags - {"symmetric", "spd"}:
        raise ShapeError(f"operator tags are 'symmetric' and 'spd', got {sorted(tags)}.",
                         op="linalg.operator")
    if not callable(matvec):
        raise DTypeError(f"`matvec` must be a function, got {type(matvec).__name__}.",
                         op="linalg.operator")
    return Operator(matvec, shape, np.dtype(dtype), tags)


def _solve_operator(A: Operator, b, solver: str, tol, atol: float, maxiter, throw: bool):
    from . import numpy as snp
    from .graph import TensorType
    from .graph._trace import trace_flat
    from .primitives._linalg import linalg_solve_operator_p

    op = "linalg.solve"
    if solver == "auto":
        solver = "cg" if "spd" in A.tags else "gmres"
    if solver not in ITERATIVE:
        raise ShapeError(f"a matrix-free operator needs an iterative solver "
                         f"({', '.join(map(repr, ITERATIVE))}), got {solver!r}.", op=op)
    b = snp.astype(snp.asarray(b), A.dtype)
    n = A.shape[0]
    graph, _, _, captured = trace_flat(lambda v: [snp.asarray(A.matvec(v))],
                                       (TensorType((n,), A.dtype),), closure=True,
                                       name="matvec")
    if tol is None:
        tol = 1e-10 if np.finfo(A.dtype).bits >= 64 else 1e-5
    params = dict(graph=graph, solver=solver, rtol=float(tol), atol=float(atol))
    if maxiter is not None:
        params["maxiter"] = int(maxiter)
    if A.tags:
        params["symmetric"] = True
    if not throw:
        params["throw"] = False
    return linalg_solve_operator_p.bind(*captured, b, **params)


class SolveInfo(NamedTuple):
    """How a solve with `throw=False` went: `converged` (a bool), and the
    `residual` `||A x - b|| / ||b||` it reached (2-norm, over all columns)."""

    converged: object
    residual: object


def solve(A, b, solver: str = "auto", *, assume: str | None = None, tol: float | None = None,
          atol: float = 0.0, maxiter: int | None = None, preconditioner: str | None = None,
          throw: bool = True):
    """Solves `A x = b`.

    Differentiable in `A` (dense, or a sparse matrix's stored values) and
    `b`, in forward and reverse mode and at any order.

    **Arguments:**

    - `A`: a square dense array `(n, n)` or sparse matrix (`sd.sparse`).
    - `b`: right-hand side(s), shape `(n,)` or `(n, k)`.
    - `solver`: `"auto"` (the default: Cholesky for a dense `spd` matrix, else
      LU; SuperLU for a sparse one, on the host also when the program runs
      on a GPU), a direct
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

    - `throw`: with `False`, a failed solve raises nothing: the result is
      `(x, SolveInfo(converged, residual))`, the residual measured with one
      more product `A @ x` (`converged`: finite and `residual <= tol` for an
      iterative solver, `<= sqrt(eps)` for a direct one). Derivatives of `x`
      are computed with solves that do raise, so a gradient is never taken
      silently from a failed solve.

    **Returns:**

    `x`, with `b`'s shape and the promoted dtype of `A` and `b` (with
    `throw=False`, `(x, info)`).

    **Raises** (when the program runs, naming this call's line):
    `SingularMatrixError`, `NotPositiveDefiniteError`, `NonFiniteError` (NaN
    or inf in `A` or `b`), `ConvergenceError` (an iterative solve that did
    not reach its tolerance, with the residual and iteration count). A
    structurally singular sparse matrix fails at trace time.
    """
    from . import numpy as snp

    op = "linalg.solve"
    if isinstance(A, Operator):
        if preconditioner is not None or assume is not None:
            raise ShapeError("a matrix-free operator takes no `preconditioner` or `assume` "
                             "(give `tags` to `sd.linalg.operator`).", op=op)
        x = _solve_operator(A, b, solver, tol, atol, maxiter, throw)
        if throw:
            return x
        r = A.matvec(x) - b if len(x.shape) == 1 else None
        return x, _info_from_residual(r, b, x, tol if tol is not None else 1e-10, atol)
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
    if throw:
        return linalg_solve_p.bind(A, b, **_clean(params))
    x = linalg_solve_p.bind(A, b, **_clean(dict(params, throw=False)))
    tol = tol if solver in ITERATIVE else float(np.sqrt(np.finfo(dtype).eps))
    return x, _info_from_residual(A @ x - b, b, x, tol, atol)


def _info_from_residual(r, b, x, tol: float, atol: float) -> SolveInfo:
    """Converged: `||r|| <= tol ||b|| + atol` (the iterative solvers' own test)
    with everything finite. A NaN or inf in `x` makes the residual one too."""
    from . import numpy as snp

    if r is None:  # several right-hand sides of a matrix-free operator
        raise ShapeError("`throw=False` with a matrix-free operator takes one right-hand "
                         "side.", op="linalg.solve")
    rnorm = snp.sqrt(snp.sum(snp.abs(r) ** 2))
    bnorm = snp.sqrt(snp.sum(snp.abs(b) ** 2))
    residual = rnorm / snp.where(bnorm > 0, bnorm, 1.0)
    converged = snp.logical_and(rnorm <= tol * bnorm + atol, snp.isfinite(residual))
    return SolveInfo(converged, residual)
