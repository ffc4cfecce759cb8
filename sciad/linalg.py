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

import warnings
from typing import NamedTuple

import numpy as np
import scipy.sparse as _sp

from . import numpy as snp
from .errors import DTypeError, InvalidOptionError, NotSupportedError, ShapeError, StructureError
from .graph import Tracer
from .numpy import _as_array
from .primitives._checks import eps_of, refine_above, symmetry_tolerance
from .primitives._eigen import FUNCTIONS, eigh as _eigh, eigh_apply
from .primitives._eigsh import WHICH, eigsh as _eigsh, eigsh_host_operator, eigsh_operator
from .primitives import _sparse_cholesky as _chol
from .primitives._logdet import linalg_selected_inverse_p, linalg_slogdet_p
from .primitives._linalg import (NORMS, _clean, linalg_rcond_p, linalg_solve_p, solve_operator,
                                 solve_params)
from .primitives._sparse import assemble, gather
from .primitives._svd import svd as _svd
from .solvers._linear import backend as _backend, ranking as _ranking, requested, resolve
from .solvers._measures import ratio
from .solvers.iterative._amg import AMG
from .solvers._registry import names as _solver_names
from .sparse import _check_tags, astype as _sparse_astype, data as _data, issparse, with_data
from .sparse import csr_matrix as sparse_csr_matrix, sample as sparse_sample
from .sparse import from_scipy as _from_scipy, sharded_matmul, todense as sparse_todense

__all__ = ["solve", "AMG", "rigid_body_modes", "explain_solver", "cond", "slogdet", "selected_inverse", "precision_sample", "eigh", "eigvalsh", "eigsh", "funm_hermitian", "svd", "operator", "Operator", "SolveInfo", "SOLVERS"]

SOLVERS = _solver_names("linear")
"""Every built-in solver name `solve` accepts, besides "auto" and "amg" (the
registered records of `sciad.solvers`): `"lu"`, `"cholesky"`, `"splu"`, ...;
`sd.show_config()` says which run here."""

_ASSUME = {None: frozenset(), "general": frozenset(), "symmetric": frozenset({"symmetric"}),
           "spd": frozenset({"spd", "symmetric"}), "pos": frozenset({"spd", "symmetric"}),
           "hermitian": frozenset({"hermitian"})}


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
    return solve_operator(A.matvec, A.shape[0], A.dtype, A.tags, b, solver, tol=tol, atol=atol,
                          maxiter=maxiter, throw=throw)


class SolveInfo(NamedTuple):
    """How a solve with `throw=False` went.

    - `converged`: a bool: the solve would have raised nothing with
      `throw=True` (finite; for a direct solve, a backward error within the
      bound and a system that is not singular to working precision; for an
      iterative one, the residual within the tolerance).
    - `residual`: the relative residual `||A x - b|| / ||b||` (2-norm, over
      all columns).
    - `rcond`: the reciprocal condition estimate `1 / (||A||_1 ||A^-1||_1)`
      from the solve's factorization (a few extra triangular solves); NaN for
      iterative solves. Below the dtype's `eps`, the matrix is singular to
      working precision.
    - `backward_error`: `||A x - b|| / (||A|| ||x|| + ||b||)` (inf-norms,
      the worst column): how far `x` is from solving a nearby system.
    """

    converged: object
    residual: object
    rcond: object = None
    backward_error: object = None


def _check_assume(assume, op: str) -> None:
    if assume not in _ASSUME:
        raise InvalidOptionError(f"`assume` must be one of "
                                 f"{sorted(k for k in _ASSUME if k)} or None, got {assume!r}.",
                                 op=op)


def _prepare(A, b, assume, op: str):
    """`(A, b, tags, sparse, dtype)`: the operands promoted to one float or
    complex dtype, and the structure `A` has (its tags and `assume`)."""
    _check_assume(assume, op)
    sparse = issparse(A)
    if not sparse:
        A = _as_array(A, op)
    dtype = np.result_type(A.dtype, *(() if b is None else (b.dtype,)))
    if dtype.kind not in "fc":
        dtype = np.result_type(dtype, np.float64)
    if b is not None:
        b = snp.astype(b, dtype)
    if sparse:
        A = _sparse_astype(A, dtype)
        tags = A.type.tags | _ASSUME[assume]
        if tags != A.type.tags:
            _check_tags(A.type.pattern, tags, op)
            A = assemble(gather(A), A.type.pattern, None, tags)
    else:
        A = snp.astype(A, dtype)
        tags = (A.type.tags if isinstance(A, Tracer) else frozenset()) | _ASSUME[assume]
    return A, b, tags, sparse, dtype


def rigid_body_modes(points) -> np.ndarray:
    """The rigid-body modes of linear elasticity at the nodes `points`
    (`(n_nodes, d)`, d = 2 or 3): an array `(d n_nodes, 3)` in 2-D (two
    translations, one rotation) or `(3 n_nodes, 6)` in 3-D (three
    translations, three rotations about the centroid), unknowns interleaved
    per node (`u_x, u_y[, u_z]` of node 0, then node 1, ...): the
    near-null space of an elasticity stiffness matrix for
    `sd.linalg.AMG(near_null_space=..., block_size=d)`. Eliminated
    (Dirichlet) unknowns are dropped by indexing its rows as the matrix's.

        B = sd.linalg.rigid_body_modes(points)[free]   # the free unknowns' rows
    """
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] not in (2, 3) or not np.all(np.isfinite(x)):
        raise ShapeError(f"`points` must be finite node coordinates (n_nodes, 2) or (n_nodes, "
                         f"3), got {'non-finite values' if x.ndim == 2 and x.shape[1] in (2, 3) else f'shape {x.shape}'}.",
                         op="linalg.rigid_body_modes")
    n, d = x.shape
    x = x - x.mean(axis=0)
    if d == 2:
        b = np.zeros((n, 2, 3))
        b[:, 0, 0] = b[:, 1, 1] = 1.0
        b[:, 0, 2], b[:, 1, 2] = -x[:, 1], x[:, 0]
        return b.reshape(2 * n, 3)
    b = np.zeros((n, 3, 6))
    b[:, 0, 0] = b[:, 1, 1] = b[:, 2, 2] = 1.0
    # rotations about z, x, y: (-y, x, 0), (0, -z, y), (z, 0, -x)
    b[:, 0, 3], b[:, 1, 3] = -x[:, 1], x[:, 0]
    b[:, 1, 4], b[:, 2, 4] = -x[:, 2], x[:, 1]
    b[:, 0, 5], b[:, 2, 5] = x[:, 2], -x[:, 0]
    return b.reshape(3 * n, 6)


