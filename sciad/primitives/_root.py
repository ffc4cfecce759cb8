"""`optimize.root`: a nonlinear solve as one node, with implicit derivatives.

The node holds the residual as a closed body, `(*consts, x) -> (F,)` (for a
fixed-point problem, the map `G` with `F(x) = G(x) - x`), and its operands
are `(*consts, x0)`. It lowers to the loops of `sciad.solvers.nonlinear._nonlinear`
(Newton with a line search, or Anderson-accelerated fixed-point iteration);
those iterations are never differentiated. Its outputs are the root `x`, the
iteration count, `||F(x)||_inf` and a status code.

Derivatives come from the implicit function theorem at the root:

    dx = -(dF/dx)^-1 (dF/dconsts) dconsts,

written with sciad ops over the body's graph: the tangent `(dF/dconsts)
dconsts` is the body's JVP; `dF/dx` is the Jacobian at the root, sparse (the
pattern detected from the body's graph, its values by colored JVPs), dense,
or a matrix-free operator (GMRES); and the solve is `linalg.solve`. The
reverse mode is the transpose of that tangent map (one transposed solve with
the same factorization, then the body's VJP), and second order follows,
because every piece is a differentiable sciad op. A root solve that did not
converge has no derivative: with `throw=False`, the tangents pass through
`optimize.root_guard`, which raises when the solve failed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from .. import _ops as ops
from ..errors import ConvergenceError, DTypeError, InvalidOptionError, ShapeError
from ..graph import Graph, Param, Primitive, Site, SparseType, TensorType, Zero, is_zero, lower
from ..graph._autodiff import jvp_eval, needs_ct, type_of, vjp_eval
from ..graph._batch import batch_size_of, batched_front
from ..graph._body import Body, as_body, inline, trace_body
from ..graph._cost import Cost, _si, nbytes
from ..graph._serialize import graph_param_v1, register_v1_migration
from ..graph._sparsity import Deps, _bool, _check_entries, dense_all, empty, pad_columns
from ..graph._sparsity import sparsity_eval, union
from ..graph._trace import trace_flat
from ..graph._types import Pattern
from ..solvers._coloring import coloring
from ..solvers.nonlinear._nonlinear import STATUS, _norm as norm_inf
from ..solvers._registry import lookup, names as _solver_names
from ._checks import check, tie
from ._jacobian import Structure, dense_jacobian, emit
from ._linalg import _factor_flops, _per_rhs, linalg_backsolve_p, linalg_factor_p, solve
from ._linalg import solve_operator
from ._map import map_rule, on_devices
from ._newton_systems import newton_jacobian
from ._sparse import gather

KINDS = ("root", "fixed_point")

root_p = Primitive("optimize.root", multiple_results=True, runtime_checks=True, params={
    "body": Body, "kind": str, "method": str, "jac": str,
    "pattern": Param((Pattern, None), default=None), "colors": Param(int, default=0),
    "tol": float, "atol": float, "maxiter": int, "memory": Param(int, default=0),
    "throw": Param(bool, default=True), "uses": Param((int, None), default=None),
    "jac0": Param(bool, default=False), "at_floor": Param(bool, default=False),
    "estimate": Param(bool, default=True)},
    fit_to_readers=lambda params, readers, complete, escapes=False: _root_fit(params, readers,
                                                                             complete))

#: `body`: the residual (kind "root") or the fixed-point map (kind
#: "fixed_point") as a closed body `(*consts, x) -> (F,)`; `method`: a root
#: method record's name (`sciad.solvers.nonlinear._root_methods`); `jac`: how Newton's
#: systems and the derivatives' are solved (a Jacobian record's name);
#: `pattern` (with a sparse Jacobian): the Jacobian's structure detected from
#: `body`, `colors` its number of colors (JVPs per Jacobian). With a Jacobian
#: that keeps its factor the node has a fifth output (`RootOutputs.factor`),
#: the factorization of the last Newton iteration's Jacobian (held
#: on the host), which the derivatives' solves with the Jacobian at the root
#: read and refine (`linalg.backsolve`); `uses`, set by `share_factors`, is
#: how many of them do (0: none, so the loop keeps no factorization);
#: `jac0` (the chord method): the last operand (`RootOperands.jac0`), after `x0`, is the matrix
#: its first iterations solve with (a sparse Jacobian's values on `pattern`,
#: or a dense `(n, n)` array), which carries no derivative; `at_floor`: a
#: solve that stalls with ||F|| at its measured rounding floor has converged
#: (for the roots whose tolerance sciad sets itself, so that it is never
#: tighter than rounding allows: an implicit ODE stage's); `estimate`: the
#: derivatives' dense solves estimate the Jacobian's condition number (a
#: host call each, for its warning); False where the Jacobian is
#: well-conditioned by construction (an implicit ODE stage's, `I - h g J`),
#: whose solves are then checked in the program (backward error, NaN) alone


def residual_body(graph: Graph) -> Body:
    """A residual's (fixed-point map's) graph `(*consts, x) -> (F,)` as a
    root node's body: `x` is its one per-step input."""
    return as_body(graph, len(graph.inputs) - 1)


