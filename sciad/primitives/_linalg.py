"""Linear solves with implicit derivative rules, factorizations as values, and
condition estimates.

`linalg.solve[solver, transpose, assume, ...](a, b)`: `x = op(a)^-1 b` with
`op` the identity or the (plain, unconjugated) transpose, for dense or sparse
square `a` and `b` of shape `(n,)` or `(n, k)`. Its rules never
differentiate through a solver's internals:

- JVP: `dx = op(a)^-1 (db - op(da) x)`: one more solve with the same matrix.
- VJP: `lam = op(a)^-T xbar`, `bbar = lam`, `abar = -lam x^T` (for `op` the
  transpose, `-x lam^T`), kept on the pattern of a sparse `a`
  (`sparse.sddmm`): a transposed solve with the same matrix and `nnz` numbers.
- transpose (linear in `b`): `bbar = op(a)^-T ct`.

Direct solves are rewritten by the `share_factors` pass into
`linalg.factor(a) -> F` (once per matrix) and `linalg.backsolve(F, a, b)`
nodes. A backsolve still takes the matrix: its rules are the solve's (so a
graph differentiated after factor sharing, as `sd.to_jax` does, still
carries the matrix's derivative), its checks measure the residual with it,
and a host factorization that is no longer held is made again from it.
`linalg.rcond(a)` (and `linalg.factor_rcond(F, a)` after sharing) is the
reciprocal condition estimate `1 / (||A||_1 ||A^-1||_1)`; it is not
differentiated (with `constant=True`, as `SolveInfo.rcond` and
`sd.linalg.cond(..., constant=True)`, its derivative is zero: a diagnostic,
as under `stop_gradient`).

`solver` names a record of `sciad.solvers` (`sciad.solvers._linear`): what
it applies to, its factor layout, factorization and solves, where it runs,
its checks and its cost; the rules here ask the record, never the name.
An iterative solve's `preconditioner` likewise names a record of the
"preconditioner" family (`sciad.solvers.iterative._iterative.AbstractPreconditioner`:
"jacobi", "amg"), set up from the matrix once per solve and applied at every
step; the transposed solve applies it transposed.

`assume` is the structure a solve relies on (`"symmetric"` or `"spd"`, from
`sd.linalg.solve`'s `assume=` and the matrix's tags): Cholesky reads one
triangle of an `spd` matrix, and the symmetric iterative solvers take the
adjoint solve to be the forward one. It is checked when the program runs.

The run-time side (a factorization and its solves through the record, and
their checks) is `sciad.primitives._linalg_run`.

Failures are errors, never NaN or a silently wrong value (the policy is in
`sciad.primitives._checks`): a structurally singular sparse matrix (an
empty row or column) fails at trace time; NaN or inf in `a` or `b`
(`NonFiniteError`), an asymmetric matrix solved as symmetric
(`StructureError`), a zero pivot or a numerically singular system
(`SingularMatrixError`), a Cholesky breakdown (`NotPositiveDefiniteError`),
a solve whose backward error a step of iterative refinement cannot bring
down (`SingularMatrixError`) and an iterative solve that does not converge
(`ConvergenceError`) fail when the program runs, naming the node and the
user's line; an ill-conditioned matrix warns (`IllConditionedWarning`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _ops as ops
from ..errors import (ConvergenceError, DTypeError, InvalidOptionError, NonFiniteError,
                      NotSupportedError, ShapeError, SingularMatrixError, plain)
from ..graph import (Body, Factored, Holding, Param, Primitive, Site, SparseType, TensorType, Zero,
                     instantiate, is_linear, is_zero, jvp_eval, lower, vjp_eval)
from ..graph._autodiff import needs_ct, type_of
from ..graph._body import trace_body
from ..graph._cost import Cost, _si, nbytes, size, sparse_lu_fill
from ..graph._params import shown_params
from ..graph._serialize import (_decode_array, _encode_array, graph_param_v1,
                                 register_param_type, register_v1_migration)
from ..graph._sparsity import along, dense, empty, union
from ..graph._trace import trace_flat
from ..graph._types import (BatchedType, FactorType, Pattern, holds_tuple,
                            register_factor_layout)
from ..solvers._indices import pattern_transpose, take
from ..solvers.iterative import _iterative
from ..solvers.iterative._amg import AMG
from ..solvers._linear import auto_preconditioner, names_for, resolve
from ..solvers._registry import lookup, records
from ._checks import check, judge_matrix, tie
from ._contract import einsum_p
from ._linalg_run import (ASSUME, _factor_layout, _make_factor, _matrix_fails,
                          _matrix_measures, _matvec, _rcond_with, _solve_with, check_where)
from ._elementwise import unary_primitives
from ._map import columns_rule, map_rule, on_devices, reader_nodes
from ._sparse import sparse_matmul_p, sparse_sddmm_p
from ._sparse_sharded import (RowPartition, block_amg, sharded_matmul_p, sharded_sddmm_p,
                              sharded_product)



def _is_symmetric(t, assume: str | None = None) -> bool:
    """Whether `t`'s tags (or a solve's `assume` param) make `a.T == a`."""
    tags = set(t.tags) | ({assume} if assume else set())
    return "symmetric" in tags or ("spd" in tags and t.dtype.kind != "c")


def _check_matrix(a, b, solver: str, pattern, op: str, assume: str | None = None):
    """The solver's record, after checking that it solves `a x = b`."""
    record = lookup(solver, "linear", op=op)
    if isinstance(a, SparseType):
        if pattern != a.pattern:
            raise ShapeError(f"the matrix's pattern {a.pattern} differs from the node's "
                             f"`pattern` param {pattern}.", op=op)
        matrix = "sparse"
    elif isinstance(a, TensorType):
        if pattern is not None:
            raise ShapeError("a dense matrix takes no `pattern` param.", op=op)
        matrix = "dense"
    else:
        raise DTypeError(f"`a` must be a dense or sparse matrix, got {a.str_short()}.", op=op)
    if matrix not in record.matrices:
        cls, msg = record.rejects(matrix=matrix, dtype=a.dtype, tags=frozenset())
        raise cls(msg, op=op)
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
    if assume is not None and assume not in ASSUME:
        raise ShapeError(f"`assume` is 'symmetric' or 'spd', got {assume!r}.", op=op)
    why = record.rejects(matrix=matrix, dtype=a.dtype, shown=a.str_short(),
                         tags=frozenset(a.tags) | ({assume} if assume else frozenset()))
    if why is not None:
        raise why[0](why[1], op=op)
    if isinstance(a, SparseType):
        empty_rows, empty_cols = a.pattern.empty_lines()
        if empty_rows.size or empty_cols.size:
            which = (f"row {int(empty_rows[0])}" if empty_rows.size
                     else f"column {int(empty_cols[0])}")
            raise SingularMatrixError(
                f"{a.str_short()} is structurally singular: {which} has no stored "
                "entry.", op=op)
    return record


