"""Linear solves with implicit derivative rules, and factorizations as values.

`linalg.solve[solver, transpose](a, b)`: `x = op(a)^-1 b` with `op` the
identity or the (plain, unconjugated) transpose, for dense or sparse square
`a` and `b` of shape `(n,)` or `(n, k)`. Its rules never differentiate
through a solver's internals:

- JVP: `dx = op(a)^-1 (db - op(da) x)`: one more solve with the same matrix.
- VJP: `lam = op(a)^-T xbar`, `bbar = lam`, `abar = -lam x^T` (for `op` the
  transpose, `-x lam^T`), kept on the pattern of a sparse `a`
  (`sparse.sddmm`): a transposed solve with the same matrix and `nnz` numbers.
- transpose (linear in `b`): `bbar = op(a)^-T ct`.

With a `symmetric` tag (or `spd` on a real matrix) the transposed solve is
the plain one. Direct solves are rewritten after differentiation by the
`share_factors` pass into `linalg.factor` (once per matrix) and
`linalg.backsolve[transpose]` nodes, so the adjoint reuses the forward
factorization.

Failures are errors, never NaN: a structurally singular sparse matrix (an
empty row or column) fails at trace time; NaN or inf in `a` or `b`
(`NonFiniteError`), a zero pivot (`SingularMatrixError`), a Cholesky
breakdown (`NotPositiveDefiniteError`) and an iterative solve that does not
converge (`ConvergenceError`) fail when the program runs, naming the node and
the user's line.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import solvers
from ..errors import (ConvergenceError, DTypeError, NonFiniteError, NotPositiveDefiniteError,
                      ShapeError, SingularMatrixError, StructureError)
from ..graph import Primitive, SparseType, TensorType, Zero, is_linear, is_zero
from ..graph._types import FactorType, Pattern
from ._checks import raise_if
from ._sparse import sparse_matmul_p, sparse_sddmm_p

DENSE_DIRECT = ("lu", "cholesky")
SPARSE_DIRECT = solvers.sparse_direct.METHODS
ITERATIVE = solvers.iterative.METHODS
PRECONDITIONERS = ("jacobi",)


def _is_symmetric(t, assume: str | None = None) -> bool:
    """Whether `t`'s tags (or a dense solve's `assume` param) make `a.T == a`."""
    tags = set(t.tags) | ({assume} if assume else set())
    return "symmetric" in tags or ("spd" in tags and t.dtype.kind != "c")


def _check_matrix(a, b, solver: str, pattern, op: str, assume: str | None = None):
    if isinstance(a, SparseType):
        if pattern != a.pattern:
            raise ShapeError(f"the matrix's pattern {a.pattern} differs from the node's "
                             f"`pattern` param {pattern}.", op=op)
        kinds = SPARSE_DIRECT + ITERATIVE
    elif isinstance(a, TensorType):
        if pattern is not None:
            raise ShapeError("a dense matrix takes no `pattern` param.", op=op)
        kinds = DENSE_DIRECT + ITERATIVE
    else:
        raise DTypeError(f"`a` must be a dense or sparse matrix, got {a.str_short()}.", op=op)
    if solver not in kinds:
        raise ShapeError(f"solver {solver!r} does not take a "
                         f"{'sparse' if isinstance(a, SparseType) else 'dense'} matrix; "
                         f"choose one of {', '.join(map(repr, kinds))}.", op=op)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ShapeError(f"`a` must be a square matrix, got {a.str_short()}.", op=op)
    n = a.shape[0]
    if not isinstance(b, TensorType) or b.ndim not in (1, 2) or b.shape[0] != n:
        raise ShapeError(f"`b` must have shape ({n},) or ({n}, k) to match "
                         f"{a.str_short()}, got {b.str_short()}.", op=op)
    if a.dtype != b.dtype:
        raise DTypeError(f"`a` and `b` must share one dtype, got {a.str_short()} and "
                         f"{b.str_short()} (`sd.linalg.solve` promotes for you).", op=op)
    if a.dtype.kind not in "fc":
        raise DTypeError(f"solves need float or complex values, got {a.str_short()}.", op=op)
    if assume is not None and (isinstance(a, SparseType) or assume not in ("symmetric", "spd")):
        raise ShapeError(f"`assume` is 'symmetric' or 'spd' for a dense matrix (a sparse one "
                         f"carries tags), got {assume!r}.", op=op)
    if solver == "cholesky" and a.dtype.kind == "c" and "hermitian" not in a.tags \
            and "spd" not in a.tags and assume != "spd":
        raise ShapeError("a complex Cholesky solve needs a Hermitian positive definite "
                         "matrix (tag it `spd`).", op=op)
    if solver in ITERATIVE and a.dtype.kind == "c":
        raise DTypeError("the iterative solvers take real matrices; use a direct solver "
                         "for complex ones.", op=op)
    if isinstance(a, SparseType):
        empty_rows, empty_cols = a.pattern.empty_lines()
        if empty_rows.size or empty_cols.size:
            which = (f"row {int(empty_rows[0])}" if empty_rows.size
                     else f"column {int(empty_cols[0])}")
            raise SingularMatrixError(
                f"{a.str_short()} is structurally singular: {which} has no stored "
                "entry.", op=op)


# ---------------------------------------------------------------------------
# linalg.solve


linalg_solve_p = Primitive("linalg.solve")


@linalg_solve_p.def_abstract_eval
def _solve_shape(a, b, *, solver, pattern=None, transpose=False, rtol=None, atol=None,
                 maxiter=None, preconditioner=None, throw=True, assume=None):
    _check_matrix(a, b, solver, pattern, "linalg.solve", assume)
    if solver in ITERATIVE:
        if rtol is None or atol is None or not (rtol >= 0 and atol >= 0) \
                or rtol == atol == 0:
            raise ShapeError(f"an iterative solve needs tolerances rtol >= 0 and atol >= 0, "
                             f"not both 0; got rtol={rtol}, atol={atol}.", op="linalg.solve")
        if maxiter is not None and maxiter < 1:
            raise ShapeError(f"`maxiter` must be positive, got {maxiter}.", op="linalg.solve")
        if preconditioner not in (None,) + PRECONDITIONERS:
            raise ShapeError(f"unknown preconditioner {preconditioner!r}; choose one of "
                             f"{PRECONDITIONERS}.", op="linalg.solve")
        if preconditioner == "jacobi" and isinstance(a, SparseType) and \
                np.any(a.pattern.diagonal_positions() < 0):
            raise SingularMatrixError(
                "the Jacobi preconditioner needs every diagonal entry stored; "
                f"{a.str_short()} lacks some.", op="linalg.solve")
    elif (rtol, atol, maxiter, preconditioner) != (None, None, None, None):
        raise ShapeError(f"the direct solver {solver!r} takes no tolerances, `maxiter` or "
                         "preconditioner.", op="linalg.solve")
    return TensorType(b.shape, b.dtype)


def _matvec(a, pattern: Pattern | None, transpose: bool):
    """`x -> op(a) x` on run-time values."""
    if pattern is not None:
        return lambda x: sparse_matmul_p.impl_rule(a, x, pattern=pattern, transpose=transpose)
    m = a.T if transpose else a
    return lambda x: jnp.matmul(m, x, precision="highest")


def _check_tags(a, pattern) -> None:
    """With `sciad.config.enable_checks` on, the values of a matrix tagged
    `symmetric` / `spd` are checked against the tag when the program runs:
    `a == a.T` to 1e-12 relative, and (spd) a positive diagonal. (Positive
    definiteness itself shows in a Cholesky solve, as
    `NotPositiveDefiniteError`.)"""
    from .. import config
    from ..graph._lower import current_node

    node = current_node()
    if not config.enable_checks or node is None:
        return
    tags = node.inputs[0].type.tags
    if not {"symmetric", "spd"} & tags:
        return
    if pattern is not None:
        _, perm = pattern.transposed()
        at, diag = a[perm], a[pattern.diagonal_positions()]
    else:
        at, diag = a.T, jnp.diagonal(a)
    scale = jnp.max(jnp.abs(a))
    asym = jnp.max(jnp.abs(a - at)) / jnp.where(scale > 0, scale, 1.0)
    raise_if(asym > 1e-12, StructureError,
             "the matrix is tagged " + "/".join(sorted({"symmetric", "spd"} & tags))
             + " but is not symmetric: max |A - A.T| / max |A| = {asymmetry:.3e}.",
             asymmetry=asym)
    if "spd" in tags:
        raise_if(jnp.any(jnp.real(diag) <= 0), StructureError,
                 "the matrix is tagged spd but has a diagonal entry <= 0.")


def _check_finite(a, b) -> None:
    raise_if(~jnp.all(jnp.isfinite(a)), NonFiniteError,
             "the matrix holds NaN or infinite values.")
    raise_if(~jnp.all(jnp.isfinite(b)), NonFiniteError,
             "the right-hand side holds NaN or infinite values.")


def _check_factor(solver: str, ok) -> None:
    if solver == "cholesky":
        raise_if(~ok, NotPositiveDefiniteError,
                 "the Cholesky factorization broke down: the matrix is not positive "
                 "definite. Solve with solver='lu' if it is only symmetric.")
    else:
        raise_if(~ok, SingularMatrixError,
                 "the matrix is singular: the factorization found a zero pivot.")


def _factor_impl(a, solver: str, pattern):
    if pattern is None:
        return solvers.dense.FACTOR[solver](a)
    return solvers.sparse_direct.factor(solver, pattern, a)


def _factor_ok(factor, solver: str, pattern):
    if pattern is None:
        return solvers.dense.OK[solver](factor)
    return solvers.sparse_direct.ok(solver, factor)


def _backsolve_impl(factor, b, solver: str, pattern, transpose: bool):
    if pattern is None:
        return solvers.dense.SOLVE[solver](factor, b, transpose)
    return solvers.sparse_direct.solve(solver, pattern, factor, b, transpose)


def _check_solution(x) -> None:
    raise_if(~jnp.all(jnp.isfinite(x)), SingularMatrixError,
             "the solution is not finite: the matrix is singular to working precision.")


@linalg_solve_p.def_impl
def _solve_impl(a, b, *, solver, pattern=None, transpose=False, rtol=None, atol=None,
                maxiter=None, preconditioner=None, throw=True, assume=None):
    if solver in ITERATIVE:
        inv_diag = None
        if preconditioner == "jacobi":
            diag = a[pattern.diagonal_positions()] if pattern is not None else jnp.diagonal(a)
            inv_diag = 1.0 / diag
        x, ok, rel, steps = solvers.iterative.solve(
            _matvec(a, pattern, transpose), b, method=solver, rtol=rtol, atol=atol,
            maxiter=maxiter, inv_diag=inv_diag)
        if throw:
            _check_finite(a, b)
            _check_tags(a, pattern)
            raise_if(~ok, ConvergenceError,
                     f"{solver} did not converge: relative residual {{residual:.3e}} after "
                     f"{{iterations}} iterations (rtol={rtol:g}, atol={atol:g}, "
                     f"maxiter={maxiter}).", residual=rel, iterations=steps,
                     tolerance=jnp.asarray(rtol))
        return x
    if throw:
        _check_finite(a, b)
        _check_tags(a, pattern)
    factor = _factor_impl(a, solver, pattern)
    if throw:
        _check_factor(solver, _factor_ok(factor, solver, pattern))
    x = _backsolve_impl(factor, b, solver, pattern, transpose)
    if throw:
        _check_solution(x)
    return x


def _apply(a, x, pattern, transpose: bool):
    """`op(a) @ x` with sciad ops (a tangent `a`)."""
    if pattern is not None:
        return sparse_matmul_p.bind(a, x, pattern=pattern, transpose=transpose)
    from ._contract import einsum_p

    vec = len(x.shape) == 1
    if transpose:
        return einsum_p.bind(a, x, spec="mk,m->k" if vec else "mk,mn->kn")
    return einsum_p.bind(a, x, spec="mk,k->m" if vec else "mk,kn->mn")


def _outer(u, v, pattern):
    """`u v^T` (summed over columns for matrices), on `pattern` if sparse."""
    if pattern is not None:
        return sparse_sddmm_p.bind(u, v, pattern=pattern)
    from ._contract import einsum_p

    return einsum_p.bind(u, v, spec="m,k->mk" if len(u.shape) == 1 else "mn,kn->mk")


def _neg(x):
    from ._elementwise import unary_primitives

    return unary_primitives["neg"].bind(x)


def _transposed_params(a_type, params: dict) -> dict:
    """Params of the solve with `op(a)^T`: the same solve for a symmetric `a`."""
    out = dict(params, throw=True)
    if not _is_symmetric(a_type, params.get("assume")):
        out["transpose"] = not params.get("transpose", False)
    return _clean(out)


def _clean(params: dict) -> dict:
    """Params with defaults left out, so equal solves print (and CSE) alike."""
    defaults = {"pattern": None, "transpose": False, "rtol": None, "atol": None,
                "maxiter": None, "preconditioner": None, "throw": True, "assume": None}
    return {k: v for k, v in params.items() if k not in defaults or defaults[k] != v}


def _type(x):
    from ..graph._autodiff import type_of

    return type_of(x)


@linalg_solve_p.def_jvp
def _solve_jvp(primals, tangents, **params):
    (a, b), (da, db) = primals, tangents
    x = linalg_solve_p.bind(a, b, **params)
    rhs = db
    if not is_zero(da):
        term = _neg(_apply(da, x, params.get("pattern"), params.get("transpose", False)))
        rhs = term if is_zero(rhs) else rhs + term
    if is_zero(rhs):
        return x, Zero(_type(x).update())
    return x, linalg_solve_p.bind(a, rhs, **_clean(dict(params, throw=True)))


@linalg_solve_p.def_vjp
def _solve_vjp(primals, x, ct, **params):
    a, b = primals
    a_type = _type(a)
    lam = linalg_solve_p.bind(a, ct, **_transposed_params(a_type, params))
    from ..graph import Tracer

    a_ct = None
    if isinstance(a, Tracer):  # a constant matrix needs no cotangent
        pattern = params.get("pattern")
        if params.get("transpose", False):
            a_ct = _outer(_neg(x), lam, pattern)
        else:
            a_ct = _outer(_neg(lam), x, pattern)
    return a_ct, lam


@linalg_solve_p.def_transpose
def _solve_transpose(ct, a, b, **params):
    assert not is_linear(a) and is_linear(b), "linalg.solve is linear in `b` only"
    return None, linalg_solve_p.bind(a, ct, **_transposed_params(_type(a), params))


# ---------------------------------------------------------------------------
# factorizations as values


linalg_factor_p = Primitive("linalg.factor")
#: the solvers whose solves `share_factors` splits into factor + backsolve
linalg_factor_p.methods = frozenset(DENSE_DIRECT + SPARSE_DIRECT)


@linalg_factor_p.def_abstract_eval
def _factor_shape(a, *, solver, pattern=None):
    if solver not in linalg_factor_p.methods:
        raise ShapeError(f"{solver!r} is not a direct solver.", op="linalg.factor")
    _check_matrix(a, TensorType((a.shape[0],), a.dtype), solver, pattern, "linalg.factor")
    return FactorType(a.shape, a.dtype, solver, pattern)


@linalg_factor_p.def_impl
def _factor_prim_impl(a, *, solver, pattern=None):
    raise_if(~jnp.all(jnp.isfinite(a)), NonFiniteError,
             "the matrix holds NaN or infinite values.")
    _check_tags(a, pattern)
    factor = _factor_impl(a, solver, pattern)
    _check_factor(solver, _factor_ok(factor, solver, pattern))
    return factor


linalg_backsolve_p = Primitive("linalg.backsolve")


@linalg_backsolve_p.def_abstract_eval
def _backsolve_shape(f, b, *, solver, pattern=None, transpose=False):
    if not isinstance(f, FactorType):
        raise DTypeError(f"needs a factorization (linalg.factor), got {f.str_short()}.",
                         op="linalg.backsolve")
    if (f.method, f.pattern) != (solver, pattern):
        raise ShapeError(f"the params (solver={solver!r}, pattern={pattern}) differ from "
                         f"the factorization's {f.str_short()}.", op="linalg.backsolve")
    n = f.shape[0]
    if not isinstance(b, TensorType) or b.ndim not in (1, 2) or b.shape[0] != n \
            or b.dtype != f.dtype:
        raise ShapeError(f"`b` must be {f.dtype} of shape ({n},) or ({n}, k) to match "
                         f"{f.str_short()}, got {b.str_short()}.", op="linalg.backsolve")
    return TensorType(b.shape, b.dtype)


@linalg_backsolve_p.def_impl
def _backsolve_prim_impl(factor, b, *, solver, pattern=None, transpose=False):
    raise_if(~jnp.all(jnp.isfinite(b)), NonFiniteError,
             "the right-hand side holds NaN or infinite values.")
    x = _backsolve_impl(factor, b, solver, pattern, transpose)
    _check_solution(x)
    return x


@linalg_backsolve_p.def_jvp
def _backsolve_jvp(primals, tangents, **params):
    (f, b), (_, db) = primals, tangents
    x = linalg_backsolve_p.bind(f, b, **params)
    if is_zero(db):
        return x, Zero(_type(x).update())
    return x, linalg_backsolve_p.bind(f, db, **params)


@linalg_backsolve_p.def_transpose
def _backsolve_transpose(ct, f, b, **params):
    flipped = _clean(dict(params, transpose=not params.get("transpose", False)))
    flipped.pop("throw", None)
    return None, linalg_backsolve_p.bind(f, ct, **flipped)