register_v1_migration("optimize.root", graph_param_v1(residual_body))


class RootOperands(NamedTuple):
    """A root node's operands, named: `(*consts, x0[, jac0])`."""

    consts: list
    x0: Any
    jac0: Any = None  # (the `jac0` param) the chord's first matrix


def operands(args, jac0: bool = False) -> RootOperands:
    """The `RootOperands` of a root node's operands."""
    if jac0:
        *consts, x0, j0 = args
        return RootOperands(consts, x0, j0)
    *consts, x0 = args
    return RootOperands(consts, x0)


class RootOutputs(NamedTuple):
    """A root node's outputs, named: the root, the iteration count, `||F||_inf`,
    the status code (`sciad.solvers.nonlinear._nonlinear.STATUS`) and, for a Jacobian
    record that `keeps_factor`, the last Newton factorization."""

    x: Any
    nit: Any
    residual: Any
    status: Any
    factor: Any = None

    @classmethod
    def of(cls, outs) -> "RootOutputs":
        return cls(*outs)

    def flat(self) -> tuple:
        """The node's outputs (without an absent factor)."""
        return tuple(self) if self.factor is not None else tuple(self)[:4]


@root_p.def_abstract_eval
def _root_shape(*args, body, kind, method, jac, pattern=None, colors=0, tol, atol, maxiter,
                memory=0, throw=True, uses=None, jac0=False, at_floor=False, estimate=True):
    op = "optimize.root"
    graph = body
    consts, x, j0 = operands(args, jac0)
    record = lookup(method, "root", op=op, what="root method")
    if kind not in KINDS or record.kind != kind or record.node_method is not None:
        raise InvalidOptionError(f"unknown kind/method {kind!r}/{method!r}.", op=op)
    jrec = lookup(jac, "jacobian", op=op, what="`jac`")
    if not isinstance(x, TensorType) or x.dtype.kind != "f":
        raise DTypeError(f"`x0` must be a real float array, got {x.str_short()}.", op=op)
    if tuple(graph.in_types) != tuple(consts) + (x,):
        raise ShapeError("the residual's graph does not take the node's operands.", op=op)
    (out,) = graph.out_types if len(graph.outputs) == 1 else (None,)
    if not isinstance(out, TensorType) or out.size != x.size or out.dtype != x.dtype:
        raise ShapeError(f"`fun` must return one array of x's size and dtype "
                         f"({x.size} elements of {x.dtype}), got "
                         f"{', '.join(t.str_short() for t in graph.out_types)}.", op=op)
    if record.jac is not None and jac != record.jac:
        raise InvalidOptionError(f"method={method!r} steps with jac={record.jac!r}, got "
                                 f"jac={jac!r}.", op=op)
    if record.chord and jrec.matrix_free:
        raise InvalidOptionError(f"the chord method keeps a factorization: it needs a Jacobian "
                                 f"that is factored, got jac={jac!r}.", op=op)
    if jrec.sparse and (pattern is None or pattern.shape != (x.size, x.size)):
        raise ShapeError(f"a sparse Jacobian needs a ({x.size}, {x.size}) pattern, got "
                         f"{pattern!r}.", op=op)
    if jac0:
        want = TensorType((pattern.nnz,) if jrec.sparse else (x.size, x.size), x.dtype)
        if not record.takes_jac0 or j0 != want:
            raise ShapeError(f"`jac0` starts the chord method with a matrix: it needs "
                             f"method='chord' and {want.str_short()} (the Jacobian's "
                             f"{'values' if jrec.sparse else 'entries'}), got "
                             f"method={method!r} and {j0.str_short()}.", op=op)
    if not (tol >= 0 and atol >= 0) or tol == atol == 0 or maxiter < 0 or memory < 0:
        raise InvalidOptionError(f"needs tol >= 0 and atol >= 0 (not both 0), maxiter >= 0 and "
                                 f"memory >= 0; got tol={tol}, atol={atol}, maxiter={maxiter}, "
                                 f"memory={memory}.", op=op)
    i32 = TensorType((), np.dtype(np.int32))
    factor = _factor_type(jac, pattern, x.dtype) if _keeps_factor(method, jac) else None
    return RootOutputs(x, i32, TensorType((), x.dtype), i32, factor).flat()