# ---------------------------------------------------------------------------
# derivative rules shared by `linalg.solve` and `linalg.backsolve`


def _apply(a, x, pattern, transpose: bool, partition=None):
    """`op(a) @ x` with sciad ops (a tangent `a`); with a row `partition`,
    the sharded product."""
    if partition is not None and len(x.shape) == 1:
        return sharded_matmul_p.bind(a, x, pattern=pattern, partition=partition,
                                     transpose=transpose)
    if pattern is not None:
        return sparse_matmul_p.bind(a, x, pattern=pattern, transpose=transpose)
    vec = len(x.shape) == 1
    if transpose:
        return einsum_p.bind(a, x, spec="mk,m->k" if vec else "mk,mn->kn")
    return einsum_p.bind(a, x, spec="mk,k->m" if vec else "mk,kn->mn")


def _outer(u, v, pattern, partition=None):
    """`u v^T` (summed over columns for matrices), on `pattern` if sparse
    (with a row `partition`, the sharded sampled product)."""
    if partition is not None and len(u.shape) == 1:
        return sharded_sddmm_p.bind(u, v, pattern=pattern, partition=partition)
    if pattern is not None:
        return sparse_sddmm_p.bind(u, v, pattern=pattern)
    return einsum_p.bind(u, v, spec="m,k->mk" if len(u.shape) == 1 else "mn,kn->mk")


def _neg(x):
    return unary_primitives["neg"].bind(x)


def _type(x):
    return type_of(x)


def _clean(params: dict) -> dict:
    """Params with declared defaults left out, so equal solves print (and
    CSE) alike. (A backsolve's params are a subset of the solve's, with the
    same defaults.)"""
    return shown_params(linalg_solve_p.params, params)


def _derivative_params(params: dict, flip: bool) -> dict:
    """Params of a solve a rule emits: the same solve (its adjoint if `flip`),
    always raising on failure. A direct solve's adjoint is the transposed
    solve (as cheap, and its residual is measured with the right matrix); a
    symmetric iterative solve's adjoint is the solve itself."""
    out = dict(params, throw=True)
    symmetric = params.get("assume") in ASSUME
    if flip and not (symmetric and lookup(params["solver"], "linear").symmetric_adjoint):
        out["transpose"] = not params.get("transpose", False)
    return _clean(out)


def _solve_jvp_rule(bind, a, x, da, db, params: dict):
    """`dx = op(a)^-1 (db - op(da) x)`; `bind(rhs, params)` emits the solve."""
    rhs = db
    if not is_zero(da):
        term = _neg(_apply(da, x, params.get("pattern"), params.get("transpose", False),
                           params.get("partition")))
        rhs = term if is_zero(rhs) else rhs + term
    if is_zero(rhs):
        return Zero(_type(x).update())
    return bind(rhs, _derivative_params(params, flip=False))


def _solve_vjp_rule(bind, a, x, ct, params: dict):
    """`(abar, bbar)` for `x = op(a)^-1 b`."""
    lam = bind(ct, _derivative_params(params, flip=True))
    a_ct = None
    if needs_ct(a):  # a constant (or held) matrix needs no cotangent
        pattern, part = params.get("pattern"), params.get("partition")
        if params.get("transpose", False):
            a_ct = _outer(_neg(x), lam, pattern, part)
        else:
            a_ct = _outer(_neg(lam), x, pattern, part)
    return a_ct, lam


# ---------------------------------------------------------------------------
# linalg.solve


_PATTERN = Param((Pattern, None), default=None)
_ASSUME = Param((str, None), default=None)
_THROW = Param(bool, default=True)
_TRANSPOSE = Param(bool, default=False)

def _is_direct(solver) -> bool:
    """Whether `solver` names a direct solver: a solve with one is a backsolve
    reading a factorization (`linalg.factor`), which `share_factors` shares."""
    try:
        return lookup(solver, "linear").direct
    except InvalidOptionError:
        return False


def _factor_params(params) -> dict:
    """The params of the factorization that a solve (or estimate) with
    `params` makes of its matrix."""
    pattern = params.get("pattern")
    return {"solver": params["solver"]} if pattern is None else \
        {"solver": params["solver"], "pattern": pattern}


def _solve_factored(params) -> Factored | None:
    # a direct solve is a backsolve with a factorization of its matrix (one
    # without a condition estimate stays a solve: a factorization makes one)
    if not _is_direct(params.get("solver")) or not params.get("estimate", True):
        return None
    return Factored(linalg_factor_p, _factor_params(params), linalg_backsolve_p,
                    {k: v for k, v in params.items() if k in linalg_backsolve_p.params})


linalg_solve_p = Primitive("linalg.solve", runtime_checks=True, factored=_solve_factored,
                           params={
    "solver": str, "pattern": _PATTERN, "transpose": _TRANSPOSE,
    "rtol": Param((float, None), default=None), "atol": Param((float, None), default=None),
    "maxiter": Param((int, None), default=None),
    "preconditioner": Param((str, _iterative.AbstractPreconditioner, None), default=None),
    "throw": _THROW, "assume": _ASSUME,
    "partition": Param((RowPartition, None), default=None),
    "estimate": Param(bool, default=True)})


def _encode_amg(pre) -> dict:
    b = pre.near_null_space
    return {"block_size": pre.block_size,
            "near_null_space": None if b is None else _encode_array(b)}


def _decode_amg(d) -> AMG:
    b = d.get("near_null_space")
    return AMG(None if b is None else _decode_array(b), block_size=int(d.get("block_size", 1)))


# (a configured AMG, `sd.linalg.AMG(near_null_space=B)`, as a solve's param)
register_param_type(AMG, "amg", _encode_amg, _decode_amg)

#: `partition`: (an iterative solve of a sparse matrix) the `RowPartition` of
#: its pattern over a mesh axis: the Krylov loop's products are the sharded
#: ones (`sparse.sharded_matmul`), its vectors split over the devices as the
#: rows (see `_solve_impl`); `estimate`: a dense factorization estimates its
#: condition number (LAPACK's, one host call), which the solve's check reads;
#: False: the check reads the backward error and finiteness, measured in the
#: program, and the host is called only to raise (for the solves a
#: derivative rule makes at every step of a loop, where a host call costs
#: more than the step)


