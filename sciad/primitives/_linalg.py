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
from ._checks import raise_if, tie
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
#: its lowering raises from run-time checks (sd.function waits for results)
linalg_solve_p.runtime_checks = True


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


# Each check returns tokens (see `_checks.raise_if`); `tie` makes a value
# depend on them. The checks are ordered by tying: the matrix is checked
# before it is factored, the factor before it is used, so the first problem
# is the one reported (NaN in the matrix, not the singular factor it makes).


def _check_tags(a, pattern) -> list:
    """With `sciad.config.enable_checks` on, the values of a matrix tagged
    `symmetric` / `spd` are checked against the tag when the program runs:
    `a == a.T` to 1e-12 relative, and (spd) a positive diagonal. (Positive
    definiteness itself shows in a Cholesky solve, as
    `NotPositiveDefiniteError`.)"""
    from .. import config
    from ..graph._lower import current_node

    node = current_node()
    if not config.enable_checks or node is None:
        return []
    tags = node.inputs[0].type.tags
    if not {"symmetric", "spd"} & tags:
        return []
    if pattern is not None:
        _, perm = pattern.transposed()
        at, diag = a[perm], a[pattern.diagonal_positions()]
    else:
        at, diag = a.T, jnp.diagonal(a)
    scale = jnp.max(jnp.abs(a))
    asym = jnp.max(jnp.abs(a - at)) / jnp.where(scale > 0, scale, 1.0)
    tokens = [raise_if(asym > 1e-12, StructureError,
                       "the matrix is tagged " + "/".join(sorted({"symmetric", "spd"} & tags))
                       + " but is not symmetric: max |A - A.T| / max |A| = {asymmetry:.3e}.",
                       asymmetry=asym)]
    if "spd" in tags:
        tokens.append(raise_if(jnp.any(jnp.real(diag) <= 0), StructureError,
                               "the matrix is tagged spd but has a diagonal entry <= 0."))
    return tokens


def _checked_matrix(a, pattern):
    """`a`, after checks that it is finite (and matches its tags)."""
    tok = raise_if(~jnp.all(jnp.isfinite(a)), NonFiniteError,
                   "the matrix holds NaN or infinite values.")
    return tie(a, tok, *_check_tags(a, pattern))


def _checked_rhs(b):
    return tie(b, raise_if(~jnp.all(jnp.isfinite(b)), NonFiniteError,
                           "the right-hand side holds NaN or infinite values."))


def _checked_factor(factor, solver: str, pattern):
    ok = _factor_ok(factor, solver, pattern)
    if solver == "cholesky":
        tok = raise_if(~ok, NotPositiveDefiniteError,
                       "the Cholesky factorization broke down: the matrix is not positive "
                       "definite. Solve with solver='lu' if it is only symmetric.")
    else:
        tok = raise_if(~ok, SingularMatrixError,
                       "the matrix is singular: the factorization found a zero pivot.")
    return tie(factor, tok)


def _checked_solution(x):
    return tie(x, raise_if(~jnp.all(jnp.isfinite(x)), SingularMatrixError,
                           "the solution is not finite: the matrix is singular to working "
                           "precision."))


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


@linalg_solve_p.def_impl
def _solve_impl(a, b, *, solver, pattern=None, transpose=False, rtol=None, atol=None,
                maxiter=None, preconditioner=None, throw=True, assume=None):
    if throw:
        a, b = _checked_matrix(a, pattern), _checked_rhs(b)
    if solver in ITERATIVE:
        inv_diag = None
        if preconditioner == "jacobi":
            diag = a[pattern.diagonal_positions()] if pattern is not None else jnp.diagonal(a)
            inv_diag = 1.0 / diag
        x, ok, rel, steps = solvers.iterative.solve(
            _matvec(a, pattern, transpose), b, method=solver, rtol=rtol, atol=atol,
            maxiter=maxiter, inv_diag=inv_diag)
        if throw:
            x = tie(x, raise_if(
                ~ok, ConvergenceError,
                f"{solver} did not converge: relative residual {{residual:.3e}} after "
                f"{{iterations}} iterations (rtol={rtol:g}, atol={atol:g}, "
                f"maxiter={maxiter}).", residual=rel, iterations=steps,
                tolerance=jnp.asarray(rtol)))
        return x
    factor = _factor_impl(a, solver, pattern)
    if throw:
        factor = _checked_factor(factor, solver, pattern)
    x = _backsolve_impl(factor, b, solver, pattern, transpose)
    return _checked_solution(x) if throw else x


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
linalg_factor_p.runtime_checks = True
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
    factor = _factor_impl(_checked_matrix(a, pattern), solver, pattern)
    return _checked_factor(factor, solver, pattern)