def _keeps_factor(method: str, jac: str) -> bool:
    """Whether a root node has the `factor` output: a Newton-like method with a
    Jacobian record that keeps its factorization."""
    return lookup(method, "root").uses_jacobian and lookup(jac, "jacobian").keeps_factor


def _factor_type(jac: str, pattern: Pattern, dtype):
    (t,) = linalg_factor_p.abstract_eval(SparseType(pattern, dtype),
                                         solver=lookup(jac, "jacobian").solver, pattern=pattern)
    return t


def _root_fit(params, readers, complete) -> dict:
    # `uses`: how many solves read the kept factorization (so the last one
    # frees it, and none means none is kept); None where not all are known
    params = dict(params)
    params.pop("uses", None)
    if complete and not on_devices(readers):
        params["uses"] = len(readers)
    return params


@functools.lru_cache(maxsize=128)
def _newton_graphs(graph: Graph, kind: str, jac: str, pattern: Pattern | None):
    """The graphs Newton's loop runs, built with sciad's own rules (so a user
    primitive's JVP rule is what Newton uses, and a body whose lowering JAX
    cannot differentiate, a sparse solve's host call, still works): the flat
    residual `(*consts, x) -> (F,)`, and `(*consts, x) -> (J's values,)`
    (sparse), `-> (J,)` (dense) or `(*consts, x, v) -> (J v,)` (gmres)."""
    flat = _flat_body(graph, kind)
    types = flat.in_types
    jrec = lookup(jac, "jacobian")
    if jrec.matrix_free:
        def fn(*a):
            *args, v = a
            return [_jvp_in_x(flat, list(args), v)]

        jgraph = trace_flat(fn, tuple(types) + (types[-1],), name="jvp")[0]
    else:
        def fn(*a):
            J = jacobian_at(graph, _unflat_x(graph, list(a)), kind=kind, jac=jac,
                            pattern=pattern)
            return [gather(J) if jrec.sparse else J]

        jgraph = trace_flat(fn, tuple(types), name="jacobian")[0]
    return flat, jgraph


def _unflat_x(graph: Graph, args: list) -> list:
    return args[:-1] + [ops.reshape(args[-1], graph.inputs[-1].type.shape)]


#: a stalled solve's ||F|| within this factor of its measured rounding
#: floor is at the floor; one more than `FAR_ABOVE_FLOOR` times it stalls
#: far above it (an obstacle, not rounding)
AT_FLOOR = 10.0
FAR_ABOVE_FLOOR = 1e3