@linalg_solve_p.def_abstract_eval
def _solve_shape(a, b, *, solver, pattern=None, transpose=False, rtol=None, atol=None,
                 maxiter=None, preconditioner=None, throw=True, assume=None, partition=None,
                 estimate=True):
    record = _check_matrix(a, b, solver, pattern, "linalg.solve", assume)
    if partition is not None:
        _check_sharded(record, pattern, partition, preconditioner)
    if not record.direct:
        if rtol is None or atol is None or not (rtol >= 0 and atol >= 0) \
                or rtol == atol == 0:
            raise InvalidOptionError(f"an iterative solve needs tolerances rtol >= 0 and "
                                     f"atol >= 0, not both 0; got rtol={rtol}, atol={atol}.",
                                     op="linalg.solve")
        if maxiter is not None and maxiter < 1:
            raise InvalidOptionError(f"`maxiter` must be positive, got {maxiter}.",
                                     op="linalg.solve")
        if preconditioner is not None:
            pre = lookup(preconditioner, "preconditioner", op="linalg.solve",
                         what="preconditioner")
            # (one built over a row partition's blocks is the sharded solve's:
            # checked there)
            why = None if pre.partitioned and partition is not None else pre.rejects(
                matrix="sparse" if isinstance(a, SparseType) else "dense",
                pattern=pattern, shown=a.str_short())
            if why is not None:
                raise why[0](why[1], op="linalg.solve")
    elif (rtol, atol, maxiter, preconditioner) != (None, None, None, None):
        raise InvalidOptionError(f"the direct solver {solver!r} takes no tolerances, `maxiter` or "
                                 "preconditioner.", op="linalg.solve")
    return TensorType(b.shape, b.dtype)


def _check_sharded(record, pattern, partition, preconditioner) -> None:
    """A sharded solve: an iterative solver on a sparse matrix, with the
    partition of its pattern and a preconditioner that runs per device."""
    op = "linalg.solve"
    if record.direct or pattern is None:
        raise InvalidOptionError(
            f"a row `partition` shards the Krylov loop of an iterative solve of a sparse "
            f"matrix ('cg', 'gmres', 'bicgstab'); got solver={record.name!r} on a "
            f"{'sparse' if pattern is not None else 'dense'} matrix.", op=op)
    if not isinstance(partition, RowPartition) or partition.pattern != pattern:
        raise ShapeError(f"`partition` must be the RowPartition of the matrix's pattern "
                         f"{pattern} (`sd.sparse.row_partition(A.type.pattern, devices, "
                         f"axis)`), got {partition!r}.", op=op)
    if preconditioner is None:
        return
    pre = lookup(preconditioner, "preconditioner", op=op, what="preconditioner")
    if not pre.shardable:
        raise InvalidOptionError(
            f"a sharded solve is preconditioned per device: `preconditioner` is one of "
            f"{(None, *sharded_preconditioners())}, got {preconditioner!r}.", op=op)
    why = pre.rejects_partition(pattern)
    if why is not None:
        raise why[0](why[1], op=op)


def sharded_preconditioners() -> tuple[str, ...]:
    """The preconditioners a sharded solve takes (each applied on its
    device's rows; "block_amg": block-Jacobi over the partition's blocks,
    each approximately inverted by a V-cycle of its own AMG hierarchy)."""
    return tuple(r.name for r in records("preconditioner") if r.shardable)


def judge_krylov(site, *, dtype, solver: str, rtol: float, atol: float, maxiter,
                 tags=frozenset(), nonfinite_a=False, asymmetry=0.0, min_diagonal=np.inf,
                 nonfinite_b=False, converged=True, residual=0.0, iterations=0):
    """An iterative solve: the matrix, the right-hand side, convergence."""
    judge_matrix(site, dtype=dtype, tags=tags, nonfinite=nonfinite_a, asymmetry=asymmetry,
                 min_diagonal=min_diagonal)
    if np.any(nonfinite_b):
        site.fail(NonFiniteError, "the right-hand side holds NaN or infinite values.")
    if not np.all(converged):
        res, its = float(residual), int(iterations)
        # (CG breaks down on an indefinite or nonsymmetric matrix, or with a
        # preconditioner that is not spd: the residual check catches it)
        hint = lookup(solver, "linear").convergence_hint
        if res > 1.0:  # (the residual grew: no solution, or not one CG can reach)
            hint += (" The residual grew above ||b||: the matrix may be singular (a "
                     "pure-Neumann or periodic problem) with `b` outside its range, where no "
                     "solution exists; make `b` consistent (for a Neumann Laplacian, "
                     "subtract its mean) or fix one unknown.")
        site.fail(ConvergenceError,
                  f"{solver} did not converge: relative residual {res:.3e} after {its} "
                  f"iterations (rtol={rtol:g}, atol={atol:g}, maxiter={maxiter})." + hint,
                  residual=res, iterations=its, tolerance=float(rtol))


def _iterative_solve(matvec, a, b, *, solver, pattern, rtol, atol, maxiter, precond,
                     throw, assume, site, each_device=None):
    """The Krylov solve, checked when `throw`. `each_device(fn, measures)`:
    (a sharded solve) runs the check on every device of the mesh, so that a
    failure stops them all (checked on one device, it would stop that one
    and leave the others waiting in the loop's next collective)."""
    x, ok, rel, steps = _iterative.solve(
        matvec, b, method=lookup(solver, "linear"), rtol=rtol, atol=atol, maxiter=maxiter,
        precond=precond)
    if not throw:
        return x
    extra = {}
    if a is not None:
        # (a sharded solve's matrix is measured by XLA, split as its values)
        extra = _matrix_measures(a, pattern, assume, compiled=each_device is None)
        extra["nonfinite_a"] = extra.pop("nonfinite")
    measures = dict(nonfinite_b=~jnp.all(jnp.isfinite(b)), converged=ok, residual=rel,
                    iterations=steps, **extra)

    def judged(m, s=site.bare):
        return check(judge_krylov, s, dtype=np.dtype(b.dtype), solver=solver, rtol=rtol,
                     atol=atol, maxiter=maxiter, tags=frozenset({assume} if assume else ()),
                     **m)

    if each_device is not None:  # (a sharded solve's: judged on every device, where
        return tie(x, each_device(judged, measures))  # the program's handles are not)
    # (`judge_krylov` only raises)
    when = measures["nonfinite_b"] | ~measures["converged"]
    if extra:
        when |= _matrix_fails(extra, np.dtype(b.dtype))
    return tie(x, check_where(when, measures, judged, site))


def _apply_preconditioner(pre, state, a, v, *, pattern, transpose):
    return pre.apply(state, a, v, pattern=pattern, transpose=transpose)


