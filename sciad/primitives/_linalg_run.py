"""The run-time side of the linear-solve primitives (`sciad.primitives._linalg`):
a factorization and its solves through a solver record, with their checks,
JAX values in and JAX values out, called by the primitives' implementations.

- `_make_factor`: the factorization of a matrix as the record holds it (a
  dense factor with its condition estimate, a host store's handle, a
  compiled backend's handle freed at the end of its program), the matrix
  checked first (finite, the structure `assume` claims, no empty row or
  column) and a failed factorization judged where the record reports one
  as a value (`failed`).
- `_solve_with`: a solve with that factor, checked by its backward error
  (for a sparse solve in the program, refined and judged on the host only
  where a measure is off).
- the measures both use (`_matvec`, `_norm_inf`, `_measures`, ...).

The policy of the checks (what fails, what warns) is `sciad.primitives._checks`'.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import config
from ..graph import TensorType
from ..graph._types import FactorType, Pattern, register_factor_layout
from ..solvers import _sparse_checks
from ..solvers.direct import _dense, _sparse_direct
from ..solvers._host import host_call
from ..solvers._indices import (pattern_cols, pattern_diagonal, pattern_rows,
                                pattern_transpose, segment_sum, take_static)
from ..solvers._measures import ratio
from ..solvers._registry import lookup, records
from ._checks import (check, example_report, judge_factor, judge_matrix, judge_solve,
                      refine_above, releasing, symmetry_tolerance, tie)
from ._sparse import sparse_matmul_p

ASSUME = ("symmetric", "spd")


def _checks_on() -> bool:
    return bool(config.enable_checks)




def _matvec(a, pattern: Pattern | None, transpose: bool, product=None):
    """`x -> op(a) x` on run-time values (with `product`, a solver's own
    compiled sparse product: see `AbstractDirectSolver.product`)."""
    if product is not None:
        return lambda x: product(a, x, transpose)
    if pattern is not None:
        return lambda x: sparse_matmul_p.impl_rule(a, x, pattern=pattern, transpose=transpose)
    m = a.T if transpose else a
    return lambda x: jnp.matmul(m, x, precision="highest")


def _asymmetry(a, pattern):
    """`max |A - A^T| / max |A|` (0 for a zero matrix)."""
    at = take_static(a, pattern_transpose(pattern)) if pattern is not None else a.T
    scale = jnp.max(jnp.abs(a), initial=0.0)
    return jnp.max(jnp.abs(a - at), initial=0.0) / jnp.where(scale > 0, scale, 1.0)


def _min_diagonal(a, pattern):
    """The smallest real part of a diagonal entry (0 where a sparse pattern
    stores none)."""
    if pattern is None:
        return jnp.min(jnp.real(jnp.diagonal(a)), initial=jnp.inf)
    stored = pattern.diagonal_positions() >= 0
    d = jnp.real(take_static(a, pattern_diagonal(pattern)))
    d = d if stored.all() else jnp.where(stored, d, 0.0)
    return jnp.min(d, initial=jnp.inf)


def _matrix_measures(a, pattern, assume, zero_line=None, compiled: bool = True) -> dict:
    """What `judge_matrix` checks, computed in the program; with `zero_line`
    (a sparse solver's `product`), also `singular`: a zero row or column.
    A float64 sparse matrix on the CPU is measured in one compiled pass
    (`sciad.solvers._sparse_checks`), unless not `compiled`."""
    if compiled and pattern is not None and _sparse_checks.available(a.dtype):
        m = _sparse_checks.matrix_measures(pattern, a, symmetric=assume in ASSUME,
                                           diagonal=assume == "spd")
        if zero_line is not None:
            m["singular"] = m["zero_line"]
        del m["zero_line"]
        return m
    out = dict(nonfinite=~jnp.all(jnp.isfinite(a)))
    if assume in ASSUME:
        out["asymmetry"] = _asymmetry(a, pattern)
    if assume == "spd":
        out["min_diagonal"] = _min_diagonal(a, pattern)
    if zero_line is not None:
        out["singular"] = _zero_line(a, pattern, zero_line)
    return out


def _matrix_fails(measures: dict, dtype):
    """Whether the matrix measures (`_matrix_measures`'s, named as there or
    with a `nonfinite_a`) fail a check: NaN fails every comparison."""
    when = measures.get("nonfinite", measures.get("nonfinite_a"))
    if "singular" in measures:
        when |= measures["singular"]
    if "asymmetry" in measures:
        when |= ~(measures["asymmetry"] <= symmetry_tolerance(dtype))
    if "min_diagonal" in measures:
        when |= ~(measures["min_diagonal"] > 0)
    return when


def check_where(when, measures: dict, judged, site):
    """`judged(measures, site)` (a host check's token) where `when` holds,
    else a zero token: the host is called only where a measure fails (a
    judge that only raises), under `vmap` once for the batch, only where one
    example fails. `site`: the node's, whose `held` values reach `judged`'s
    site as operands (`_where_held`)."""
    names = list(measures)
    return _where_held(when, lambda s, *m: judged(dict(zip(names, m)), s),
                       lambda *m: jnp.zeros((), jnp.int32), site, *measures.values())


def _zero_line(a, pattern, product):
    """Whether a row or a column of the sparse matrix with values `a` holds
    only zeros (or NaN): a singular matrix. From the sums of `|a|` along
    rows and columns, two products with ones by the solver's compiled
    `product` (XLA's scatters here cost more to compile than the whole
    factorization and solve of a small matrix)."""
    mag = jnp.abs(a)
    n, m = pattern.shape
    rows = product(mag, jnp.ones(m, mag.dtype), False)
    cols = product(mag, jnp.ones(n, mag.dtype), True)
    return ~(jnp.all(rows > 0) & jnp.all(cols > 0))


def _norm_inf(a, pattern, transpose: bool, product=None):
    """`||op(a)||_inf` from the values (with a solver's `product`: the
    product of `|op(a)|` with ones)."""
    if product is not None:
        mag = jnp.abs(a)
        ones = jnp.ones(pattern.shape[0 if transpose else 1], mag.dtype)
        return jnp.max(product(mag, ones, transpose), initial=0.0)
    if pattern is None:
        return jnp.max(jnp.sum(jnp.abs(a), axis=0 if transpose else 1), initial=0.0)
    idx = pattern_cols(pattern) if transpose else pattern_rows(pattern)
    n = pattern.shape[1] if transpose else pattern.shape[0]
    return jnp.max(segment_sum(jnp.abs(a), idx, n), initial=0.0)


def _measures(apply, x, b, anorm_inf):
    """`(r, backward_error, relative_residual, max |b|)` of `x` for
    `apply(x) = b`, with `r = apply(x) - b` (2-D `b`: the worst column)."""
    r = apply(x) - b
    # (one reduction of the three: each reduction is a kernel XLA compiles)
    rn, xn, bn = jnp.max(jnp.abs(jnp.stack([r, x, b])), axis=1, initial=0.0)
    eta = ratio(rn, anorm_inf * xn + bn, jnp)  # (NaN for a NaN x: it fails the checks)
    rel = ratio(rn, bn, jnp)
    worst = functools.partial(jnp.max, initial=0.0)  # (NaN wins; 0 for no columns)
    return r, worst(eta), worst(rel), worst(bn)


def _factor_layout(t: FactorType):
    # the solver's arrays; a dense factorization carries its condition estimate
    record = lookup(t.method, "linear")
    arrays = tuple(TensorType(shape, dtype)
                   for shape, dtype in record.factor_layout(t.shape[0], t.dtype, t.pattern))
    if not record.sparse:
        arrays += (TensorType((), np.finfo(t.dtype).dtype),)
    return arrays


def _register_layouts() -> None:
    """Tells `FactorType` how each direct solver's factor is held (for the
    built-in ones at import; a solver registered later, when a node first
    factors with it)."""
    for record in records("linear"):
        if record.direct:
            register_factor_layout(record.name, _factor_layout)


_register_layouts()


_ZERO_TOKEN = np.zeros((), np.int32)


class MadeFactor(tuple):
    """A factorization's arrays as the node that made them returns them,
    where they are handles the program made (`uses` counted, see
    `sciad.graph.Holding`): a solve lowered in the same run reads the very
    value, so it knows at trace time that its handle is not 0 and compiles
    no branch for one (`HandleSolver.solve`'s `numeric`). A pytree like a
    tuple; any other value of a factor (a body's input, a loop's carry) is a
    plain tuple, whose solve asks the handle at run time."""

    __slots__ = ()


jax.tree_util.register_pytree_node(MadeFactor, lambda f: (tuple(f), None),
                                   lambda _, xs: MadeFactor(xs))


def _make_factor(a, *, solver, pattern, assume, throw, uses, site, estimate: bool = True):
    """The factorization of `a` as a tuple of arrays (see `_factor_layout`),
    checked when `throw`: finite, symmetric if `assume` says so, no
    breakdown. A dense factorization carries its condition estimate (NaN
    without `estimate`: then checked in the program, the host called only
    to raise). A
    compiled backend's handles (`frees_factor`) are made only with `uses`
    counted: the graph then ends them (`linalg.release`, placed by
    `place_releases`), and lowering gives every later check of the run their
    host release (`Site.held`)."""
    bare = site.bare  # (what host functions keep; `check` hands on `site.held`)
    dtype = np.dtype(a.dtype)
    tags = frozenset({assume} if assume else ())
    record = lookup(solver, "linear")
    if record.host_checks:  # checked in the host call that factors
        report = None
        if throw:
            report = functools.partial(judge_factor, bare, dtype=dtype, solver=solver,
                                       tags=tags)
        return record.factor(a, pattern=pattern, uses=uses, assume=assume if throw else None,
                             report=report)
    if record.sparse:  # (spsolve, klu) the matrix checked here, before it is factored
        if throw:
            # (klu: a zero row or column too, said here with the node and
            # line, where KLU's own zero-pivot error, which stops the
            # program, cannot. Not for an spd claim: its positive diagonal,
            # checked, leaves no zero row or column)
            line = record.product(pattern) if record.frees_factor and assume != "spd" else None
            measures = _matrix_measures(a, pattern, assume, zero_line=line)
            judge = judge_matrix
            if record.frees_factor:
                measures.setdefault("singular", jnp.zeros((), bool))
                judge = functools.partial(judge_factor, solver=solver)
            tok = check_where(_matrix_fails(measures, dtype), measures,
                              lambda m, s: check(judge, s, dtype=dtype, tags=tags, **m), site)
            a = tie(a, tok)
        if not record.frees_factor:
            return tuple(record.factor(a, pattern=pattern))
        # (klu, cudss: compiled handles only where the graph ends them)
        keep = uses is not None
        # (`assume` only where checked: cudss factors an "spd" matrix by Cholesky)
        f = tuple(record.factor(a, pattern=pattern, uses=uses,
                                assume=assume if throw else None))
        if throw:  # (the solves wait for the checks: a 0 handle does not read `a`)
            f = tuple(tie(f, tok))
        failed = record.failed(f, pattern=pattern) if throw and keep else None
        if failed is not None:
            # (a factorization that failed, judged here with the node and the
            # user's line; the batch's other factors, made here, are released
            # by the check that fails: they are not yet in the site's `held`)
            own = site
            if record.release_now is not None:
                own = dataclasses.replace(site, held=(*site.held, (f[0], record.release_now)))
            broke = check_where(failed, {"singular": failed},
                                lambda m, s: check(judge_factor, s, dtype=dtype, solver=solver,
                                                   tags=tags, **m), own)
            f = tuple(tie(f, broke))
        return MadeFactor(f) if keep else f
    f = record.factor(a)
    ok = record.ok(f)
    measures = dict(singular=~ok, **_matrix_measures(a, None, assume))
    names = list(measures)
    real = np.finfo(dtype).dtype
    if not estimate:
        unknown = jnp.full((), jnp.nan, real)
        if not throw:
            return (*f, unknown)
        tok = check_where(_matrix_fails(measures, dtype), measures,
                          lambda m, s: check(judge_factor, s, dtype=dtype, solver=solver,
                                             tags=tags, **m), site)
        return tie((*f, unknown), tok)

    def one(m, anorm, status, where=bare) -> float:
        if throw:
            judge_factor(where, dtype=dtype, solver=solver, tags=tags, **status)
        if status["singular"] or status["nonfinite"]:
            return 0.0
        return record.rcond_host(m, float(anorm))

    def host(m, anorm, *vals):
        # one host call: LAPACK's condition estimate from the factor, and
        # the checks of the factorization
        if m.ndim == 2:  # (unbatched: the common case, without the loop's overhead)
            return _ZERO_TOKEN, np.asarray(one(m, anorm, dict(zip(names, vals))), real)
        batch = np.broadcast_shapes(m.shape[:-2], anorm.shape, *(v.shape for v in vals))
        k = int(np.prod(batch, dtype=np.int64))
        ms = np.broadcast_to(m, batch + m.shape[-2:]).reshape((k,) + m.shape[-2:])
        an = np.broadcast_to(anorm, batch).reshape(k)
        vals = [np.broadcast_to(v, batch).reshape(k) for v in vals]
        rc = np.array([one(ms[i], an[i], {n: v[i] for n, v in zip(names, vals)},
                           bare.in_example(i, batch)) for i in range(k)], real)
        return np.zeros(batch, np.int32), rc.reshape(batch)

    tok, rcond = host_call(host, (jax.ShapeDtypeStruct((), jnp.int32),
                                  jax.ShapeDtypeStruct((), real)),
                           f[0], _dense.norm1(a), *measures.values())
    return tie((*f, rcond), tok)


def _solve_with(factor, a, b, *, solver, pattern, transpose, throw, site):
    """`op(a) x = b` with a factorization of `a`, checked when `throw` (see
    `sciad.primitives._checks`): the backward error and the residual
    against the condition estimate.

    A SuperLU solve is checked on the host in the call that solves (one
    host call per solve), with a step of iterative refinement where the
    backward error is above the bound (a factor of a slightly different
    matrix, reused, is then still good enough). Dense solves and those of
    sparse solvers in the program (klu, spsolve) are measured in the
    program, and the host is called only where a measure is off: to raise
    or warn, and for a sparse one to refine the solution and estimate the
    condition number first (`_sparse_direct.repair`)."""
    bare = site.bare  # (what host functions keep; `check` hands on `site.held`)
    dtype = np.dtype(b.dtype)
    n = b.shape[0]
    tau = refine_above(dtype, n)
    eps = np.finfo(dtype).eps
    record = lookup(solver, "linear")
    if record.host_checks and throw:  # checked (and refined) in the host call
        return record.solve(factor, a, b, pattern=pattern, transpose=transpose,
                            refine_above=tau,
                            estimate="always" if _checks_on() else "on_residual",
                            report=example_report(judge_solve, bare, dtype=dtype, n=n))
    if record.frees_factor:
        x = record.solve(factor, a, b, pattern=pattern, transpose=transpose,
                         numeric=isinstance(factor, MadeFactor))
    elif record.sparse:
        x = record.solve(factor, a, b, pattern=pattern, transpose=transpose)
    else:
        *f, rc = factor
        x = record.solve(tuple(f), a, b, transpose=transpose)
    if not throw:
        return x
    if record.sparse and _sparse_checks.available(a.dtype) and x.dtype == b.dtype == a.dtype:
        eta, rel, bnorm, all_nan = _sparse_checks.solve_measures(pattern, a, x, b,
                                                                 transpose=transpose)
    else:
        product = record.product(pattern) if record.sparse else None
        apply = _matvec(a, pattern, transpose, product)
        anorm = _norm_inf(a, pattern, transpose, product)
        _, eta, rel, bnorm = _measures(apply, x, b, anorm)
        all_nan = jnp.all(jnp.isnan(x)) if x.size else jnp.zeros((), bool)
    nonfinite = ~jnp.isfinite(bnorm)
    if record.sparse:
        # (A sparse factorization in the program (KLU's threshold pivoting,
        # which keeps a diagonal pivot down to 1e-3 of its column's largest
        # entry, for less fill) may not be backward stable. Where a measure
        # is off, one host call refines the solution with a SuperLU factor of
        # the matrix (as the host's SuperLU solves refine), estimates the
        # condition number and judges: a refinement loop and an estimate in
        # the program quintupled the compile time of every checked solve.)
        need = _checks_on() | ~(rel <= np.sqrt(eps)) | ~(eta <= tau) | nonfinite
        report = example_report(judge_solve, bare, dtype=dtype, n=n)
        # (a solver that factors in its solve's call marks a breakdown with an
        # all-NaN solution of a finite system: judged first, as a failed
        # factorization, in the same branch)
        broke = all_nan & ~nonfinite if record.nan_on_breakdown else jnp.zeros((), bool)

        def failing(s, a, b, x, broke):
            if record.nan_on_breakdown:
                x = tie(x, check(judge_factor, s, dtype=dtype, solver=solver,
                                 singular=broke))
            return _sparse_direct.repair(
                pattern, a, b, x, transpose, refine_above=tau,
                estimate="always" if _checks_on() else "on_residual", report=report,
                guard=functools.partial(releasing, held=s.held))

        return _where_held(need | broke, failing, lambda a, b, x, broke: x, site, a, b, x, broke)
    # (No refinement in the program for dense solves: LU with partial
    # pivoting and Cholesky are backward stable, and a conditional second
    # solve per solve doubled the compile time of small programs.)
    # (a condition estimate not made, NaN: not judged)
    bad = nonfinite | ~(eta <= tau) | (rc < eps)
    return tie(x, check(judge_solve, site, when=bad, dtype=dtype, n=n, nonfinite=nonfinite,
                        backward_error=eta, residual=rel, rcond=rc))


def _where_any(pred, fn, otherwise, *operands):
    """`fn(*operands)` where `pred`, else `otherwise(*operands)`: a
    `lax.cond` whose predicate, under `jax.vmap`, is whether any example
    needs `fn` (there a batched predicate makes `lax.cond` a select that runs
    `fn`, a host call, for every example; here it runs for the whole batch
    only where one example needs it)."""
    leaves, tree = jax.tree_util.tree_flatten(operands)

    def call(*xs):
        return fn(*jax.tree_util.tree_unflatten(tree, xs))

    def other(*xs):
        return otherwise(*jax.tree_util.tree_unflatten(tree, xs))

    @jax.custom_batching.custom_vmap
    def run(p, *xs):
        return jax.lax.cond(p, call, other, *xs)

    @run.def_vmap
    def _rule(axis_size, in_batched, p, *xs):
        some = jnp.any(p) if in_batched[0] else p
        axes = [0 if b else None for b in in_batched[1:]]
        batched = [jax.vmap(g, in_axes=axes, axis_size=axis_size) for g in (call, other)]
        out = jax.lax.cond(some, *batched, *xs)
        return out, True

    return run(jnp.asarray(pred), *leaves)


def _where_held(pred, fn, otherwise, site, *operands):
    """`_where_any` for a `fn(site, *operands)` that checks: the values
    `site` holds (`Site.held`) enter as operands, and `fn` gets a site
    holding those, so that no function JAX traces apart (the branch, the
    batching rule) closes over a value of the program (JAX keeps such a
    function's constants, and a traced one leaks: under `jax.jacfwd` of
    `sd.to_jax`, it did)."""
    held, bare = site.held, site.bare
    releases = [r for _, r in held]
    k = len(operands)

    def call(*xs):
        return fn(dataclasses.replace(bare, held=tuple(zip(xs[k:], releases))), *xs[:k])

    def other(*xs):
        return otherwise(*xs[:k])

    return _where_any(pred, call, other, *operands, *(v for v, _ in held))


def _rcond_with(factor, a, *, solver, pattern):
    record = lookup(solver, "linear")
    if record.sparse:
        return record.rcond(factor, a, pattern=pattern)
    return factor[-1]  # (a dense factorization carries its estimate)