def judge_root(site, *, status, nit, residual, goal, floor, kind, method, jac, maxiter, tol,
               dtype, error=float("inf"), xnorm=float("nan"), x0norm=float("nan")):
    """Raises the `ConvergenceError` of a failed root solve, with a diagnosis.
    `floor`: ||F||'s rounding floor at the last iterate
    (`solvers.nonlinear._nonlinear.rounding_floor`)."""
    status, nit = int(status), int(nit)
    if status == 0:
        return
    residual, goal, floor, error = float(residual), float(goal), float(floor), float(error)
    record = lookup(method, "root")
    what = record.describe(jac)
    advice = {
        1: record.maxiter_advice(maxiter),
        2: "The Jacobian is singular at an iterate: the root may be singular (a Jacobian "
           "without full rank: a missing equation or boundary condition), there may be no "
           "root near `x0`, or an iterate hit a critical point of `fun`; check `fun`, or "
           "start elsewhere.",
        3: "The Newton direction is not a descent direction for ||F||: the Jacobian may be "
           "wrong (a user primitive's JVP rule, a non-differentiable `fun`), or ||F|| is at "
           "its floor of rounding errors above the tolerance (loosen `tol`/`atol`).",
        4: "`fun` returned NaN or infinite values at `x0`, or every iterate it tried "
           "gave them: check its domain (a log or sqrt of a negative value).",
        5: "Convergence is slow: the root may be singular (Newton then converges only "
           "linearly), the Jacobian inexact, or the map not contractive.",
    }[status]
    # (NaN residuals or floors fail both comparisons: the advice above stays)
    if status in (1, 3, 5) and residual <= AT_FLOOR * floor:
        advice = (f"||F|| has reached its floor of rounding errors in {np.dtype(dtype)} "
                  f"(about {floor:.1e}: F changes that much when x moves by a few units in "
                  f"its last place) above the tolerance: no iterate can do better; loosen "
                  f"`tol`/`atol` above {AT_FLOOR * floor:.0e}.")
    elif status in (3, 5) and residual > FAR_ABOVE_FLOOR * floor:
        advice = (f"||F|| stalls far above its floor of rounding errors (about {floor:.1e}) "
                  f"at a minimum of ||F|| that is not a root: there may be no solution near "
                  f"`x0`, or none at all (a parameter beyond a fold or turning point, where "
                  f"the branch of solutions ends); else the root is singular or the "
                  f"Jacobian wrong (a user primitive's JVP rule, a non-differentiable "
                  f"`fun`). Check that a solution exists (continue in the parameter from "
                  f"one that has one), or start elsewhere.")
    against = f"(atol = {goal:.3e})"
    step = (f"the last step's estimated error in x is {error:.3e} relative to ||x||_inf "
            f"(tol = {tol:.1e})" if np.isfinite(error) else
            f"the last step was rejected, so it estimated no error in x (tol = {tol:.1e})")
    if status in (1, 5) and goal == 0 and float(xnorm) <= 1e-6 * float(x0norm):
        advice += (" If the solution is at or near x = 0, where no relative accuracy is "
                   "defined, give an absolute bound on ||F||: `atol`.")
    site.fail(ConvergenceError,
              f"{what} did not converge: {STATUS[status]}, after {nit} iterations; "
              f"||F||_inf = {residual:.3e} {against}, and {step}. {advice}",
              residual=residual, tolerance=tol, atol=goal, error=error, iterations=nit)


def default_tol(dtype) -> float:
    """The relative tolerance on the error in `x` when none is given: 1e-10 in
    float64, a thousand times the machine epsilon in lower precision (1.2e-4
    in float32), above the floor of rounding errors."""
    return max(1e-10, 1e3 * float(np.finfo(dtype).eps))


def stacked(out, op: str):
    """`fun`'s list or tuple of numbers or arrays as one array, as SciPy's
    `np.asarray(fun(x))` makes it (nested lists too); a ragged one is
    refused, as NumPy refuses it."""
    parts = [stacked(p, op) if isinstance(p, (tuple, list)) else ops.asarray(p) for p in out]
    if not parts:
        raise ShapeError("`fun` returned an empty list.", op=op)
    shapes = {type_of(p).shape for p in parts}
    if len(shapes) != 1:
        raise ShapeError(f"`fun` returned a list of arrays of different shapes "
                         f"{sorted(shapes)}: NumPy cannot make one array of it. Return one "
                         "array (`sd.numpy.concatenate` the parts).", op=op)
    dtype = np.result_type(*(type_of(p).dtype for p in parts))
    return ops.stack([ops.astype(p, dtype) for p in parts], axis=0)