@linalg_solve_p.def_impl
def _solve_impl(a, b, *, solver, pattern=None, transpose=False, rtol=None, atol=None,
                maxiter=None, preconditioner=None, throw=True, assume=None, partition=None,
                estimate=True, site=None):
    site = site or Site("linalg.solve")
    if not lookup(solver, "linear").direct:
        matvec, shard, each_device = _matvec(a, pattern, transpose), None, None
        sharded = None if partition is None else \
            sharded_product(partition, a, b, transpose, op="linalg.solve")
        if sharded is not None:
            # (the same loop, in global view, on vectors split over the
            # devices as the rows: the products are the sharded ones, and XLA
            # makes each dot product a local one and an all-reduce)
            matvec, b, shard, each_device = sharded
        precond = None
        pre = None if preconditioner is None else lookup(preconditioner, "preconditioner")
        if pre is not None and pre.partitioned:  # (a sharded solve's: see `block_amg`)
            precond = block_amg(partition, a, b, transpose, op="linalg.solve")
        elif pre is not None:  # (its record: set up once, applied every step)
            state = pre.setup(a, pattern=pattern, after=b)
            if shard is not None:  # (a sharded solve's: "jacobi", its rows' diagonals)
                state = tuple(shard(s) if s.shape[:1] == b.shape[:1] else s for s in state)
            precond = functools.partial(_apply_preconditioner, pre, state, a,
                                        pattern=pattern, transpose=transpose)
        x = _iterative_solve(matvec, a, b, solver=solver, pattern=pattern, rtol=rtol,
                             atol=atol, maxiter=maxiter, precond=precond, throw=throw,
                             assume=assume, site=site, each_device=each_device)
        return x if shard is None else shard(x)
    record = lookup(solver, "linear")
    # (one solve: a factor kept for it alone, or none where the solver
    # factors and solves in one call)
    factor = _make_factor(a, solver=solver, pattern=pattern, assume=assume, throw=throw,
                          uses=None if record.frees_factor else 1, site=site,
                          estimate=estimate)
    return _solve_with(factor, a, b, solver=solver, pattern=pattern, transpose=transpose,
                       throw=throw, site=site)


@linalg_solve_p.def_jvp
def _solve_jvp(primals, tangents, **params):
    (a, b), (da, db) = primals, tangents
    x = linalg_solve_p.bind(a, b, **params)
    return x, _solve_jvp_rule(lambda rhs, p: linalg_solve_p.bind(a, rhs, **p), a, x, da, db,
                              params)


@linalg_solve_p.def_vjp
def _solve_vjp(primals, x, ct, **params):
    a, b = primals
    return _solve_vjp_rule(lambda rhs, p: linalg_solve_p.bind(a, rhs, **p), a, x, ct, params)


@linalg_solve_p.def_transpose
def _solve_transpose(ct, a, b, **params):
    assert not is_linear(a) and is_linear(b), "linalg.solve is linear in `b` only"
    return None, linalg_solve_p.bind(a, ct, **_derivative_params(params, flip=True))


# ---------------------------------------------------------------------------
# factorizations as values


def _raises(reader) -> bool:
    """Whether a node reading a factorization raises on a bad one: its
    `throw` param (a condition estimate declares none and never raises)."""
    declared = reader.primitive.params or {}
    return "throw" in declared and bool(reader.params.get("throw",
                                                          declared["throw"].default))


def _factor_fit(params, readers, complete, escapes=False) -> dict:
    # `assume`: the strongest structure a reader relies on; `throw=False` if
    # no reader raises; `uses`, for a factorization held on the host: the
    # number of readers, so that the last one frees it (None where a reader
    # is not known: it is then kept until the host store's bound pushes it out)
    params = dict(params)
    devices = on_devices(readers)  # read on several devices: not counted, kept
    raw = readers
    readers = reader_nodes(readers)
    assumes = [u.params.get("assume") for u in readers if u.primitive.reads_factor]
    assume = max(assumes + [params.pop("assume", None)], key=((None,) + ASSUME).index)
    if assume is not None:
        params["assume"] = assume
    params.pop("throw", None)
    if complete and not any(_raises(u) for u in readers):
        params["throw"] = False
    params.pop("uses", None)
    params.pop("alone", None)
    record = lookup(params["solver"], "linear")
    # (a factorization kept on the host is freed after its last use)
    if record.held_on_host and complete and not devices:
        params["uses"] = len(readers)
    # (compiled handles: made where no reader passes the factor on, a loop
    # reading it included, and not for one solve, which factors itself; the
    # program that makes them ends them (`place_releases`), so not where the
    # factor is an output of its graph: a map's body is given its map's)
    if record.frees_factor and readers and not devices and not escapes \
            and not (complete and len(readers) == 1) \
            and not any(holds_tuple(v.type) for u in raw for v in u.outputs):
        params["uses"] = len(readers)
    # (one solve alone, a `map`'s included: it factors in its own call, so
    # no numeric factor is made and none is handed from map to map)
    if record.frees_factor and complete and not devices and len(readers) == 1 \
            and readers[0].primitive is linalg_backsolve_p:
        params["alone"] = True
    return params


def _factor_holds(params) -> Holding | None:
    # what a factorization with these params holds that its program ends:
    # a compiled backend's handles (made only with `uses` counted), ended by
    # a `linalg.release` node; a host store's factor, ended by its last
    # reader (counted) or, on a failed check, from the host
    if params.get("uses") is None:
        return None
    record = lookup(params["solver"], "linear")
    without = {k: v for k, v in params.items() if k != "uses"}
    if record.frees_factor:
        return Holding(linalg_release_p, {"solver": params["solver"]}, record.release_now,
                       without)
    if record.release_now is not None:
        return Holding(None, {}, record.release_now, without)
    return None


linalg_factor_p = Primitive("linalg.factor", runtime_checks=True,
                            fit_to_readers=_factor_fit, holds=_factor_holds, params={
    "solver": str, "pattern": _PATTERN, "assume": _ASSUME, "throw": _THROW,
    "uses": Param((int, None), default=None), "alone": Param(bool, default=False)})
#: `alone`: (a compiled solver's factor, `frees_factor`) its one reader is a
#: solve in the same program, which factors and solves in one call: no
#: numeric factor is made, in a `map` too (set by `_factor_fit`)