linalg_backsolve_p = Primitive("linalg.backsolve")
linalg_backsolve_p.runtime_checks = True


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
    x = _backsolve_impl(factor, _checked_rhs(b), solver, pattern, transpose)
    return _checked_solution(x)


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


# ---------------------------------------------------------------------------
# matrix-free operators


linalg_solve_operator_p = Primitive("linalg.solve_operator")
linalg_solve_operator_p.runtime_checks = True
#: `graph`: the matvec, `(v, *params) -> (A(params) v,)`, linear in `v`


def _operator_check(graph, n_params: int, b, op: str):
    from ..graph import Graph

    if not isinstance(graph, Graph) or len(graph.inputs) != n_params + 1 \
            or len(graph.outputs) != 1:
        raise ShapeError("the matvec graph must map (v, *params) to one vector.", op=op)
    v = graph.inputs[0].type
    out = graph.outputs[0].type
    if not isinstance(v, TensorType) or v.ndim != 1 or out != v:
        raise ShapeError(f"the matvec must map a vector to a vector of the same type, "
                         f"got {v.str_short()} -> {out.str_short()}.", op=op)
    if not isinstance(b, TensorType) or b.ndim not in (1, 2) or b.shape[0] != v.shape[0] \
            or b.dtype != v.dtype:
        raise ShapeError(f"`b` must be {v.dtype} of shape ({v.shape[0]},) or "
                         f"({v.shape[0]}, k) to match the operator, got {b.str_short()}.",
                         op=op)
    if v.dtype.kind != "f":
        raise DTypeError("the iterative solvers take real operators.", op=op)


@linalg_solve_operator_p.def_abstract_eval
def _solve_operator_shape(*args, graph, solver, rtol, atol, maxiter=None, transpose=False,
                          symmetric=False, throw=True):
    *params, b = args
    op = "linalg.solve_operator"
    _operator_check(graph, len(params), b, op)
    if tuple(params) != graph.in_types[1:]:
        raise ShapeError("the operator's params do not match its matvec graph.", op=op)
    if solver not in ITERATIVE:
        raise ShapeError(f"a matrix-free operator needs an iterative solver "
                         f"({', '.join(map(repr, ITERATIVE))}), got {solver!r}.", op=op)
    if not (rtol >= 0 and atol >= 0) or rtol == atol == 0:
        raise ShapeError(f"needs rtol >= 0 and atol >= 0, not both 0; got rtol={rtol}, "
                         f"atol={atol}.", op=op)
    return TensorType(b.shape, b.dtype)


@linalg_solve_operator_p.def_impl
def _solve_operator_impl(*args, graph, solver, rtol, atol, maxiter=None, transpose=False,
                         symmetric=False, throw=True):
    import jax

    from ..graph import lower

    *params, b = args
    f = lower(graph)

    def matvec(v):
        return f(v, *params)[0]

    if transpose and not symmetric:
        struct = jax.ShapeDtypeStruct((b.shape[0],), b.dtype)
        matvec_t = jax.linear_transpose(matvec, struct)
        mv = lambda v: matvec_t(v)[0]  # noqa: E731
    else:
        mv = matvec
    if throw:
        b = _checked_rhs(b)
    x, ok, rel, steps = solvers.iterative.solve(mv, b, method=solver, rtol=rtol, atol=atol,
                                                maxiter=maxiter)
    if throw:
        x = tie(x, raise_if(
            ~ok, ConvergenceError,
            f"{solver} did not converge: relative residual {{residual:.3e}} after "
            f"{{iterations}} iterations (rtol={rtol:g}, atol={atol:g}, maxiter={maxiter}).",
            residual=rel, iterations=steps, tolerance=jnp.asarray(rtol)))
    return x