def root_node(fun, x0, leaves: list, *, name: str, kind: str, method: str, jac, tol,
              atol: float, maxiter: int, memory: int, throw: bool, op: str, start=None,
              at_floor: bool = False, estimate: bool = True) -> RootOutputs:
    """One root node for `fun(x, *leaves) = 0` (`kind="root"`) or `x =
    fun(x, *leaves)` (`"fixed_point"`), in the current trace: the residual
    traced into its body (named `name`), the Jacobian form chosen
    (`newton_jacobian`: `jac` None picks it from the detected pattern) and
    `root_p` bound. What `optimize.root` and `optimize.fixed_point` emit,
    and an implicit Runge-Kutta stage. `x0`: the start (integers become
    float64); `leaves`: arrays; `start`: None, or `(jac, pattern, x_type)
    -> operand`, the chord method's first matrix (`jac0`) as the node takes
    it. Errors name `op`."""
    x0 = ops.asarray(x0)
    tx = type_of(x0)
    if tx.dtype.kind != "f":
        if tx.dtype.kind in "iub":
            x0 = ops.astype(x0, np.float64)
            tx = type_of(x0)
        else:
            raise DTypeError(f"`x0` must be a real float array, got {tx.str_short()}.", op=op)
    leaves = [ops.asarray(a) for a in leaves]

    def body(*a):
        *ls, x = a
        out = fun(x, *ls)
        if isinstance(out, (tuple, list)):  # as SciPy's np.asarray(fun(x))
            out = stacked(out, op)
        if isinstance(out, dict) or out is None:
            raise ShapeError(f"`fun` must return one array (or a list or tuple of equal-"
                             f"shaped ones, as SciPy's), got a {type(out).__name__}.", op=op)
        out = ops.asarray(out)
        to = type_of(out)
        if to.size != tx.size:
            raise ShapeError(f"`fun` must return as many values as x has ({tx.size}, for x "
                             f"of shape {tx.shape}), got {to.str_short()}.", op=op)
        if to.dtype != tx.dtype:
            out = ops.astype(out, tx.dtype)
        return out

    graph, consts, _ = trace_body(body, [type_of(a) for a in leaves] + [tx], name=name)
    if jac is not None and jac not in _solver_names("jacobian"):
        raise InvalidOptionError(f"`jac` must be None or one of {_solver_names('jacobian')}, got "
                                 f"{jac!r}.", op=op)
    if jac is None and kind == "fixed_point":
        jac = "gmres"
    pattern, colors = None, 0
    if jac is None or not lookup(jac, "jacobian").matrix_free:
        # (a fixed-point map's residual is G(x) - x)
        jac, pattern = newton_jacobian(graph, jac, identity=kind == "fixed_point")
    if lookup(jac, "jacobian").sparse:
        colors = int(coloring(pattern).max(initial=-1)) + 1
    first = [] if start is None else [start(jac, pattern, tx)]
    outs = root_p.bind(*consts, *leaves, x0, *first, body=residual_body(graph), kind=kind,
                       method=method, jac=jac, pattern=pattern, colors=colors,
                       tol=float(default_tol(tx.dtype) if tol is None else tol), atol=float(atol),
                       maxiter=int(maxiter), memory=int(memory), throw=bool(throw),
                       jac0=start is not None, at_floor=bool(at_floor),
                       estimate=bool(estimate))
    return RootOutputs.of(outs)


@root_p.def_impl
def _root_impl(*args, body, kind, method, jac, pattern=None, colors=0, tol, atol, maxiter,
               memory=0, throw=True, uses=None, jac0=False, at_floor=False, estimate=True,
               site=None):
    graph = body
    consts, x0, j0 = operands(args, jac0)
    flat, jgraph = _newton_graphs(graph, kind, jac, pattern)
    held = site.held if site is not None else ()
    residual, jacobian = lower(flat, held), lower(jgraph, held)
    shape = x0.shape

    def F(x):
        return residual(*consts, x)[0]

    x = jnp.reshape(x0, (-1,))
    record = lookup(method, "root")
    linear = None
    if record.uses_jacobian:
        linear = lookup(jac, "jacobian").linear_solve(
            lambda *a: jacobian(*consts, *a), pattern=pattern, x=x, uses=uses,
            chord=record.chord, start=j0)
    res = record.run(F, x, linear=linear, tol=tol, atol=atol, maxiter=maxiter, memory=memory,
                     at_floor=at_floor)
    out = jnp.reshape(res.x, shape)
    if throw:
        out = tie(out, check(judge_root, site or Site("optimize.root"),
                             when=res.status != 0, status=res.status, nit=res.nit,
                             residual=res.residual, goal=res.goal, floor=res.floor,
                             error=res.error, xnorm=norm_inf(res.x), x0norm=norm_inf(x),
                             kind=kind, method=method,
                             jac=jac, maxiter=maxiter, tol=tol, dtype=np.dtype(x0.dtype)))
    factor = (res.aux,) if _keeps_factor(method, jac) else None
    return RootOutputs(out, res.nit, res.residual, res.status, factor).flat()