@linalg_factor_p.def_abstract_eval
def _factor_shape(a, *, solver, pattern=None, assume=None, throw=True, uses=None,
                  alone=False):
    if not lookup(solver, "linear", op="linalg.factor").direct:
        raise InvalidOptionError(f"{solver!r} is not a direct solver.", op="linalg.factor")
    _check_matrix(a, TensorType((a.shape[0],), a.dtype), solver, pattern, "linalg.factor",
                  assume)
    register_factor_layout(solver, _factor_layout)  # (a solver registered after import)
    if uses is not None and (not isinstance(uses, int) or uses < 0):
        raise InvalidOptionError(f"`uses` is the number of solves reading the factor (an int >= 0) "
                                 f"or None, got {plain(uses)}.", op="linalg.factor")
    return FactorType(a.shape, a.dtype, solver, pattern)


@linalg_factor_p.def_impl
def _factor_impl(a, *, solver, pattern=None, assume=None, throw=True, uses=None, alone=False,
                 site=None):
    return _make_factor(a, solver=solver, pattern=pattern, assume=assume, throw=throw,
                        uses=uses, site=site or Site("linalg.factor"))


linalg_release_p = Primitive("linalg.release", multiple_results=True, releases=True,
                             params={"solver": str})
linalg_release_p.__doc__ = """Ends what a factorization made by its program holds
(a compiled backend's handles): `linalg.release(F, *after)`, after every value
in `after` (its readers' outputs) is computed. Placed by `place_releases`
after the last reader of a `linalg.factor` that `holds` (see
`sciad.graph.Holding`); never written by hand."""


@linalg_release_p.def_abstract_eval
def _release_shape(f, *after, solver):
    op = "linalg.release"
    if not lookup(solver, "linear", op=op).frees_factor:
        raise InvalidOptionError(f"solver {solver!r} holds nothing a release node ends (its "
                                 "factor is not `frees_factor`).", op=op)
    one = f.inner if isinstance(f, BatchedType) else f  # (a map's batch of them)
    if not isinstance(one, FactorType) or one.method != solver:
        raise DTypeError(f"needs a factorization by {solver!r} (or a batch of them), got "
                         f"{f.str_short()}.", op=op)
    return ()


@linalg_release_p.def_impl
def _release_impl(f, *after, solver):
    lookup(solver, "linear").release(f, after)
    return ()


# (A release computes nothing, and a derived program gets its own: its
# derivatives are nothing, and `optimize` places the derived graph's releases
# after their last readers. Its batch is the release of the batch.)

@linalg_release_p.def_jvp
def _release_jvp(primals, tangents, **params):
    return (), ()


@linalg_release_p.def_vjp
def _release_vjp(primals, out, ct, **params):
    return (None,) * len(primals)


@linalg_release_p.def_batch
def _release_batch(args, dims, **params):
    return linalg_release_p.bind(*args, **params), ()


@linalg_release_p.def_sparsity
def _release_sparsity(out_types, *deps, **params):
    return ()


@linalg_release_p.def_cost
def _release_cost(node, body):
    return Cost()


linalg_backsolve_p = Primitive("linalg.backsolve", runtime_checks=True, reads_factor=True,
                               params={
    "solver": str, "pattern": _PATTERN, "transpose": _TRANSPOSE, "assume": _ASSUME,
    "throw": _THROW})


@linalg_backsolve_p.def_abstract_eval
def _backsolve_shape(f, a, b, *, solver, pattern=None, transpose=False, assume=None,
                     throw=True):
    op = "linalg.backsolve"
    if not isinstance(f, FactorType):
        raise DTypeError(f"needs a factorization (linalg.factor), got {f.str_short()}.",
                         op=op)
    if (f.method, f.pattern) != (solver, pattern):
        raise ShapeError(f"the params (solver={solver!r}, pattern={pattern}) differ from "
                         f"the factorization's {f.str_short()}.", op=op)
    _check_matrix(a, b, solver, pattern, op, assume)
    if (f.shape, f.dtype) != (a.shape, a.dtype):
        raise ShapeError(f"the factorization {f.str_short()} is not of a matrix like "
                         f"{a.str_short()}.", op=op)
    return TensorType(b.shape, b.dtype)


@linalg_backsolve_p.def_impl
def _backsolve_impl(factor, a, b, *, solver, pattern=None, transpose=False, assume=None,
                    throw=True, site=None):
    return _solve_with(factor, a, b, solver=solver, pattern=pattern, transpose=transpose,
                       throw=throw, site=site or Site("linalg.backsolve"))


# The factor carries no derivative: the matrix operand does, so the rules are
# the solve's, emitting backsolves with the same factor.

@linalg_backsolve_p.def_jvp
def _backsolve_jvp(primals, tangents, **params):
    (f, a, b), (_, da, db) = primals, tangents
    x = linalg_backsolve_p.bind(f, a, b, **params)
    return x, _solve_jvp_rule(lambda rhs, p: linalg_backsolve_p.bind(f, a, rhs, **p), a, x,
                              da, db, params)


@linalg_backsolve_p.def_vjp
def _backsolve_vjp(primals, x, ct, **params):
    f, a, b = primals
    a_ct, b_ct = _solve_vjp_rule(lambda rhs, p: linalg_backsolve_p.bind(f, a, rhs, **p), a,
                                 x, ct, params)
    return None, a_ct, b_ct


@linalg_backsolve_p.def_transpose
def _backsolve_transpose(ct, f, a, b, **params):
    assert not is_linear(a) and is_linear(b), "linalg.backsolve is linear in `b` only"
    return None, None, linalg_backsolve_p.bind(f, a, ct,
                                               **_derivative_params(params, flip=True))


# ---------------------------------------------------------------------------
# condition estimates


_CONSTANT = Param(bool, default=False)


def _rcond_factored(params) -> Factored | None:
    # the 1-norm estimate reads a factorization of the matrix; the inf-norm
    # one (of the transpose) and an exact condition number do not
    if not _is_direct(params.get("solver")) or params.get("exact", False) \
            or params.get("norm", 1) != 1:
        return None
    fparams = _factor_params(params)
    return Factored(linalg_factor_p, fparams, linalg_factor_rcond_p,
                    dict(fparams, **({"constant": True} if params.get("constant") else {})))


linalg_rcond_p = Primitive("linalg.rcond", runtime_checks=True, factored=_rcond_factored,
                           params={
    "solver": str, "pattern": _PATTERN, "norm": Param((int, float, str), default=1),
    "exact": Param(bool, default=False), "constant": _CONSTANT})
linalg_factor_rcond_p = Primitive("linalg.factor_rcond", runtime_checks=True,
                                  reads_factor=True, params={
    "solver": str, "pattern": _PATTERN, "constant": _CONSTANT})

NORMS = (1, np.inf, 2, "fro")


def _rcond_type(a) -> TensorType:
    return TensorType((), np.finfo(a.dtype).dtype)