def solve(A, b, solver: str = "auto", *, assume: str | None = None, tol: float | None = None,
          atol: float = 0.0, maxiter: int | None = None, preconditioner=None,
          throw: bool = True, partition=None):
    """Solves `A x = b`.

    Differentiable in `A` (dense, or a sparse matrix's stored values) and
    `b`, in forward and reverse mode and at any order.

    **Arguments:**

    - `A`: a square dense array `(n, n)` or sparse matrix (`sd.sparse`).
    - `b`: right-hand side(s), shape `(n,)` or `(n, k)`.
    - `solver`: `"auto"` (the default: Cholesky for a dense `spd` matrix, else
      LU; for a sparse one on the CPU, KLU compiled into the program up to
      12,000 unknowns, CHOLMOD's Cholesky for an `spd` one from 2,500
      unknowns where the `[cholmod]` extra is installed, else SuperLU; where
      the program runs on an NVIDIA GPU, cuDSS where the `[cuda]` extra is
      installed, else CG with `preconditioner="amg"` for an `spd` matrix and
      GMRES otherwise, in the program: "auto" never factors on the host
      when the program runs on an accelerator; `explain_solver(A)` says what
      it picks and why), a direct
      solver (`"lu"`, `"cholesky"` dense; `"klu"`, `"cholmod"`, `"splu"`,
      `"spsolve"`, `"cudss"` sparse), or an
      iterative one (`"cg"` for symmetric positive definite, `"gmres"`,
      `"bicgstab"`). `"amg"` is short for an iterative solve preconditioned by
      algebraic multigrid (a sparse matrix): `"cg"` with
      `preconditioner="amg"` where `A` is tagged or assumed `"spd"`, else
      `"gmres"` with it. The choice is a param of the `linalg.solve` node,
      so it shows in the printed graph.
    - `assume`: a structure you vouch for, as in SciPy: `"symmetric"`,
      `"spd"` (`"pos"`), `"hermitian"`, or `"general"`. It adds to `A`'s own
      tags. It is checked when the program runs (symmetry to `sqrt(eps)`
      relative, O(nnz); positive definiteness by Cholesky itself): a claim
      the values contradict raises `StructureError`.
    - `tol`, `atol`, `maxiter`, `preconditioner`: for iterative solvers: the
      relative and absolute tolerance on the residual (`tol` defaults to
      1e-10 in float64 and 1e-5 in float32), the iteration limit, and the
      preconditioner: `"jacobi"` (diagonal), `"amg"` (smoothed-aggregation
      algebraic multigrid, one V-cycle per step, for a sparse matrix; its
      hierarchy is built on the host once per matrix values, see the guide
      "Linear solves"), or `AMG(near_null_space=B, block_size=b)`, the same
      fitted to a near-null space (elasticity's `rigid_body_modes`). The adjoint solve uses the same settings with the
      transposed operator (and the same preconditioner, transposed), and
      meets the same tolerance.
    - `throw`: with `False`, a failed solve raises nothing: the result is
      `(x, SolveInfo(converged, residual, rcond, backward_error))`, measured
      with one more product `A @ x` and, for a direct solve, a condition
      estimate from its factorization. Derivatives of `x` are computed with
      solves that do raise, so a gradient is never taken silently from a
      failed solve.
    - `partition`: a sparse matrix's rows split over the devices of a mesh
      axis (`sd.sparse.row_partition(A.type.pattern, devices, axis)`), for an
      iterative solve (`"cg"`, `"gmres"`, `"bicgstab"`; `"auto"` picks
      `"cg"` for an spd matrix, else `"gmres"`): under a mesh with that axis
      (`jax.set_mesh(mesh)`) the Krylov loop's vectors stay split as the
      rows, its products are `sd.sparse.sharded_matmul`'s (halo exchange
      only), each inner product is a local one and an all-reduce, and the
      adjoint's transposed solve and sampled product are sharded too.
      `preconditioner` is then None, `"jacobi"` (each device its rows'
      diagonal) or `"block_amg"` (block-Jacobi over the partition's blocks,
      each device's diagonal block approximately inverted by one V-cycle of
      its own AMG hierarchy; spd for an spd `A`). Without a mesh it is the
      one-device solve (`"block_amg"`: the same blocks, on one device). See
      the guide "Batching and devices", "Distributed Krylov":

          part = sd.sparse.row_partition(A.type.pattern, 4, "rows")
          with jax.set_mesh(jax.make_mesh((4,), ("rows",),
                                          axis_types=(AxisType.Auto,))):
              x = sd.function(lambda A, b: sd.linalg.solve(
                  A, b, solver="cg", partition=part))(A, b)

    **Returns:**

    `x`, with `b`'s shape and the promoted dtype of `A` and `b` (with
    `throw=False`, `(x, info)`).

    **Raises** (when the program runs, naming this call's line):

    - `SingularMatrixError`: a zero pivot; a system singular to working
      precision (condition number above `1/eps` and a solution that does
      not satisfy it to `sqrt(eps)`); or a solve whose backward error stays
      above `min(10 n eps, sqrt(eps))` after a step of iterative refinement.
      The message gives the backward error and the condition estimate.
    - `NotPositiveDefiniteError` (Cholesky breakdown), `StructureError` (a
      tag or `assume` the values contradict), `NonFiniteError` (NaN or inf
      in `A` or `b`), `ConvergenceError` (an iterative solve that did not
      reach its tolerance, with the residual and iteration count).

    A matrix whose condition estimate exceeds `1/eps` but whose solution
    has a small residual gives an `IllConditionedWarning` (dense matrices
    always; sparse ones when the residual calls for an estimate, or always
    with `sd.config.enable_checks` on, since a sparse estimate costs a few
    extra solves). A structurally singular sparse matrix fails at trace time.

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    A, b = np.array([[4.0, 1.0], [1.0, 3.0]]), np.array([1.0, 2.0])
    sd.linalg.solve(A, b)                                         # [0.09090909 0.63636364]
    sd.grad(lambda b: snp.sum(sd.linalg.solve(A, b)))(b)          # [0.18181818 0.27272727]
    ```
    """
    op = "linalg.solve"
    if isinstance(A, Operator):
        if preconditioner is not None or assume is not None:
            raise InvalidOptionError("a matrix-free operator takes no `preconditioner` or `assume` "
                                     "(give `tags` to `sd.linalg.operator`).", op=op)
        x = _solve_operator(A, b, solver, tol, atol, maxiter, throw)
        if throw:
            return x
        r = A.matvec(x) - b if len(x.shape) == 1 else None
        return x, _info(r, b, x, None, None, tol if tol is not None else 1e-10, atol)
    A, b, tags, sparse, dtype = _prepare(A, snp.asarray(b), assume, op)
    solver, preconditioner = requested(solver, preconditioner, tags=tags, partition=partition,
                                       op=op)
    record, params = solve_params(sparse, A.type.pattern if sparse else None, tags, dtype,
                                  solver, tol=tol, atol=atol, maxiter=maxiter,
                                  preconditioner=preconditioner, op=op)
    solver = record.name
    if not record.direct:
        tol = params["rtol"]
    if partition is not None:
        params["partition"] = partition
    if throw:
        return linalg_solve_p.bind(A, b, **_clean(params))
    x = linalg_solve_p.bind(A, b, **_clean(dict(params, throw=False)))
    rcond = None
    if record.direct:
        rparams = {"solver": solver, "constant": True,
                   **({"pattern": params["pattern"]} if sparse else {})}
        rcond = linalg_rcond_p.bind(A, **rparams)
    Ax = A @ x if partition is None or len(x.shape) != 1 else sharded_matmul(A, x, partition)
    return x, _info(Ax - b, b, x, A, rcond, None if record.direct else tol, atol)


def _info(r, b, x, A, rcond, tol: float | None, atol: float) -> SolveInfo:
    """The `SolveInfo` of `x` with residual `r = A x - b`. `tol` None: a
    direct solve, judged like `throw=True` would (see `solve`)."""
    if r is None:  # several right-hand sides of a matrix-free operator
        raise ShapeError("`throw=False` with a matrix-free operator takes one right-hand "
                         "side.", op="linalg.solve")
    rnorm = snp.sqrt(snp.sum(snp.abs(r) ** 2))
    bnorm = snp.sqrt(snp.sum(snp.abs(b) ** 2))
    residual = rnorm / snp.where(bnorm > 0, bnorm, 1.0)
    residual = snp.where((bnorm > 0) | ~(rnorm <= 0), residual, 0.0)  # (NaN stays)
    finite = snp.isfinite(residual)
    real = np.finfo(np.dtype(x.dtype)).dtype
    eta = snp.asarray(np.nan, real)
    if A is not None and x.shape[0] == 0:  # no unknowns: no error (and no max to take)
        eta = snp.zeros((), real)
    elif A is not None:
        axis = 0
        if issparse(A):  # row sums of |A|, on the pattern
            absA = with_data(A, snp.abs(_data(A)))
            anorm = snp.max(absA @ snp.ones(A.shape[1], real))
        else:
            anorm = snp.max(snp.sum(snp.abs(A), axis=1))
        rn = snp.max(snp.abs(r), axis=axis)
        xn = snp.max(snp.abs(x), axis=axis)
        bn = snp.max(snp.abs(b), axis=axis)
        eta = snp.max(ratio(rn, anorm * xn + bn, snp))
    if tol is not None:  # iterative: its own test
        converged = snp.logical_and(rnorm <= tol * bnorm + atol, finite)
        rc = snp.asarray(np.nan, real) if rcond is None else rcond
        return SolveInfo(converged, residual, rc, eta)
    eps = eps_of(x.dtype)
    n = x.shape[0]
    singular = snp.logical_and(rcond < eps, ~(residual <= np.sqrt(eps)))
    converged = snp.logical_and(snp.logical_and(finite, eta <= refine_above(x.dtype, n)),
                                snp.logical_not(singular))
    return SolveInfo(converged, residual, rcond, eta)