# ---------------------------------------------------------------------------
# derivatives: the implicit function theorem, in sciad ops


def jacobian_at(graph: Graph, args: list, *, kind: str, jac: str, pattern):
    """`dF/dx` at `args = (*consts, x)` for a solve of `jac`'s kind: a sparse
    matrix (colored JVPs of the body), a dense one, or None for matrix-free
    (see `apply_inverse`)."""
    x = args[-1]
    n = int(np.prod(x.shape, dtype=np.int64))
    flat = _flat_body(graph, kind)
    fargs = list(args[:-1]) + [ops.reshape(x, (n,))]
    jrec = lookup(jac, "jacobian")
    if jrec.matrix_free:
        return None
    if jrec.sparse:
        return emit(flat, fargs, len(fargs) - 1, Structure(pattern, coloring(pattern), False))
    # dense: one batched JVP over the unit vectors
    return dense_jacobian(flat, fargs, len(fargs) - 1)


def _jvp_in_x(flat: Graph, fargs: list, v):
    """`(dF/dx) v` at `fargs = (*consts, x)`: the flat body's JVP in `x`."""
    zeros = [Zero(type_of(a).update()) for a in fargs[:-1]]
    return jvp_eval(flat, fargs, zeros + [v])[1][0]


@functools.lru_cache(maxsize=128)
def _flat_body(graph: Graph, kind: str) -> Graph:
    """The residual `F` on a flat `x`: `(*consts, x_flat) -> (F_flat,)`
    (`G(x) - x` for a fixed-point map)."""
    x_type = graph.inputs[-1].type
    n = x_type.size

    def F(*a):
        *c, xf = a
        x = ops.reshape(xf, x_type.shape)
        (out,) = inline(graph, [*c, x])
        out = ops.reshape(out, (n,))
        return out - xf if kind == "fixed_point" else out

    types = [v.type for v in graph.inputs[:-1]] + [TensorType((n,), x_type.dtype)]
    flat, consts, _ = trace_body(F, types, name=f"{graph.name}_flat")
    assert not consts, "a closed body captures nothing"
    return flat


def apply_inverse(graph: Graph, consts: list, x, rhs, *, kind: str, jac: str, pattern,
                  transpose: bool = False, factor=None, estimate: bool = True):
    """`(dF/dx)^-1 rhs` (`(dF/dx)^-T rhs` if `transpose`) at the root `x`, for
    a flat `rhs`. With `factor` (the root node's last Newton factorization),
    the solve reads it: `linalg.backsolve` checks the backward error with
    the Jacobian at the root and refines, so the result is that of the
    Jacobian at the root without factoring it again."""
    n = rhs.shape[0]
    jrec = lookup(jac, "jacobian")
    J = jacobian_at(graph, list(consts) + [x], kind=kind, jac=jac, pattern=pattern)
    if J is not None and factor is not None:
        params = {"solver": jrec.solver, "pattern": pattern}
        if transpose:
            params["transpose"] = True
        return linalg_backsolve_p.bind(factor, J, rhs, **params)
    if J is not None:
        return solve(J.T if transpose else J, rhs, jrec.solver, estimate=estimate)
    flat = _flat_body(graph, kind)
    fargs = list(consts) + [ops.reshape(x, (n,))]

    def matvec(v):
        if transpose:  # v -> J^T v: the body's VJP in x
            return vjp_eval(flat, fargs)[1]([v])[-1]
        return _jvp_in_x(flat, fargs, v)

    return solve_operator(matvec, n, np.dtype(rhs.dtype), frozenset(), rhs, jrec.solver,
                          tol=jrec.derivative_rtol)


@root_p.def_jvp
def _root_jvp(primals, tangents, **params):
    consts = operands(primals, params.get("jac0", False)).consts
    # (the root does not depend on where the iteration starts, nor on jac0)
    dconsts = tangents[:len(consts)]
    outs = root_p.bind(*primals, **params)
    o = RootOutputs.of(outs)
    x = o.x
    zeros_out = [Zero(type_of(v).update()) for v in outs[1:]]
    if all(is_zero(t) for t in dconsts):
        return outs, [Zero(type_of(x).update())] + zeros_out
    graph, kind = params["body"], params["kind"]
    n = int(np.prod(x.shape, dtype=np.int64))
    # dF = (dF/dconsts) dconsts at the root (for G: the same, as x does not move)
    _, (dF,) = jvp_eval(graph, [*consts, x], [*dconsts, Zero(type_of(x).update())])
    if is_zero(dF):
        return outs, [Zero(type_of(x).update())] + zeros_out
    if not params.get("throw", True):
        dF = root_guard_p.bind(o.status, dF)
    dx = apply_inverse(graph, consts, x, ops.reshape(dF, (n,)), kind=kind, jac=params["jac"],
                       pattern=params.get("pattern"), factor=o.factor,
                       estimate=params.get("estimate", True))
    return outs, [ops.reshape(-dx, x.shape)] + zeros_out