@linalg_rcond_p.def_abstract_eval
def _rcond_shape(a, *, solver, pattern=None, norm=1, exact=False, constant=False):
    op = "linalg.rcond"
    if not lookup(solver, "linear", op=op).direct:
        raise InvalidOptionError(f"a condition estimate factors the matrix: `solver` is a direct "
                                 f"solver, got {solver!r}.", op=op)
    _check_matrix(a, TensorType((a.shape[0],), a.dtype), solver, pattern, op)
    if norm not in NORMS:
        raise ShapeError(f"`norm` is one of 1, inf, 2, 'fro', got {norm!r}.", op=op)
    if not exact and norm not in (1, np.inf):
        raise ShapeError(f"a condition estimate is of the 1- or inf-norm; norm={norm!r} "
                         "needs `exact=True` (an SVD or inverse of a dense matrix).", op=op)
    if exact and pattern is not None:
        raise NotSupportedError("the exact condition number of a sparse matrix needs its "
                                "dense inverse; use the estimate (`estimate=True`), or "
                                "`A.todense()` for a small matrix.", op=op)
    return _rcond_type(a)


@linalg_rcond_p.def_impl
def _rcond_impl(a, *, solver, pattern=None, norm=1, exact=False, constant=False, site=None):
    if exact:
        c = jnp.linalg.cond(a, p={1: 1, np.inf: jnp.inf, 2: 2, "fro": "fro"}[norm])
        return jnp.where(jnp.isfinite(c), 1.0 / c, 0.0).astype(np.finfo(a.dtype).dtype)
    if norm == np.inf:  # ||A||_inf ||A^-1||_inf = the 1-norm condition of A^T
        a = take(a, pattern_transpose(pattern)) if pattern is not None else a.T
        pattern = pattern.transposed()[0] if pattern is not None else None
    factor = _make_factor(a, solver=solver, pattern=pattern, assume=None, throw=False,
                          uses=1, site=site or Site("linalg.rcond"))
    return _rcond_with(factor, a, solver=solver, pattern=pattern)


def _rcond_jvp(primals, tangents, *, constant=False, **params):
    # A diagnostic (`SolveInfo.rcond`, `cond(..., constant=True)`) is a
    # constant to differentiation, as under `stop_gradient`; a condition
    # number asked for is not differentiated: the estimate is piecewise.
    if constant:
        prim = linalg_rcond_p if len(primals) == 1 else linalg_factor_rcond_p
        out = prim.bind(*primals, constant=constant, **params)
        return out, Zero(_type(out).update())
    raise NotSupportedError(
        "a condition number is not differentiated by sciad (the estimate is piecewise). To "
        "use `sd.linalg.cond` as a diagnostic inside a differentiated function, pass it "
        "`constant=True` (its derivative is then zero, as under `sd.stop_gradient`).")


linalg_rcond_p.def_jvp(_rcond_jvp)
linalg_factor_rcond_p.def_jvp(_rcond_jvp)


@linalg_factor_rcond_p.def_abstract_eval
def _factor_rcond_shape(f, a, *, solver, pattern=None, constant=False):
    op = "linalg.factor_rcond"
    if not isinstance(f, FactorType) or (f.method, f.pattern) != (solver, pattern):
        raise ShapeError(f"needs a {solver!r} factorization of `a`, got {f.str_short()}.",
                         op=op)
    _check_matrix(a, TensorType((a.shape[0],), a.dtype), solver, pattern, op)
    return _rcond_type(a)


@linalg_factor_rcond_p.def_impl
def _factor_rcond_impl(factor, a, *, solver, pattern=None, constant=False, site=None):
    return _rcond_with(factor, a, solver=solver, pattern=pattern)


# ---------------------------------------------------------------------------
# matrix-free operators


linalg_solve_operator_p = Primitive("linalg.solve_operator", runtime_checks=True, params={
    "body": Body, "solver": str, "rtol": float, "atol": float,
    "maxiter": Param((int, None), default=None), "transpose": _TRANSPOSE,
    "symmetric": Param(bool, default=False), "throw": _THROW})
#: `body`: the matvec as a closed body, `(*params, v) -> (A(params) v,)`, linear
#: in `v` (its params the body's consts, `v` its one per-step input); the
#: operands are `(*params, b)`


# version-1 files: the matvec was the param `graph`
register_v1_migration("linalg.solve_operator",
                      graph_param_v1(lambda g: Body.of(g, len(g.inputs) - 1)))


def _operator_check(body, n_params: int, b, op: str):
    if not isinstance(body, Body) or len(body.inputs) != n_params + 1 \
            or len(body.outputs) != 1:
        raise ShapeError("the matvec body must map (*params, v) to one vector.", op=op)
    v = body.inputs[-1].type
    out = body.outputs[0].type
    if not isinstance(v, TensorType) or v.ndim != 1 or out != v:
        raise ShapeError(f"the matvec must map a vector to a vector of the same type, "
                         f"got {v.str_short()} -> {out.str_short()}.", op=op)
    if not isinstance(b, TensorType) or b.ndim not in (1, 2) or b.shape[0] != v.shape[0] \
            or b.dtype != v.dtype:
        raise ShapeError(f"`b` must be {v.dtype} of shape ({v.shape[0]},) or "
                         f"({v.shape[0]}, k) to match the operator, got {b.str_short()}.",
                         op=op)
    if v.dtype.kind != "f":
        raise DTypeError(f"the iterative solvers take real operators, got one on "
                         f"{v.str_short()}.", op=op)


@linalg_solve_operator_p.def_abstract_eval
def _solve_operator_shape(*args, body, solver, rtol, atol, maxiter=None, transpose=False,
                          symmetric=False, throw=True):
    *params, b = args
    op = "linalg.solve_operator"
    _operator_check(body, len(params), b, op)
    if tuple(params) != body.in_types[:-1]:
        raise ShapeError("the operator's params do not match its matvec body.", op=op)
    if "operator" not in lookup(solver, "linear", op=op).matrices:
        raise InvalidOptionError(f"a matrix-free operator needs an iterative solver "
                                 f"({', '.join(map(repr, names_for('operator')))}), "
                                 f"got {solver!r}.", op=op)
    if not (rtol >= 0 and atol >= 0) or rtol == atol == 0:
        raise InvalidOptionError(f"needs rtol >= 0 and atol >= 0, not both 0; got rtol={rtol}, "
                                 f"atol={atol}.", op=op)
    return TensorType(b.shape, b.dtype)