def explain_solver(A, *, assume: str | None = None) -> str:
    """Which solver `solve(A, b)` picks with `solver="auto"`, and why.

    Every registered solver, the most preferred first: the one picked, the
    others "auto" would take next (with their preference), and those it may
    not take here with the reason (the matrix's kind, dtype or structure; a
    missing extra; a factorization on the host where the program runs on an
    accelerator: "auto" never moves a solve to the host, name the solver to
    do so). The preferences are those each solver's record states (measured,
    see its module); on the CPU a sparse matrix's size moves them.

    **Arguments:**

    - `A`: the matrix as `solve` takes it: a dense array, a sparse matrix
      (`sd.sparse`, or SciPy's), concrete or traced.
    - `assume`: as `solve`'s (`"spd"`, `"symmetric"`, ...).

    **Returns:** the explanation, as text.

    ```python
    A = sd.sparse.from_dense(2 * np.eye(4) - np.eye(4, k=1) - np.eye(4, k=-1), tags={"spd"})
    print(sd.linalg.explain_solver(A))
    # solver="auto" picks 'klu' for a sparse float64[4, 4] matrix (nnz=10; tags: spd), the
    # program running on the cpu:
    #   'klu'       preference 2     picked
    #   'cholmod'   preference 1.5
    #   'splu'      preference 1
    #   'spsolve'                    not taken: not a choice of 'auto' for a sparse matrix here
    #   'cudss'                      not taken: solver 'cudss' is not available here: it runs
    #                                on an NVIDIA GPU only, and JAX's default backend is 'cpu'
    #   ...
    ```
    """
    op = "linalg.explain_solver"
    _check_assume(assume, op)
    if _sp.issparse(A):
        A = _from_scipy(A)
    if issparse(A):
        t = A.type
        matrix, pattern, shape, dtype, base = "sparse", t.pattern, t.shape, t.dtype, t.tags
        facts = [f"nnz={t.pattern.nnz:,}"]
    else:
        t = getattr(A, "type", None)
        if t is None:
            A = np.asarray(A)
            shape, dtype, base = A.shape, A.dtype, frozenset()
        else:
            shape, dtype, base = t.shape, t.dtype, t.tags
        matrix, pattern, facts = "dense", None, []
    tags = frozenset(base) | _ASSUME[assume]
    if tags:
        facts.append("tags: " + ", ".join(sorted(tags)))
    dtype = np.dtype(dtype)
    if dtype.kind not in "fc":
        dtype = np.result_type(dtype, np.float64)
    shown = (f"a {matrix} {dtype.name}{list(shape)} matrix"
             + (f" ({'; '.join(facts)})" if facts else ""))
    ranked = _ranking(matrix=matrix, tags=tags, dtype=dtype, pattern=pattern)
    lines = [f'solver="auto" picks {ranked[0][0].name!r} for {shown}, the program running on '
             f"the {_backend()}:"]
    for k, (record, score, why) in enumerate(ranked):
        if matrix not in record.matrices:
            continue
        pref = f"preference {score:g}" if score is not None else ""
        if why:  # (its first clause: the rest is how to get it, for `solve` to say)
            why = why.split(". ")[0].split(" (")[0].rstrip(".")
        note = "picked" if k == 0 and why is None else (f"not taken: {why}" if why else "")
        lines.append(f"  {record.name!r:11} {pref:16} {note}".rstrip())
    return "\n".join(lines)


def cond(A, p=1, *, estimate: bool = True, solver: str = "auto", constant: bool = False):
    """The condition number of a square matrix, `||A||_p ||A^-1||_p`.

    **Arguments:**

    - `A`: a square dense array or sparse matrix.
    - `p`: the norm: `1` or `np.inf` (estimated or exact), `2` or `"fro"`
      (exact, dense only).
    - `estimate`: `True` (the default) for the 1-norm (or inf-norm)
      estimate from a factorization of `A`: Hager's method refined by
      Higham (LAPACK's `xGECON`) for dense matrices, SciPy's `onenormest`
      with the SuperLU factors for sparse ones, usually within a factor 3
      of the true value, for a few triangular solves. `False`: exact, from
      the inverse or an SVD (dense matrices only).
    - `solver`: the factorization for the estimate (`"auto"`: as `solve`
      picks it; `"lu"`, `"cholesky"`, `"klu"`, `"cholmod"`, `"splu"`,
      `"spsolve"`). In a graph
      that also solves with `A`, the estimate shares that solve's
      factorization.
    - `constant`: `True` to use the result as a diagnostic inside a
      differentiated function: its derivative is then zero (as under
      `sd.stop_gradient`). By default a condition number is not
      differentiated: differentiating through it raises `NotSupportedError`
      (the estimate is only piecewise smooth).

    **Returns:**

    A real scalar; `inf` for a singular matrix.
    """
    op = "linalg.cond"
    A, _, tags, sparse, dtype = _prepare(A, None, None, op)
    solver = resolve(solver, matrix="sparse" if sparse else "dense", tags=tags, dtype=dtype,
                     op=op).name
    if p not in NORMS:
        raise InvalidOptionError(f"`p` is 1, inf, 2 or 'fro', got {p!r}.", op=op)
    params = {"solver": solver, "norm": p}
    if sparse:
        params["pattern"] = A.type.pattern
    if not estimate:
        params["exact"] = True
    if constant:
        params["constant"] = True
    if p == 1:
        params.pop("norm")
    rc = linalg_rcond_p.bind(A, **params)
    return snp.where(rc > 0, 1.0 / snp.where(rc > 0, rc, 1.0), np.inf)


class SlogdetResult(NamedTuple):
    """`sd.linalg.slogdet`'s result, as NumPy's: `det A = sign * exp(logabsdet)`."""

    sign: object
    logabsdet: object


def slogdet(A, *, solver: str = "auto", assume: str | None = None, probes: int | None = None,
            steps: int | None = None, seed: int = 0) -> SlogdetResult:
    """The sign and the natural log of the absolute value of a square
    matrix's determinant, as `numpy.linalg.slogdet`, differentiable.

    **Arguments:**

    - `A`: a square dense array or sparse matrix, float or complex (a complex
      sparse one by `"splu"`: its sign is the determinant's phase).
    - `solver`: the factorization it is read from: `"auto"` (Cholesky for a
      matrix tagged or assumed spd, else LU: dense in the program, sparse by
      SuperLU on the host), or `"lu"`, `"cholesky"` (dense, or sparse spd:
      sciad's compiled sparse Cholesky, whose factor `selected_inverse` and
      `precision_sample` of the same values share), `"cholmod"` (sparse spd,
      the `[cholmod]` extra: it shares its factorization with
      `solve(A, b, solver="cholmod")` of the same values), `"splu"` (sparse).
      `"slq"` (sparse spd, no factorization: an estimate, below).
    - `assume`: `"spd"` to read it from a Cholesky factorization (a matrix
      that is not positive definite then raises `NotPositiveDefiniteError`;
      one that is not symmetric, `StructureError`).
    - `probes`, `steps`, `seed` (`solver="slq"` only): stochastic Lanczos
      quadrature for a sparse spd matrix too large to factor: `log det A =
      tr log A` estimated by `probes` Rademacher vectors (default 64, drawn
      from `seed`), each quadratic form `z^T log(A) z` by `steps` Lanczos
      steps (default 64), in the program (one sparse product with a block of
      `probes` vectors a step). The estimate's standard deviation is at most
      `sqrt(2 / probes) |log A|_F` (a few percent of `|log det A|` for a
      smooth spectrum and 64 probes); the quadrature's error falls
      geometrically with `steps`, more slowly the worse `A` is conditioned.
      Its derivative is the matching estimator with the same probes,
      `(1/p) sum_i (A^-1 z_i)^T dA z_i`, the solves by conjugate gradients
      preconditioned by algebraic multigrid (up to 2,000 unknowns, by
      "auto"'s factorization), to every order.

    **Returns:**

    `SlogdetResult(sign, logabsdet)`: a singular matrix gives `(0, -inf)`,
    as NumPy; its derivative does not exist and is refused
    (`SingularMatrixError`).

    **Derivatives:** `d logabsdet = Re tr(A^-1 dA)`, every order, in forward
    and reverse mode. For a sparse matrix the gradient is `A^-T` on the
    matrix's pattern (`selected_inverse`), never the dense inverse. By the
    sparse Cholesky factor the gradient is one more pass of the
    factorization's work (its reverse mode: Takahashi's recurrence), and a
    Hessian-vector product about four (`sciad.primitives._sparse_cholesky`);
    by SuperLU or CHOLMOD a Hessian-vector product is one selected inverse
    of a matrix of twice the order.

    ```python
    >>> A = sd.sparse.from_dense(np.array([[4.0, 1.0], [1.0, 3.0]]))
    >>> sign, logdet = sd.linalg.slogdet(A)
    >>> float(sign), round(float(logdet), 6)
    (1.0, 2.397895)
    >>> np.round(sd.sparse.todense(sd.grad(lambda A: sd.linalg.slogdet(A)[1])(A)), 6)
    array([[ 0.272727, -0.090909],
           [-0.090909,  0.363636]])
    ```
    """
    op = "linalg.slogdet"
    A, _, tags, sparse, dtype = _prepare(A, None, assume, op)
    if solver == "auto":
        solver = _sparse_logdet_solver(tags) if sparse else (
            "cholesky" if "spd" in tags else "lu")
    if solver != "slq" and (probes is not None or steps is not None):
        raise InvalidOptionError("`probes` and `steps` are options of solver='slq' (a "
                                 f"stochastic estimate), got solver={solver!r}.", op=op)
    if solver == "slq":
        return _slq_logdet(A, sparse, tags, dtype, probes, steps, seed, op)
    if sparse:
        _sparse_factorization(solver, op)
    if sparse and solver == "cholesky":
        return SlogdetResult(snp.ones((), dtype), _chol.logdet(_sparse_cholesky(A, op),
                                                               A.type.pattern))
    params = {"solver": solver}
    if sparse:
        params["pattern"] = A.type.pattern
    sign, logabs = linalg_slogdet_p.bind(A, **params)
    return SlogdetResult(sign, logabs)