@root_p.def_vjp
def _root_vjp(primals, outs, cts, **params):
    # lam = (dF/dx)^-T xbar at the root; constsbar = -(dF/dconsts)^T lam
    consts = operands(primals, params.get("jac0", False)).consts
    o = RootOutputs.of(outs)
    x = o.x
    ct = RootOutputs.of(cts).x
    none = [None] * len(primals)
    if is_zero(ct) or not any(needs_ct(c) for c in consts):
        return none
    graph, kind = params["body"], params["kind"]
    if not params.get("throw", True):
        ct = root_guard_p.bind(o.status, ct)
    n = int(np.prod(x.shape, dtype=np.int64))
    lam = apply_inverse(graph, consts, x, ops.reshape(ct, (n,)), kind=kind, jac=params["jac"],
                        pattern=params.get("pattern"), transpose=True, factor=o.factor,
                        estimate=params.get("estimate", True))
    _, backward = vjp_eval(graph, [*consts, x], [needs_ct(c) for c in consts] + [False])
    back = backward([ops.reshape(lam, x.shape)])[:-1]
    return [None if is_zero(b) or not needs_ct(c) else -b
            for c, b in zip(consts, back)] + [None] * (len(primals) - len(consts))


@root_p.def_sparsity
def _root_sparsity(outs, *deps, **params):
    # dx = -(dF/dx)^-1 (dF/dconsts) dconsts at the root: the body interpreted
    # with x's elements as columns of their own gives the patterns P of
    # dF/dx and Q of (dF/dconsts) dconsts, and x's is C Q, C the reflexive
    # transitive closure of P (an inverse is a polynomial in its matrix, by
    # Cayley-Hamilton, so (dF/dx)^-1 is within C). Exact where the residual
    # couples x's elements as P says (the inverse of an irreducible block is
    # full), so independent equations give independent roots. The start,
    # `jac0` and the iteration's outputs carry no dependence on the data
    # but through the root; `||F||` and the factorization take every
    # constant's.

    consts, x0, _ = operands(deps, params.get("jac0", False))
    N, m = x0.columns, x0.size
    rest = dense_all(outs[1:], Deps(empty(1, N), (1,)), *consts)
    eye = sp.csr_matrix((np.ones(m, bool), (np.arange(m), N + np.arange(m))),
                        shape=(m, N + m))
    (f,) = sparsity_eval(params["body"], [pad_columns(c, m) for c in consts]
                         + [Deps(eye, x0.shape)])
    q, closure = _bool(f.matrix[:, :N]), _bool(f.matrix[:, N:] + sp.eye(m, dtype=bool))
    while True:  # squaring: paths of twice the length each time
        _check_entries(closure.nnz)
        wider = union(closure, _bool(closure @ closure))
        if wider.nnz == closure.nnz:
            break
        closure = wider
    return [_bool(closure @ q)] + list(rest)


# ---------------------------------------------------------------------------
# the guard: no derivative of a failed solve


root_guard_p = Primitive("optimize.root_guard", runtime_checks=True,
                         params={"of": Param(str, default="root")})
#: `root_guard(status, t)`: `t`, after checking that the solve whose `status`
#: it reads succeeded; linear in `t` (its transpose is itself). `of` names the
#: solve: "root" (`optimize.root`, `STATUS` of `sciad.solvers.nonlinear._nonlinear`) or
#: "odeint" (`ode.odeint` with `throw=False`, its `STATUS`). The derivatives
#: of a solve that may fail without raising pass through it.