@linalg_solve_operator_p.def_impl
def _solve_operator_impl(*args, body, solver, rtol, atol, maxiter=None, transpose=False,
                         symmetric=False, throw=True, site=None):
    *params, b = args
    f = lower(body, site.held if site is not None else ())

    def matvec(v):
        return f(*params, v)[0]

    if transpose and not symmetric:
        struct = jax.ShapeDtypeStruct((b.shape[0],), b.dtype)
        matvec_t = jax.linear_transpose(matvec, struct)
        mv = lambda v: matvec_t(v)[0]  # noqa: E731
    else:
        mv = matvec
    return _iterative_solve(mv, None, b, solver=solver, pattern=None, rtol=rtol, atol=atol,
                            maxiter=maxiter, precond=None, throw=throw, assume=None,
                            site=site or Site("linalg.solve_operator"))


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
    _, touts = jvp_eval(graph, [*params, v], [*dparams, Zero(_type(v).update())])
    return touts[0]


def _matvec_tangent_transposed(graph, x, params, dparams):
    """`(dA)^T x`: the gradient in `v` of `<x, (dA) v>`, which is linear in
    `v` (so any `v` will do: `x`)."""
    t = _type(x)
    g2, _, _, caps = trace_flat(
        lambda v: [instantiate(_matvec_tangent(graph, v, params, dparams))],
        (TensorType(t.shape, t.dtype),), closure=True, name="matvec_tangent")
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
            term = _matvec_tangent_transposed(kw["body"], x, params, dparams)
        else:
            term = _matvec_tangent(kw["body"], x, params, dparams)
        if not is_zero(term):
            term = _neg(term)
            rhs = term if is_zero(rhs) else rhs + term
    if is_zero(rhs):
        return x, Zero(_type(x).update())
    return x, linalg_solve_operator_p.bind(*params, rhs, **_operator_params(kw, flip=False))


@linalg_solve_operator_p.def_vjp
def _solve_operator_vjp(primals, x, ct, **kw):
    *params, b = primals
    lam = linalg_solve_operator_p.bind(*params, ct, **_operator_params(kw, flip=True))
    param_cts: list = [None] * len(params)
    wrt = [needs_ct(p) for p in params] + [False]
    if any(wrt):
        # A x = b  =>  pbar = -(d(A(p) x)/dp)^T lam; for the transposed solve
        # A^T x = b, <lam, d(A^T) x> = <x, (dA) lam>: the same with x and lam swapped.
        v, w = (lam, x) if kw.get("transpose") and not kw.get("symmetric") else (x, lam)
        if len(v.shape) == 1:
            _, backward = vjp_eval(kw["body"], [*params, v], wrt)
            cts = backward([w])[:-1]
        else:  # several right-hand sides: sum over the columns
            cts = None
            for j in range(v.shape[1]):
                _, backward = vjp_eval(kw["body"], [*params, v[:, j]], wrt)
                col = backward([w[:, j]])[:-1]
                cts = col if cts is None else [c if is_zero(d) else d if is_zero(c) else c + d
                                               for c, d in zip(cts, col)]
        param_cts = [None if is_zero(c) or not needs_ct(p) else _neg(c)
                     for p, c in zip(params, cts)]
    return (*param_cts, lam)


@linalg_solve_operator_p.def_transpose
def _solve_operator_transpose(ct, *args, **kw):
    *params, b = args
    assert is_linear(b) and not any(is_linear(p) for p in params), \
        "linalg.solve_operator is linear in `b` only"
    return (*([None] * len(params)),
            linalg_solve_operator_p.bind(*params, ct, **_operator_params(kw, flip=True)))


# ---------------------------------------------------------------------------
# cost (`sd.cost`): a factorization's FLOPs from its size (dense) or from its
# pattern's fill (sparse); a solve with factors, two FLOPs per stored entry
# per right-hand side; an iterative solve, per iteration (its count is known
# only when it runs)


def _factor_flops(n: int, solver: str, pattern) -> float:
    """The solver's cost model: a factorization (dense, or sparse from the
    pattern's LU fill)."""
    fill = sparse_lu_fill(pattern) if pattern is not None else None
    return lookup(solver, "linear").factor_flops(n, fill)


def _per_rhs(n: int, solver: str, pattern) -> float:
    """The solver's cost model: a solve with the factor, per right-hand side."""
    fill = sparse_lu_fill(pattern) if pattern is not None else None
    return lookup(solver, "linear").solve_flops(n, fill)