def _sparse_logdet_solver(tags) -> str:
    """"auto"'s factorization for a sparse log-determinant or selected
    inverse: sciad's compiled sparse Cholesky for a matrix tagged (or
    assumed) spd where it builds, else SuperLU's."""
    from .solvers.direct._fill_cholesky import LIBRARY

    return "cholesky" if "spd" in tags and LIBRARY.get() is not None else "splu"


def _slq_logdet(A, sparse: bool, tags, dtype, probes, steps, seed, op: str):
    from .primitives._slq import slq_logdet

    if not sparse:
        raise ShapeError("solver='slq' estimates the log-determinant of a sparse matrix; a "
                         "dense one is factored: solver='cholesky' or 'lu'.", op=op)
    if dtype.kind != "f":
        raise DTypeError(f"solver='slq' reads real matrices, got {dtype}.", op=op)
    probes = 64 if probes is None else probes
    steps = 64 if steps is None else steps
    for name, v in (("probes", probes), ("steps", steps)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise InvalidOptionError(f"`{name}` must be a positive integer, got {v!r}.", op=op)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise InvalidOptionError(f"`seed` must be an integer, got {seed!r}.", op=op)
    if "spd" not in tags:
        raise StructureError("solver='slq' needs a symmetric positive definite matrix: tag it "
                             "(`tags={'spd'}`) or pass `assume='spd'`.", op=op)
    logabs = slq_logdet(A, A.type.pattern, int(probes), int(steps), int(seed))
    return SlogdetResult(snp.ones((), dtype), logabs)


def _on_factor(z, pattern):
    """The values `z` on the factor's layout as a symmetric sparse matrix in
    the original numbering (each strictly lower entry and its mirror)."""
    from .primitives._sparse import coo
    from .solvers.direct._fill_cholesky import layout

    an = layout(pattern)
    back = np.argsort(an.perm)  # (ordered index -> original)
    n = an.n
    r, c = back[an.rows], back[an.cols]
    values = snp.concatenate([z, z[n:]])
    return coo(values, np.concatenate([r, c[n:]]), np.concatenate([c, r[n:]]), pattern.shape)


def _sparse_factorization(solver: str, op: str) -> None:
    if solver not in ("cholesky", "splu", "cholmod"):
        raise InvalidOptionError(f"a sparse matrix's log-determinant and selected inverse are "
                                 f"read from a factorization by 'cholesky' (spd), 'splu' or "
                                 f"'cholmod' (spd), or 'auto' (a log-determinant also "
                                 f"estimated: 'slq'); got {solver!r}.", op=op)


def _sparse_cholesky(A, op: str, spd: bool = True):
    """The sparse Cholesky factor's values for the sparse matrix `A`, checked
    as spd where `spd`; refused up front where it cannot run (a complex
    matrix, no C++ compiler to build the kernels)."""
    if np.dtype(A.dtype).kind != "f":
        raise NotSupportedError(f"the sparse Cholesky factorization reads real matrices, got "
                                f"{np.dtype(A.dtype)}; use solver='splu'.", op=op)
    from .solvers.direct._fill_cholesky import library

    try:
        library()
    except NotSupportedError as e:
        raise NotSupportedError(f"{e} Use solver='splu'.", op=op) from None
    return _chol.factor(A, A.type.pattern, spd=spd)


def selected_inverse(A, *, solver: str = "auto", assume: str | None = None,
                     on: str = "matrix"):
    """The entries of `A^-1` on the pattern of the sparse matrix `A`, without
    forming the dense inverse (Takahashi's recurrence on a sparse
    factorization): the posterior variances `diag(Q^-1)` of a Gaussian with
    a sparse precision `Q`, the gradient of `log det A`.

    **Arguments:**

    - `A`: a square sparse matrix (float, or complex by `"splu"`), positive
      definite or diagonally dominant: the factorization is made without
      pivoting (a zero pivot raises `SingularMatrixError`).
    - `solver`: `"auto"` (`"cholesky"` for a matrix tagged or assumed spd,
      else `"splu"`), `"cholesky"` (sciad's compiled sparse Cholesky; the
      recurrence is its reverse mode, and derivatives of every order are
      passes of the same cost), `"cholmod"` (the `[cholmod]` extra),
      `"splu"` (SuperLU's factorization without pivoting and sciad's
      Takahashi recurrence, on the host; by this and by CHOLMOD, derivatives
      are selected inverses of non-symmetric block matrices, by SuperLU).
    - `assume`: `"spd"`, as a tag.
    - `on`: `"matrix"` (the entries of `A`'s pattern) or `"factor"` (those of
      the filled pattern `L + L^T` of its sparse Cholesky factor, every one
      the recurrence computes, in `A`'s own numbering: for covariances
      between neighbours of neighbours; `solver="cholesky"`, an spd `A`).

    **Returns:**

    A sparse matrix on `A`'s pattern (or the factor's) holding `(A^-1)[i, j]`
    at each stored `(i, j)`. Differentiable to every order: `d(A^-1) = -A^-1
    dA A^-1` on the pattern is itself a selected inverse (of `[[A, dA], [0,
    A]]`; by the sparse Cholesky factor, passes of its reverse mode).

    ```python
    >>> A = sd.sparse.from_dense(np.array([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]]))
    >>> Z = sd.linalg.selected_inverse(A)
    >>> np.round(sd.sparse.todense(Z), 4)  # (0, 2) is not in the pattern
    array([[ 0.2778, -0.1111,  0.    ],
           [-0.1111,  0.4444, -0.2222],
           [ 0.    , -0.2222,  0.6111]])
    ```
    """
    op = "linalg.selected_inverse"
    if not issparse(A):
        raise ShapeError("expects a sparse matrix (`sd.sparse`); the inverse of a dense "
                         "matrix is `sd.numpy.linalg.inv`.", op=op)
    A, _, tags, _, _ = _prepare(A, None, assume, op)
    pattern = A.type.pattern
    if solver == "auto":
        solver = _sparse_logdet_solver(tags)
    _sparse_factorization(solver, op)
    if on not in ("matrix", "factor"):
        raise InvalidOptionError(f"`on` is 'matrix' or 'factor', got {on!r}.", op=op)
    if on == "factor" and solver != "cholesky":
        raise InvalidOptionError(f"on='factor' reads the sparse Cholesky factor's pattern: an spd "
                                 f"matrix (a tag, or assume='spd') and solver='cholesky' or "
                                 f"'auto'; got solver={solver!r}.", op=op)
    if solver == "cholesky":
        l = _sparse_cholesky(A, op)
        if on == "factor":
            return _on_factor(_chol.inverse_on_layout(l, pattern), pattern)
        return assemble(_chol.inverse_on_pattern(l, pattern), pattern)
    params = {} if solver == "splu" else {"solver": solver}
    return assemble(linalg_selected_inverse_p.bind(A, pattern=pattern, **params), pattern)


def precision_sample(Q, z):
    """Samples of the Gaussian `N(0, Q^-1)` with a sparse precision matrix
    `Q`, from standard normal draws `z`: `x = P^T L^-T z`, where
    `P Q P^T = L L^T` is the sparse Cholesky factorization in a
    fill-reducing order `P` (so `cov(x) = Q^-1`), differentiable in `Q`'s
    values (the reparameterization gradient) and in `z`.

    **Arguments:**

    - `Q`: a square sparse matrix (float), symmetric positive definite. Its
      symmetric part `(Q + Q^T) / 2` is what is factored (as
      `jax.scipy.linalg.cholesky` does), so derivatives with respect to
      `Q[i, j]` and `Q[j, i]` are equal halves. A matrix that is not
      positive definite raises `NotPositiveDefiniteError`; one tagged spd
      is checked to be symmetric, as a solve checks it, and then shares its
      factorization with `slogdet` and `selected_inverse` of the same values.
    - `z`: standard normal draws, shape `(n,)` for one sample or `(n, k)`
      for `k` samples (one per column), e.g. `np.random.default_rng(0)
      .standard_normal((n, k))`. Under `sd.vmap` a batch of `z` (or of `Q`'s
      values) is one call.

    **Returns:**

    `x` of `z`'s shape. Add the mean yourself (`mu + x`).

    **Derivatives:** every order, in forward and reverse mode. They go
    through the factor (`dL` from `dQ`, on the factor's pattern, at the cost
    of one more factorization pass; see `sciad.primitives._sparse_cholesky`),
    never a dense matrix. The symbolic factorization (ordering and fill) is
    kept per pattern and shared with `selected_inverse`.

    ```python
    >>> Q = sd.sparse.from_dense(np.array([[2.0, -1.0, 0.0], [-1.0, 2.0, -1.0],
    ...                                    [0.0, -1.0, 2.0]]))
    >>> X = np.asarray(sd.linalg.precision_sample(Q, np.eye(3)))  # x is linear in z:
    >>> np.round(X @ X.T, 6)                                      # cov(x) = Q^-1 exactly
    array([[0.75, 0.5 , 0.25],
           [0.5 , 1.  , 0.5 ],
           [0.25, 0.5 , 0.75]])
    >>> z = np.random.default_rng(0).standard_normal((3, 100))  # 100 samples
    >>> x = sd.linalg.precision_sample(Q, z)
    >>> g = sd.grad(lambda Q: snp.mean(sd.linalg.precision_sample(Q, z) ** 2))(Q)
    ```
    """
    from .solvers.direct._fill_cholesky import layout

    op = "linalg.precision_sample"
    if not issparse(Q):
        raise ShapeError("expects a sparse precision matrix (`sd.sparse`); for a dense one, "
                         "`sd.sparse.from_dense(Q)`.", op=op)
    z = _as_array(z, op)
    Q, z, tags, _, dtype = _prepare(Q, z, None, op)
    pattern = Q.type.pattern
    n = pattern.shape[0]
    if pattern.shape[0] != pattern.shape[1]:
        raise ShapeError(f"expects a square matrix, got shape {pattern.shape}.", op=op)
    if dtype.kind != "f":
        raise DTypeError(f"expects a real matrix and real draws, got {dtype}.", op=op)
    if z.ndim not in (1, 2) or z.shape[0] != n:
        raise ShapeError(f"`z` holds standard normal draws of shape ({n},) or ({n}, k) for "
                         f"the {n} x {n} precision, got shape {tuple(z.shape)}.", op=op)
    if n == 0:
        return snp.zeros(z.shape, dtype)
    an = layout(pattern)
    # (checked as declared: then the factor slogdet and selected_inverse read)
    l = _sparse_cholesky(Q, op, spd="spd" in tags)
    y = _chol.trisolve(l, z if z.ndim == 2 else z[:, None], pattern, transpose=True)
    x = snp.take(y, an.perm, axis=0)
    return x if z.ndim == 2 else x[:, 0]


def _dense_hermitian(A, op: str):
    if issparse(A):
        raise ShapeError(f"`A` is a sparse matrix: {op} is dense (convert with "
                         "`A.todense()`; a sparse partial eigensolver is to come).", op=op)
    A = _as_array(A, op)
    if A.dtype.kind in "biu":
        A = snp.astype(A, np.float64)
    return A


def eigh(A, B=None, *, degenerate_tol: float | None = None):
    """The eigenvalues and eigenvectors of a Hermitian (real symmetric) matrix,
    or of the generalized problem `A v = w B v` with `B` positive definite.

    Differentiable in forward and reverse mode, to any order, and safe at
    repeated eigenvalues: see "Degenerate eigenvalues" below.

    **Arguments:**

    - `A`: a dense `(n, n)` float or complex array (or a stack `(..., n, n)`).
      Its Hermitian part `(A + A^H) / 2` is decomposed (SciPy reads one
      triangle; for a Hermitian `A` they agree).
    - `B`: None, or a Hermitian positive definite matrix of `A`'s shape (a
      mass matrix): then `A v = w B v`, with `v^H B v = I` (SciPy's
      normalization). A `B` that is not positive definite raises
      `NotPositiveDefiniteError` when the program runs.
    - `degenerate_tol`: eigenvalues closer than `degenerate_tol * max|w|`
      form one cluster (default `sqrt(eps)`: 1.5e-8 in float64, 3.5e-4 in
      float32).

    **Returns:**

    `(w, v)`: `w` the eigenvalues in ascending order (real, shape `(..., n)`),
    `v` the unit eigenvectors as columns (`A @ v = v * w`), as SciPy's
    `scipy.linalg.eigh` and NumPy's `numpy.linalg.eigh`.

    **Degenerate eigenvalues.** Inside a cluster of (numerically) repeated
    eigenvalues the eigenvectors are any orthonormal basis of the cluster's
    subspace, and the eigenvalues' order inside it follows the perturbation.
    Exact, finite derivatives at any gap (zero included):

    - functions of the eigenvalues that treat a cluster's alike (the sum of
      a cluster's eigenvalues, `sum(g(w))`, the lowest eigenvalue when it is
      simple);
    - functions of a cluster's eigenvectors that do not depend on the basis
      chosen inside it: its spectral projector `v_c @ v_c^H`;
    - eigenvalues and eigenvectors of simple eigenvalues, whatever the
      clusters elsewhere in the spectrum;
    - spectral functions `f(A) = v diag(f(w)) v^H` through
      `sd.linalg.funm_hermitian`, one node with the divided-difference rule.

    A derivative that depends on a cluster's eigenvectors (one of them, not
    its projector), on one eigenvalue of a cluster apart from the others, on
    a cluster's eigenvalues and on eigenvectors of the same call together
    (`v @ diag(f(w)) @ v.T` written out: use `funm_hermitian`; a sum of a
    cluster's eigenvalues plus a projector term: write the sum as
    `trace(v_c^H A v_c)`; calls repeated on one matrix are one
    decomposition, differentiated and checked as one), or on
    the phase of a complex eigenvector raises `DegenerateEigenvalueError`
    naming the cluster and its gap, never a NaN and never a wrong value.
    Reverse mode checks the cotangents the loss sends back. Forward mode
    (`sd.jvp`, `sd.hvp`, `sd.jacfwd`, `jax.jvp` of `sd.to_jax`) is checked
    too: it transposes its tangent map once on a random cotangent (an extra
    reverse pass over the derivative, only in programs with eigendecompositions).
    Second order at a cluster: the Hessian of the cluster's eigenvalue sum
    or of its projector is exact; that of another symmetric function of its
    eigenvalues (`sum(w_c**2)`) needs the whole block `v_c^H dA v_c` and is
    refused (`trace(funm_hermitian(A, f))` has it, for the functions there).
    """
    A = _dense_hermitian(A, "linalg.eigh")
    if B is not None:
        B = _dense_hermitian(B, "linalg.eigh")
        if tuple(B.shape) != tuple(A.shape):
            raise ShapeError(f"`B` must have `A`'s shape {tuple(A.shape)}, got "
                             f"{tuple(B.shape)}.", op="linalg.eigh")
        dtype = np.result_type(A.dtype, B.dtype)
        A, B = snp.astype(A, dtype), snp.astype(B, dtype)
    return tuple(_eigh(A, B, degenerate_tol))


def eigvalsh(A, B=None, *, degenerate_tol: float | None = None):
    """The eigenvalues of a Hermitian (real symmetric) matrix, ascending
    (`eigh(A)[0]`; see `eigh` for the derivatives at repeated eigenvalues:
    a function of the eigenvalues that treats a cluster's eigenvalues alike,
    such as their sum, differentiates at any gap)."""
    return eigh(A, B, degenerate_tol=degenerate_tol)[0]


def svd(A, full_matrices: bool = False, compute_uv: bool = True, *,
        degenerate_tol: float | None = None):
    """The thin singular value decomposition `A = u @ diag(s) @ vh`, as
    NumPy's `numpy.linalg.svd(A, full_matrices=False)`.

    Differentiable in forward and reverse mode, to any order, and safe at
    repeated and zero singular values: see "Degenerate singular values"
    below.

    **Arguments:**

    - `A`: a dense `(m, n)` float or complex array (or a stack `(..., m, n)`).
    - `full_matrices`: must be False (the thin SVD, `k = min(m, n)`
      columns); the full one's extra columns are any basis of a complement
      and have no derivative.
    - `compute_uv`: False for the singular values alone.
    - `degenerate_tol`: singular values closer than `degenerate_tol * max(s)`
      form one cluster, and those below it the zero cluster (default
      `sqrt(eps)`: 1.5e-8 in float64, 3.5e-4 in float32).

    **Returns:**

    `(u, s, vh)`: `u` `(..., m, k)` and `vh` `(..., k, n)` with orthonormal
    columns and rows, `s` `(..., k)` real, descending; or `s` alone with
    `compute_uv=False`.

    **Degenerate singular values.** Inside a cluster of (numerically)
    repeated singular values, the pairs `(u_c, v_c)` are defined up to one
    common unitary rotation (for complex `A`, each pair up to a common
    phase); for the zero singular values, `u_z` and `v_z` are any bases of
    the null spaces, separately, and a singular value itself has a kink
    (`|x|`). Gradients are exact and finite at any gap, zero included, for
    losses that do not depend on those choices and weight a cluster's
    singular values alike (and zero ones not at all): `s**2`, the sum of a
    cluster's singular values, `u_c @ vh_c`, projectors `u_c @ u_c^H` and
    `vh_c^H @ vh_c`, `u @ diag(s**3) @ vh` at zero singular values,
    singular triplets of clusters of one. Any other gradient raises `DegenerateEigenvalueError` naming the
    cluster and its gap, never a NaN or a silently wrong value: one singular
    vector of a cluster or of a null space, one singular value of a cluster
    apart from the others, the phase of a complex singular vector, the
    nuclear norm `sum(s)` of a rank-deficient matrix (take its subgradient
    `u @ vh` yourself), and also the smooth `u_c @ diag(s_c) @ vh_c` (its
    derivative needs how the cluster splits, which the decomposition's
    derivatives do not carry: write it as `A @ vh_c^H @ vh_c`). It is
    checked in reverse mode and, as in `eigh`, in forward mode. Singular
    values and singular vectors of one decomposition are not differentiated
    together at a cluster: for a sum of a singular-value term and a
    singular-vector term, take the singular values from `svd(A,
    compute_uv=False)`, checked on its own (repeated `svd(A)` calls on one
    matrix are one decomposition, differentiated and checked as one).
    """
    op = "linalg.svd"
    if full_matrices:
        raise InvalidOptionError("only the thin SVD is supported: pass `full_matrices=False` (the "
                                 "full one's extra columns are an arbitrary basis with no "
                                 "derivative).", op=op)
    if issparse(A):
        raise ShapeError("`A` is a sparse matrix: svd is dense (convert with "
                         "`A.todense()`).", op=op)
    A = _as_array(A, op)
    if A.dtype.kind in "biu":
        A = snp.astype(A, np.float64)
    out = _svd(A, compute_uv, degenerate_tol)
    if not compute_uv:
        return out[0]
    s, u, vh = out
    return u, s, vh


def funm_hermitian(A, f: str, *, degenerate_tol: float | None = None):
    """A function of a Hermitian matrix, `v @ diag(f(w)) @ v^H` for `A = v
    diag(w) v^H`: `f` one of "exp", "log", "sqrt", "inv_sqrt" (`A^(-1/2)`),
    "inv".

    One node whose derivative is the divided-difference (Daleckii-Krein)
    rule `dF = v (D o (v^H dA v)) v^H`, `D_ij = (f(w_i) - f(w_j)) / (w_i -
    w_j)` and `f'` where the two eigenvalues are within `degenerate_tol *
    max|w|`: exact and finite at repeated eigenvalues, forward and reverse
    mode. Second derivatives (`sd.hvp`) are exact where the eigenvalues are
    distinct; at repeated eigenvalues they are not yet (they need the second
    divided differences). "log", "sqrt" and "inv_sqrt" need `A` positive definite
    (`NotPositiveDefiniteError` when the program runs otherwise), "inv" a
    nonsingular `A` (`SingularMatrixError`).
    """
    if f not in FUNCTIONS:
        raise InvalidOptionError(f"`f` must be one of {sorted(FUNCTIONS)}, got {f!r}.",
                                 op="linalg.eigh_apply")
    return eigh_apply(_dense_hermitian(A, "linalg.eigh_apply"), f, degenerate_tol)


def eigsh(A, k: int = 6, M=None, sigma: float | None = None, which: str | None = "LM",
          v0=None, ncv: int | None = None, maxiter: int | None = None, tol: float = 0,
          return_eigenvectors: bool = True, Minv=None, OPinv=None, mode: str = "normal",
          rng=None, *, degenerate_tol: float | None = None):
    """`k` eigenvalues and eigenvectors of a real symmetric sparse matrix, or
    of the generalized problem `A v = w M v`, by ARPACK
    (`scipy.sparse.linalg.eigsh`) on the host.

    Differentiable in forward and reverse mode, to any order, by implicit
    differentiation (never through ARPACK's iterations); the cotangents of
    `A` and `M` stay on their sparsity patterns (`sparse.sddmm`), never a
    dense `n x n`.

    **Arguments** (SciPy's, in SciPy's order, and SciPy's defaults):

    - `A`: a real symmetric matrix of shape `(n, n)`: a sciad sparse matrix
      (`sd.sparse.coo_matrix`, `csr_matrix`); a SciPy sparse array or matrix
      (a constant); a dense array (NumPy's: its nonzeros; a traced sciad
      array: all `n^2` entries, sampled onto a full pattern, so keep `n`
      small); float32 (computed in float64, returned in float32 as SciPy
      returns it); or a matrix-free symmetric operator (`sd.linalg.operator
      (matvec, (n, n))`, its matvec written in sciad ops and closing over
      the parameters to differentiate; it takes no `M` or `sigma`, and its
      eigenvectors' derivatives solve the bordered systems matrix-free,
      GMRES to 1e-12). A SciPy `LinearOperator` (as `A` or `M`) runs on the
      host, outside the trace: SciPy's own `eigsh` is called at once, with
      every option (`Minv`, `OPinv` too), and its results are constants (a
      host operator has no derivative). A matrix that is not symmetric
      raises `StructureError` when the program runs; a complex one is
      refused (`DTypeError`).
    - `k`: how many eigenpairs, `1 <= k < n` (SciPy's `ValueError` for
      `k <= 0`). `k >= n` is SciPy's: a dense `A` is solved by
      `sd.linalg.eigh` (all `n` pairs, with SciPy's `RuntimeWarning`; a
      concrete `A` or `M` that is not symmetric raises `StructureError`,
      where SciPy reads its lower triangle), a sparse or operator `A` raises
      `DTypeError` (a `TypeError`, as SciPy's).
    - `M`: None, or a symmetric positive definite matrix of `A`'s shape, in
      any of `A`'s forms but an operator (a mass matrix; its own pattern):
      then `A v = w M v` with `v^T M v = I`, SciPy's normalization. A
      diagonal that is not positive raises `NotPositiveDefiniteError` when
      the program runs.
    - `sigma`: None, or a shift: shift-invert mode, as SciPy's, where
      `which` refers to `1 / (w - sigma)`: the default `"LM"` gives the
      eigenvalues nearest `sigma`, `"LA"` those just above it, `"SA"` those
      just below. SciPy factors `A - sigma M` on the host (SuperLU) at each
      call.
    - `which`: SciPy's, and SciPy's default `"LM"` (largest magnitude):
      `"SM"` (smallest magnitude), `"LA"` (largest algebraic), `"SA"`
      (smallest algebraic), `"BE"` (`k // 2` from each end, the extra one
      of an odd `k` from the high end; `k >= 2`; two ARPACK runs, `"SA"`
      and `"LA"`). For the smallest eigenvalues of a positive definite `A`
      say `which="SA"`, or `sigma=0` (shift-invert, much faster).
    - `v0`: ARPACK's start vector (length `n`). By default a fixed seeded
      random vector (SciPy's is random at each call), so runs are
      reproducible; the results do not depend on it beyond rounding.
    - `ncv`: the Lanczos basis size, `k < ncv <= n` (default SciPy's,
      `max(2k + 1, 20)`). sciad computes one pair more than `k` (below) and
      gives ARPACK `ncv + 1` vectors, keeping the spare ones asked for.
    - `maxiter`: ARPACK's limit on restarts (default SciPy's, `10 n`).
    - `tol`: ARPACK's relative accuracy (0: machine precision).
    - `return_eigenvectors`: False returns `w` alone, in SciPy's order
      (ARPACK's without vectors: ascending in shift-invert modes and for
      `"BE"`, else from the least to the most wanted, so `"SA"` and `"SM"`
      come descending); a loss of it needs no eigenvector solve.
    - `Minv`, `OPinv`: refused (`InvalidOptionError`) for sciad matrices:
      sciad solves with `M` and factors `A - sigma M` itself so that the
      results are differentiable in `A` and `M`. (Taken with SciPy
      `LinearOperator`s, which go to SciPy as they are.)
    - `mode`: with `sigma`, SciPy's `"normal"` (the default), `"buckling"`
      (`A` positive definite, `M` symmetric; `which` on `w / (w - sigma)`;
      `v^T A v = 1`, as SciPy's: solved as the pencil `(M, A)` in
      shift-invert at `1 / sigma`, `w = 1 / mu`) or `"cayley"` (`which` on
      `(w + sigma) / (w - sigma)`); both need a nonzero sigma. Without
      `sigma` it has no effect, as in SciPy.
    - `rng`: SciPy's random start vector. sciad's start is fixed (or `v0`),
      so its results do not depend on it; for a SciPy `LinearOperator`,
      which SciPy's eigsh runs, it is passed on (SciPy's start, as SciPy
      draws it).
    - `degenerate_tol` (sciad's): computed eigenvalues closer than
      `degenerate_tol * max|w|` form one cluster (default `sqrt(eps)`).

    **Returns:**

    `(w, v)`: `w` the `k` eigenvalues in ascending order, as SciPy returns
    them for every `which`, `sigma` and `mode` (shape `(k,)`), `v`
    the eigenvectors as columns (shape `(n, k)`, `A @ v = M @ v * w`, unit
    or M-orthonormal), each with its entry of largest magnitude positive
    (SciPy's signs are arbitrary). ARPACK computes `k + 1` pairs: the next
    eigenvalue tells whether `k` cuts a cluster of repeated eigenvalues
    (below). A matrix with `k + 2 >= n` is solved densely. If ARPACK does
    not converge, `sciad.errors.ArpackNoConvergenceError` (a
    `ConvergenceError`, a `RuntimeError`) is raised when the program runs,
    with the converged pairs as SciPy's `ArpackNoConvergence` carries them:
    `.eigenvalues`, `.eigenvectors`, `.converged`.

    **Derivatives.** `dw_i = v_i^T (dA - w_i dM) v_i`. The eigenvectors'
    derivatives take one sparse solve per computed pair, with the bordered
    matrix `[[A - w_i M, M v], [v^T M, 0]]` (`sd.linalg.solve`). A loss of
    `w` alone needs no solve.

    **Degenerate eigenvalues.** As in `eigh`: sums of a cluster's
    eigenvalues and its projector differentiate exactly; a derivative
    (forward or reverse mode) that depends on one eigenvalue of a cluster
    apart from the others, or on the basis inside a cluster, raises
    `DegenerateEigenvalueError`. So does any derivative of the computed part
    of a cluster that `k` cuts (the next eigenvalue is repeated with the
    last computed ones): raise `k` to hold the whole cluster.

    ```python
    n = 100                                     # the 1-D Laplacian, tridiag(-1, 2, -1)
    i = np.arange(n)
    A = sd.sparse.coo_matrix((np.concatenate([np.full(n, 2.0), -np.ones(2 * n - 2)]),
                              (np.concatenate([i, i[:-1], i[1:]]),
                               np.concatenate([i, i[1:], i[:-1]]))), shape=(n, n))
    sd.linalg.eigsh(A, 3)[0]                    # [3.9913 3.9961 3.9990]: "LM", SciPy's
    sd.linalg.eigsh(A, 3, which="SA")[0]        # [0.00097 0.00387 0.00871]
    sd.linalg.eigsh(A, 3, sigma=0.0)[0]         # the same three, by shift-invert
    sd.linalg.eigsh(A, 3, which="SA", return_eigenvectors=False)  # [0.00871 0.00387 0.00097]
    ```
    """
    op = "linalg.eigsh"
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ShapeError(f"`k` must be an int, got {k!r}.", op=op)
    if k <= 0:
        raise ShapeError(f"`k` must be greater than 0 (as SciPy's), got k={k}.", op=op)
    if mode not in ("normal", "buckling", "cayley"):
        raise InvalidOptionError(f"`mode` must be 'normal', 'buckling' or 'cayley' (SciPy's), "
                                 f"got {mode!r}.", op=op)
    if which is None:
        which = "LM"
    if which not in WHICH + ("BE",):
        raise InvalidOptionError(f"`which` must be one of {WHICH + ('BE',)} (SciPy's), got "
                                 f"{which!r}.", op=op)
    import scipy.sparse.linalg as _spla  # (~0.1 s with SciPy's LAPACK: on the first eigsh)

    if isinstance(A, _spla.LinearOperator) or isinstance(M, _spla.LinearOperator):
        # SciPy's operators run on the host and have no derivative rule: SciPy's
        # own eigsh, now (see the docstring)
        if any(isinstance(x, Tracer) for x in (A, M, sigma)):
            raise DTypeError("a SciPy LinearOperator runs on the host, outside sciad's "
                             "trace, and cannot be combined with traced values: write the "
                             "operator as `sd.linalg.operator(matvec, (n, n))` with a "
                             "matvec in sciad ops.", op=op)
        return eigsh_host_operator(A, k, M, sigma, which, v0, ncv, maxiter, tol,
                                   return_eigenvectors, Minv, OPinv, mode, rng=rng)
    for name, x in (("Minv", Minv), ("OPinv", OPinv)):
        if x is not None:
            raise InvalidOptionError(
                f"`{name}` is not taken: sciad solves with `M` (and factors `A - sigma M` "
                "in shift-invert) itself, so that the eigenpairs are differentiable in `A` "
                "and `M`; a given inverse has no derivative rule. Leave it out (or pass "
                "SciPy LinearOperators for `A`/`M` to run SciPy's eigsh as it is, with no "
                "derivative).", op=op)
    if isinstance(sigma, Tracer):
        raise InvalidOptionError("`sigma` must be a number known when tracing (a static param: "
                                 "it picks which eigenpairs are found, and they do not depend "
                                 "on it), got a traced value.", op=op)
    if sigma is not None:
        if np.iscomplexobj(sigma):
            raise DTypeError(f"`sigma` must be real for a real symmetric `A`, got {sigma!r}.",
                             op=op)
        sigma = float(sigma)
    if ncv is not None and (isinstance(ncv, bool) or not isinstance(ncv, (int, np.integer))):
        raise InvalidOptionError(f"`ncv` must be an int or None, got {ncv!r}.", op=op)
    # rng: SciPy's random start vector; sciad's start is fixed (or `v0`), the
    # results do not depend on it: accepted, unused
    del rng
    dense = not isinstance(A, Operator) and not issparse(A) and not _sp.issparse(A)
    n = A.shape[0] if hasattr(A, "shape") else np.shape(A)[0]
    if k >= n:
        if not dense:
            raise DTypeError(f"k={k} >= n={n}: ARPACK computes fewer than n eigenpairs, and "
                             "SciPy refuses a sparse or operator `A` here too. Use "
                             "`sd.linalg.eigh(sd.sparse.todense(A))`, or reduce k.", op=op)
        # SciPy: a dense A with k >= n is solved by scipy.linalg.eigh (all n pairs)
        warnings.warn("k >= N for N * N square matrix: solving with sd.linalg.eigh (all N "
                      "eigenpairs), as SciPy's eigsh does.", RuntimeWarning, stacklevel=2)
        if sigma is not None or mode != "normal":
            raise InvalidOptionError("k >= n solves the dense problem with all eigenpairs: "
                                     "`sigma` and `mode` do not apply; leave them out.", op=op)
        # (a concrete A or M that is not symmetric is refused, as the ARPACK
        # path refuses it when it runs: SciPy's eigh reads its lower
        # triangle and sd.linalg.eigh its symmetric part, so the answer
        # would depend on which; a traced one is decomposed as eigh does)
        for name, X in (("A", A), ("M", M)):
            _refuse_asymmetric(X, name, op)
        w, v = eigh(A, None if M is None else _as_dense(M, "M", op),
                    degenerate_tol=degenerate_tol)
        return (w, v) if return_eigenvectors else w
    A = _as_eigsh_matrix(A, "A", op)
    M = None if M is None else _as_eigsh_matrix(M, "M", op)
    dtype = A.dtype if isinstance(A, Operator) else A.type.dtype
    if M is not None and isinstance(A, Operator):
        raise ShapeError("a matrix-free operator takes neither `M` nor `sigma` (shift-"
                         "invert needs a factorization): pass a sparse matrix, or "
                         "fold `M` into the operator.", op=op)
    if M is not None and M.type.dtype != dtype:
        M = _sparse_astype(M, dtype)
    if dtype == np.float32:  # SciPy's results are float32: computed in float64
        w, v = eigsh(_sparse_astype(A, np.float64), k,
                     None if M is None else _sparse_astype(M, np.float64), sigma, which, v0,
                     ncv, maxiter, tol, True, None, None, mode, degenerate_tol=degenerate_tol)
        w, v = snp.astype(w, np.float32), snp.astype(v, np.float32)
        return (w, v) if return_eigenvectors else _scipy_value_order(w, which, sigma, mode)
    if sigma is not None and mode == "buckling":
        # A v = w M v, A positive definite, which on w / (w - sigma): the
        # pencil (M, A) in shift-invert, mu = 1 / w near 1 / sigma, where
        # w / (w - sigma) = -(1 / sigma) / (mu - 1 / sigma); v^T A v = 1 as SciPy's
        if M is None or isinstance(sigma, Tracer) or sigma == 0:
            raise InvalidOptionError("mode='buckling' needs `M` and a nonzero (untraced) "
                                     "sigma (SciPy's buckling mode: A positive definite, M "
                                     "symmetric).", op=op)
        swap = {"LA": "SA", "SA": "LA"} if sigma > 0 else {}
        mu, v = eigsh(M, k, A, 1.0 / sigma, swap.get(which, which), v0, ncv, maxiter, tol,
                      True, degenerate_tol=degenerate_tol)
        w = 1.0 / mu
        order = snp.argsort(w)
        w, v = snp.take(w, order), snp.take(v, order, axis=1)
        return (w, v) if return_eigenvectors else w
    if mode == "cayley" and sigma is not None and (isinstance(sigma, Tracer) or sigma == 0):
        raise InvalidOptionError("mode='cayley' needs a nonzero (untraced) sigma: its "
                                 "operator is (A - sigma M)^-1 (A + sigma M).", op=op)
    if which == "BE":
        if k < 2:
            raise ShapeError(f"which='BE' needs k >= 2 (ARPACK refuses one eigenpair from "
                             f"both ends, and so does SciPy), got k={k}. For the largest "
                             "eigenvalue say which='LA'.", op=op)
        if mode == "cayley" and sigma is not None:
            raise InvalidOptionError("which='BE' with mode='cayley' is not supported: ask "
                                     "for the two ends ('SA', 'LA') in two calls.", op=op)
        # SciPy's "BE": k // 2 wanted from the low end, the rest (one more if
        # k is odd) from the high end, in ascending order. Two runs, each with
        # its own next eigenvalue, so a cluster that either end cuts is seen.
        low = int(k) // 2
        (wl, vl), (wh, vh) = (eigsh(A, j, M, sigma, end, v0, ncv if ncv is None or ncv > j
                                    else None, maxiter, tol, True,
                                    degenerate_tol=degenerate_tol)
                              for j, end in ((low, "SA"), (int(k) - low, "LA")))
        w, v = snp.concatenate([wl, wh]), snp.concatenate([vl, vh], axis=1)
        return (w, v) if return_eigenvectors else w
    if isinstance(A, Operator):
        if sigma is not None:
            raise ShapeError("a matrix-free operator takes neither `M` nor `sigma` (shift-"
                             "invert needs a factorization): pass a sparse matrix, or "
                             "fold `M` into the operator.", op=op)
        if A.dtype != np.float64:
            raise DTypeError(f"a matrix-free operator must act on float64 vectors, got "
                             f"{A.dtype}.", op=op)
        w, v = eigsh_operator(A, k, which, float(tol),
                              None if maxiter is None else int(maxiter), degenerate_tol,
                              v0, ncv)
    else:
        w, v = _eigsh(A, k, M, which=which, sigma=sigma, tol=tol, maxiter=maxiter,
                      degenerate_tol=degenerate_tol, mode=mode, v0=v0, ncv=ncv)
    return (w, v) if return_eigenvectors else _scipy_value_order(w, which, sigma, mode)


def _scipy_value_order(w, which: str, sigma, mode: str):
    """The eigenvalues (ascending) in the order SciPy returns them without
    eigenvectors (ARPACK's `dseupd`): ascending in shift-invert modes and for
    "BE"; else from the least wanted to the most wanted (so "SA" and "SM"
    are descending)."""
    if sigma is not None or which == "BE":
        return w
    key = {"SA": w, "LA": -w, "LM": -snp.abs(w), "SM": snp.abs(w)}[which]
    return snp.take(w, snp.argsort(-key, stable=True))


def _as_dense(X, name: str, op: str):
    """A dense array of `X` (a sparse matrix, SciPy's or sciad's, or an array)."""
    if _sp.issparse(X):
        return np.asarray(X.toarray())
    if issparse(X):
        return sparse_todense(X)
    return _dense_hermitian(X, op)


def _refuse_asymmetric(X, name: str, op: str) -> None:
    """`StructureError` for a concrete dense `X` whose `max |X - X^T| / max
    |X|` is above the symmetry tolerance of its dtype."""
    if X is None or isinstance(X, Tracer) or issparse(X) or _sp.issparse(X) \
            or isinstance(X, Operator):
        return
    d = np.asarray(X)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or d.dtype.kind not in "fc":
        return
    scale = np.max(np.abs(d), initial=0.0)
    gap = np.max(np.abs(d - d.conj().T), initial=0.0)
    tol = symmetry_tolerance(d.dtype)
    if not gap <= tol * scale:  # (NaN too)
        raise StructureError(
            f"`{name}` must be symmetric (Hermitian): max |{name} - {name}^T| / max |{name}| = "
            f"{gap / scale if scale else gap:.2e} is above {tol:.1e}. SciPy's eigsh would read "
            f"one triangle of it; pass the matrix you mean, e.g. `({name} + {name}.T) / 2` or "
            f"`np.tril({name}) + np.tril({name}, -1).T`.", op=op)


def _as_eigsh_matrix(X, name: str, op: str):
    """`X` as `eigsh` runs on it: a sciad sparse matrix or `Operator` as it
    is; a SciPy sparse array or matrix as a sciad one (a constant); a dense
    array (NumPy's: its nonzeros; a traced one: every entry) as a sparse
    matrix. Integer matrices become float64, complex ones are refused."""
    if isinstance(X, Operator) and name == "A":
        return X
    if _sp.issparse(X):
        c = _sp.csr_matrix(X)
        c.sum_duplicates()
        c.sort_indices()
        if c.dtype.kind == "c":
            raise DTypeError(f"`{name}` must be real symmetric, got a complex matrix: "
                             "complex Hermitian problems are not supported yet (SciPy "
                             "hands them to `eigs`).", op=op)
        data = c.data if c.dtype.kind == "f" else c.data.astype(np.float64)
        X = sparse_csr_matrix((data, c.indices, c.indptr), shape=c.shape)
    elif not issparse(X):
        if isinstance(X, Operator):
            raise ShapeError(f"`{name}` cannot be a matrix-free operator.", op=op)
        if isinstance(X, Tracer):
            X = _dense_hermitian(X, op)
            n = X.shape[0]
            if X.ndim != 2 or X.shape[1] != n:
                raise ShapeError(f"`{name}` must be square, got shape {X.shape}.", op=op)
            full = sparse_csr_matrix((np.ones(n * n), np.tile(np.arange(n), n),
                                      np.arange(0, n * n + 1, n)), shape=(n, n)).type.pattern
            X = sparse_sample(X, full)
        else:
            d = np.asarray(X)
            if d.ndim != 2 or d.shape[0] != d.shape[1]:
                raise ShapeError(f"`{name}` must be a square matrix, got shape {d.shape}.",
                                 op=op)
            return _as_eigsh_matrix(_sp.csr_matrix(d), name, op)
    t = X.type
    if t.dtype.kind == "c":
        raise DTypeError(f"`{name}` must be real symmetric, got {t.str_short()}: complex "
                         "Hermitian problems are not supported yet.", op=op)
    if t.dtype.kind != "f":
        X = _sparse_astype(X, np.float64)
    return X