def _status_table(of: str) -> tuple[dict, str]:
    """The status texts of the solve a guard follows, and what to do."""
    if of == "odeint":
        # (imported here: `_ode` imports this module for the guard)
        from ._ode import STATUS as ODE_STATUS

        return ODE_STATUS, ("an ODE solution's derivative is that of the integration that "
                        "reached the final time. Check the status before differentiating "
                        "(a `throw=False` solve), or integrate with `throw=True` to see "
                        "the diagnosis")
    return STATUS, ("the implicit function theorem holds only at a root. Check `.success` "
                    "before differentiating, or solve with `throw=True` to see the "
                    "diagnosis")


@root_guard_p.def_abstract_eval
def _guard_shape(status, t, *, of="root"):
    if not isinstance(status, TensorType) or status.dtype != np.int32:
        raise DTypeError(f"`status` must be int32, got {status.str_short()}.",
                         op="optimize.root_guard")
    if of not in ("root", "odeint"):
        raise ShapeError(f"`of` must be 'root' or 'odeint', got {of!r}.",
                         op="optimize.root_guard")
    return t


def judge_derivative(site, *, status, of="root"):
    # (batched where the guard is: one status per example)
    failed = np.asarray(status).ravel()
    failed = failed[failed != 0]
    if failed.size:
        table, advice = _status_table(of)
        what = "a root solve" if of == "root" else "an ODE integration"
        # (named as the solve the guard follows: the user called it, not the guard)
        site = dataclasses.replace(site, op="optimize.root" if of == "root" else "ode.odeint")
        site.fail(ConvergenceError,
                  f"cannot differentiate {what} that failed ({table[int(failed[0])]}): "
                  f"{advice}.")


@root_guard_p.def_impl
def _guard_impl(status, t, *, of="root", site=None):
    return tie(t, check(judge_derivative, site or Site("optimize.root_guard"),
                        when=(status != 0).any(), status=status, of=of))


@root_guard_p.def_jvp
def _guard_jvp(primals, tangents, *, of="root"):
    (status, t), (_, dt) = primals, tangents
    out = root_guard_p.bind(status, t, of=of)
    return out, (Zero(type_of(out).update()) if is_zero(dt)
                 else root_guard_p.bind(status, dt, of=of))


@root_guard_p.def_transpose
def _guard_transpose(ct, status, t, *, of="root"):
    return None, root_guard_p.bind(status, ct, of=of)


@root_guard_p.def_batch
def _guard_batch(args, dims, *, of="root"):
    size = batch_size_of(args, dims)
    status, t = (batched_front(a, d, size) for a, d in zip(args, dims))
    return root_guard_p.bind(status, t, of=of), 0


@root_guard_p.def_sparsity
def _guard_sparsity(outs, status, t, *, of="root"):
    return t.matrix


# a batch of root solves is a `map` of one: lowered as `jax.vmap` of the
# solve, every example iterates until all have converged (a converged
# example's state no longer changes), and SuperLU gets the batch's
# Jacobians in one host call per iteration
root_p.def_batch(map_rule(root_p))


@root_p.def_cost
def _root_cost(node, body):
    # per iteration (their number is known only when it runs): the residual
    # at the iterate and at a line-search point, the Jacobian (one JVP per
    # color, or per unknown if dense; a matrix-free step: a Krylov solve of
    # JVPs, counted as 20), and the factorization and solve of the step
    p = node.params
    F = body(p["body"])
    n = operands(node.inputs, p.get("jac0", False)).x0.type.size
    if not lookup(p["method"], "root").uses_jacobian:  # (Anderson)
        per = F.flops + 10.0 * n * max(p.get("memory", 0), 1)
        return Cost(per, F.peak, f"per iteration ({_si(per)})")
    jvp = 3.0 * F.flops  # a JVP of the residual: about three evaluations
    jrec = lookup(p["jac"], "jacobian")
    pattern = p.get("pattern")
    factor = solve = 0.0
    if lookup(jrec.solver, "linear").direct:
        factor, solve = _factor_flops(n, jrec.solver, pattern), _per_rhs(n, jrec.solver, pattern)
    per = 2.0 * F.flops + jrec.step_flops(n, jvp, p.get("colors", 0), factor, solve)
    factor_out = RootOutputs.of(node.outputs).factor
    temp = jrec.temp_bytes(n, 0 if factor_out is None else nbytes(factor_out.type))
    return Cost(per, temp + F.peak, f"per Newton iteration ({_si(per)})")