def _rhs(b, n: int) -> int:
    return max(size(b.type) // max(n, 1), 1)


def _iteration_flops(solver: str, b, pattern, preconditioner=None) -> float:
    n = b.type.shape[0]
    matvec = 2.0 * (pattern.nnz if pattern is not None else n * n)
    per = lookup(solver, "linear").iteration_flops(n, matvec)
    pre = None if preconditioner is None else lookup(preconditioner, "preconditioner")
    if pre is not None and not pre.partitioned:  # (see _solve_cost)
        per += pre.apply_flops(n, pattern)
    return per * _rhs(b, n)


@linalg_factor_p.def_cost
def _factor_cost(node, body):
    p = node.params
    return Cost(_factor_flops(node.inputs[0].type.shape[0], p["solver"], p.get("pattern")),
                note=f"solver {p['solver']!r}")


@linalg_backsolve_p.def_cost
def _backsolve_cost(node, body):
    _, a, b = node.inputs
    n = a.type.shape[0]
    return Cost(_per_rhs(n, node.params["solver"], node.params.get("pattern")) * _rhs(b, n))


@linalg_solve_p.def_cost
def _solve_cost(node, body):
    p = node.params
    a, b = node.inputs
    n = a.type.shape[0]
    if not lookup(p["solver"], "linear").direct:
        per = _iteration_flops(p["solver"], b, p.get("pattern"), p.get("preconditioner"))
        note = f"solver {p['solver']!r}, per iteration ({_si(per)})"
        if p.get("partition") is not None:  # (the whole's FLOPs; each device does its rows')
            part = p["partition"]
            note += (f"; rows over {part.devices} devices of {part.axis!r}, "
                     f"{part.received()} values received per product")
        temp = 0
        pre = p.get("preconditioner")
        pre = None if pre is None else lookup(pre, "preconditioner")
        if pre is not None and pre.partitioned:
            flops, held, what = pre.partitioned_cost(p["pattern"], p["partition"],
                                                     np.dtype(a.type.dtype).itemsize)
            return Cost(per + flops * _rhs(b, n), held, f"{note}; {what}")
        if pre is not None:  # its state: set up once per solve
            temp = pre.setup_bytes(n, p.get("pattern"), a.type.dtype)
            note += f"; {pre.describe(n, p.get('pattern'), a.type.dtype)}"
        return Cost(per, temp, note)
    f = FactorType(a.type.shape, a.type.dtype, p["solver"], p.get("pattern"))
    return Cost(_factor_flops(n, p["solver"], p.get("pattern"))
                + _per_rhs(n, p["solver"], p.get("pattern")) * _rhs(b, n), nbytes(f),
                f"solver {p['solver']!r}")


@linalg_solve_operator_p.def_cost
def _solve_operator_cost(node, body):
    mv = body(node.params["body"])
    n = node.inputs[-1].type.shape[0]
    per = mv.flops + 10.0 * n
    return Cost(per, mv.peak, f"per iteration ({_si(per)})")


@linalg_rcond_p.def_cost
def _rcond_cost(node, body):
    a = node.inputs[0]
    n = a.type.shape[0]
    p = node.params
    return Cost(_factor_flops(n, p["solver"], p.get("pattern"))
                + 10 * _per_rhs(n, p["solver"], p.get("pattern")))


@linalg_factor_rcond_p.def_cost
def _factor_rcond_cost(node, body):
    n = node.inputs[1].type.shape[0]
    return Cost(10 * _per_rhs(n, node.params["solver"], node.params.get("pattern")))


# ---------------------------------------------------------------------------
# batching (`sd.vmap`): right-hand sides as columns; batches of matrices as
# maps, whose factorizations `share_factors` shares (see `_map`)


def _install_batch_rules() -> None:
    for p in (linalg_solve_p, linalg_backsolve_p):
        p.def_batch(columns_rule(p))
    for p in (linalg_factor_p, linalg_rcond_p, linalg_factor_rcond_p,
              linalg_solve_operator_p):
        p.def_batch(map_rule(p))


_install_batch_rules()


# ---------------------------------------------------------------------------
# Sparsity: a solution depends on every entry of the matrix (its factor, the
# operator's params) and on the whole column of `b` it solves for (the
# columns are solved independently, also by the iterative solvers); a
# factorization and a condition estimate on every entry of the matrix; a
# diagnostic estimate (`constant`, derivative zero) on nothing.


def _install_sparsity_rules() -> None:
    def solution(out, mats, b):
        parts = [along(out, b, (0,))]
        if mats:
            parts.append(dense(out, *mats))
        return union(*parts)

    def estimate(outs, *deps, constant=False, **params):
        return empty(1, deps[0].columns) if constant else dense(outs[0], *deps)

    linalg_solve_p.def_sparsity(lambda outs, a, b, **params: solution(outs[0], [a], b))
    linalg_backsolve_p.def_sparsity(
        lambda outs, f, a, b, **params: solution(outs[0], [f, a], b))
    linalg_solve_operator_p.def_sparsity(
        lambda outs, *args, **params: solution(outs[0], args[:-1], args[-1]))
    linalg_factor_p.def_sparsity(lambda outs, a, **params: dense(outs[0], a))
    linalg_rcond_p.def_sparsity(estimate)
    linalg_factor_rcond_p.def_sparsity(estimate)


_install_sparsity_rules()


# ---------------------------------------------------------------------------
# the solve nodes from operands already promoted to one dtype: the cores
# `sciad.linalg.solve` and the rules that solve (the implicit function
# theorem of a root, an eigenvector's bordered system) bind


def solve_params(sparse: bool, pattern, tags: frozenset, dtype, solver: str, *, tol=None,
                 atol: float = 0.0, maxiter=None, preconditioner=None,
                 op: str = "linalg.solve"):
    """`(record, params)` of a `linalg.solve` node on a dense or sparse
    matrix (`pattern`, if sparse) with `tags`, of `dtype`: the solver
    record `solver` names ("auto": the one for the matrix) and its params
    (an iterative solver's tolerance defaults to 1e-10 in float64, 1e-5
    below)."""
    record = resolve(solver, matrix="sparse" if sparse else "dense", tags=tags, dtype=dtype,
                     pattern=pattern if sparse else None,
                     op=op)
    params: dict = {"solver": record.name}
    if sparse:
        params["pattern"] = pattern
    preconditioner = auto_preconditioner(solver, record, preconditioner, sparse=sparse,
                                         tags=tags)
    if not record.direct:
        if tol is None:
            tol = 1e-10 if np.finfo(dtype).bits >= 64 else 1e-5
        params.update(rtol=float(tol), atol=float(atol),
                      maxiter=None if maxiter is None else int(maxiter),
                      preconditioner=preconditioner)
    elif (tol, maxiter, preconditioner) != (None, None, None) or atol != 0.0:
        raise InvalidOptionError(f"the direct solver {record.name!r} takes no `tol`, `atol`, "
                                 "`maxiter` or `preconditioner`.", op=op)
    params["assume"] = "spd" if "spd" in tags else "symmetric" if "symmetric" in tags else None
    return record, params


def solve(a, b, solver: str = "auto", *, estimate: bool = True):
    """`A x = b` for a dense or sparse `a` and a dense `b` of its dtype (no
    promotion: `sciad.linalg.solve` promotes), with a direct solver or
    `"auto"`: one `linalg.solve` node (`estimate`: its param, see
    `linalg_solve_p`)."""
    t = type_of(a)
    _, params = solve_params(isinstance(t, SparseType), getattr(t, "pattern", None),
                             t.tags, t.dtype, solver)
    return linalg_solve_p.bind(a, b, **_clean(dict(params, estimate=estimate)))


def solve_operator(matvec, n: int, dtype, tags: frozenset, b, solver: str, *, tol=None,
                   atol: float = 0.0, maxiter=None, throw: bool = True):
    """`A x = b` for the matrix-free `A v = matvec(v)` (`n` by `n`, of
    `dtype`, with `tags`) and an iterative solver: one
    `linalg.solve_operator` node holding `matvec`'s graph."""
    op = "linalg.solve"
    record = resolve(solver, matrix="operator", tags=tags, dtype=dtype, op=op)
    if "operator" not in record.matrices:
        raise InvalidOptionError(f"a matrix-free operator needs an iterative solver "
                                 f"({', '.join(map(repr, names_for('operator')))}), got "
                                 f"{solver!r}.", op=op)
    b = ops.astype(ops.asarray(b), dtype)
    graph, captured, _ = trace_body(lambda v: [ops.asarray(matvec(v))],
                                    (TensorType((n,), dtype),), name="matvec")
    if tol is None:
        tol = 1e-10 if np.finfo(dtype).bits >= 64 else 1e-5
    params = dict(body=Body.of(graph, len(captured)), solver=record.name, rtol=float(tol),
                  atol=float(atol))
    if maxiter is not None:
        params["maxiter"] = int(maxiter)
    if tags:
        params["symmetric"] = True
    if not throw:
        params["throw"] = False
    return linalg_solve_operator_p.bind(*captured, b, **params)