def _operator_params(params: dict, flip: bool) -> dict:
    """Params of the solve a rule emits: the same operator (transposed if
    `flip`, unless symmetric), always raising on failure."""
    out = dict(params, throw=True)
    if flip and not params.get("symmetric", False):
        out["transpose"] = not params.get("transpose", False)
    return {k: v for k, v in out.items()
            if not (k in ("transpose", "symmetric") and v is False) and
            not (k == "throw" and v is True) and not (k == "maxiter" and v is None)}


def _matvec_tangent(graph, v, params, dparams):
    """`(dA) v`: the tangent of `A(params) v` for parameter tangents `dparams`."""
    from ..graph import jvp_eval

    _, touts = jvp_eval(graph, [v, *params], [Zero(_type(v).update()), *dparams])
    return touts[0]


def _matvec_tangent_transposed(graph, x, params, dparams):
    """`(dA)^T x`: the gradient in `v` of `<x, (dA) v>`, which is linear in
    `v` (so any `v` will do: `x`)."""
    from ..graph import TensorType as _T, instantiate, vjp_eval
    from ..graph._trace import trace_flat

    t = _type(x)
    g2, _, _, caps = trace_flat(
        lambda v: [instantiate(_matvec_tangent(graph, v, params, dparams))],
        (_T(t.shape, t.dtype),), closure=True, name="matvec_tangent")
    _, backward = vjp_eval(g2, [x, *caps])
    return backward([x])[0]


@linalg_solve_operator_p.def_jvp
def _solve_operator_jvp(primals, tangents, **kw):
    *params, b = primals
    *dparams, db = tangents
    x = linalg_solve_operator_p.bind(*params, b, **kw)
    rhs = db
    if not all(is_zero(t) for t in dparams):
        if kw.get("transpose") and not kw.get("symmetric"):
            term = _matvec_tangent_transposed(kw["graph"], x, params, dparams)
        else:
            term = _matvec_tangent(kw["graph"], x, params, dparams)
        if not is_zero(term):
            term = _neg(term)
            rhs = term if is_zero(rhs) else rhs + term
    if is_zero(rhs):
        return x, Zero(_type(x).update())
    return x, linalg_solve_operator_p.bind(*params, rhs, **_operator_params(kw, flip=False))


@linalg_solve_operator_p.def_vjp
def _solve_operator_vjp(primals, x, ct, **kw):
    from ..graph import Tracer, vjp_eval

    *params, b = primals
    lam = linalg_solve_operator_p.bind(*params, ct, **_operator_params(kw, flip=True))
    param_cts: list = [None] * len(params)
    if any(isinstance(p, Tracer) for p in params):
        # A x = b  =>  pbar = -(d(A(p) x)/dp)^T lam; for the transposed solve
        # A^T x = b, <lam, d(A^T) x> = <x, (dA) lam>: the same with x and lam swapped.
        v, w = (lam, x) if kw.get("transpose") and not kw.get("symmetric") else (x, lam)
        if len(v.shape) == 1:
            _, backward = vjp_eval(kw["graph"], [v, *params])
            cts = backward([w])[1:]
        else:  # several right-hand sides: sum over the columns
            cts = None
            for j in range(v.shape[1]):
                _, backward = vjp_eval(kw["graph"], [v[:, j], *params])
                col = backward([w[:, j]])[1:]
                cts = col if cts is None else [c if is_zero(d) else d if is_zero(c) else c + d
                                               for c, d in zip(cts, col)]
        param_cts = [None if is_zero(c) or not isinstance(p, Tracer) else _neg(c)
                     for p, c in zip(params, cts)]
    return (*param_cts, lam)


@linalg_solve_operator_p.def_transpose
def _solve_operator_transpose(ct, *args, **kw):
    *params, b = args
    assert is_linear(b) and not any(is_linear(p) for p in params), \
        "linalg.solve_operator is linear in `b` only"
    return (*([None] * len(params)),
            linalg_solve_operator_p.bind(*params, ct, **_operator_params(kw, flip=True)))
