"""Run-time checks: what a solve measures, judged on the host, as an error
or a warning that names the node and the user's line.

A primitive whose implementation checks at run time is declared with
`Primitive(..., runtime_checks=True)`; lowering then passes it the `site`
of the node (its op, source line and printed form), which the checks name.
Checks run on the host: sparse factorizations and solves measure there
anyway (`sciad.solvers.direct._sparse_direct`), and computations in the program
(dense factorizations, Krylov solves) hand their measures to one host call
(`check`) whose result the checked value is tied to (`tie`), so XLA can
neither drop the check nor run what follows without it. One host call per
factorization and one per solve: about 20 us each on the CPU.

An error leaves XLA as text (`sciad.errors.runtime_error_text`);
`sd.function`, eager calls, `sd.graph.evaluate` and `sd.to_jax` functions
turn it back into the sciad exception (`sciad.errors.runtime_error_from`).

The policy for direct solves (`judge_solve`), with `eps` the dtype's
machine epsilon:

- the normwise backward error `||b - A x|| / (||A|| ||x|| + ||b||)` must be
  at most `refine_above = min(10 n eps, sqrt(eps))`; above it, one step of
  iterative refinement is taken, and if it stays above, the solve failed
  (a `SingularMatrixError`: the matrix is numerically singular, badly
  scaled, or not what its tags claim);
- a matrix whose condition estimate exceeds `1/eps` is singular to working
  precision: if the solution does not satisfy the system to `sqrt(eps)`
  (relative residual), the system has no accurate solution
  (`SingularMatrixError`); otherwise the solution is only inaccurate and an
  `IllConditionedWarning` says so.

NaN is a failure. A measure that cannot be taken is NaN (a NaN solution's
backward error and residual: `sciad.solvers._measures.ratio`), and every
judgement reads it as failing, `if not x <= tol: fail`, never `if x > tol:
fail` (false for NaN). A NaN condition estimate alone means "not estimated".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import IllConditionedWarning, NonFiniteError, SingularMatrixError, StructureError
from ..graph import Site
from ..solvers._host import host_call, lead_axes
from ..solvers._registry import lookup


@functools.lru_cache(maxsize=None)
def eps_of(dtype) -> float:
    return float(np.finfo(np.dtype(dtype)).eps)


@functools.lru_cache(maxsize=None)
def refine_above(dtype, n: int) -> float:
    """The largest backward error a direct solve may have (see the module
    docstring)."""
    eps = eps_of(dtype)
    return min(10.0 * max(n, 1) * eps, float(np.sqrt(eps)))


@functools.lru_cache(maxsize=None)
def symmetry_tolerance(dtype) -> float:
    """`max |A - A^T| / max |A|` above which a `symmetric`/`spd` tag is wrong."""
    return float(np.sqrt(eps_of(dtype)))


def _cond_text(rcond: float) -> str:
    if rcond is None or np.isnan(rcond):
        return "not estimated"
    if rcond <= 0:
        return "infinite"
    return f"about {1.0 / rcond:.0e}"


# ---------------------------------------------------------------------------
# judgements (host side)


def judge_matrix(site: Site, *, dtype, tags=frozenset(), nonfinite=False, asymmetry=0.0,
                 min_diagonal=np.inf):
    """A matrix about to be factored (or solved with): finite, symmetric if
    declared so (a tag, or `assume=`), with a positive diagonal if declared
    positive definite (a necessary condition; definiteness itself shows in
    a Cholesky factorization)."""
    if (not np.ndim(nonfinite) and not nonfinite and np.ndim(asymmetry) == 0
            and asymmetry <= symmetry_tolerance(dtype)
            and ("spd" not in tags or np.ndim(min_diagonal) == 0 and min_diagonal > 0)):
        return  # the common case, quickly: a check is part of every solve
    if np.any(nonfinite):
        site.fail(NonFiniteError, "the matrix holds NaN or infinite values.")
    claimed = "/".join(sorted({"symmetric", "spd"} & set(tags))) or "symmetric"
    asym = float(np.max(asymmetry, initial=0.0))
    tol = symmetry_tolerance(dtype)
    if not asym <= tol:
        site.fail(StructureError,
                  f"the matrix is declared {claimed} (a tag, or `assume=`) but is not "
                  f"symmetric: max |A - A.T| / max |A| = {asym:.3e} > {tol:.1e}. Drop the "
                  "claim, or symmetrize the matrix.", asymmetry=asym)
    dmin = float(np.min(min_diagonal, initial=np.inf))
    if "spd" in tags and not dmin > 0:
        site.fail(StructureError,
                  f"the matrix is declared spd (a tag, or `assume=`) but has a diagonal "
                  f"entry <= 0 (the smallest is {dmin:.3e}), so it is not positive "
                  "definite.", min_diagonal=dmin)


def judge_factor(site: Site, *, dtype, solver: str, tags=frozenset(), nonfinite=False,
                 asymmetry=0.0, min_diagonal=np.inf, singular=False):
    """A factorization: the matrix checks, then breakdown."""
    judge_matrix(site, dtype=dtype, tags=tags, nonfinite=nonfinite, asymmetry=asymmetry,
                 min_diagonal=min_diagonal)
    if np.ndim(singular) == 0 and not singular:
        return
    if np.any(singular):  # as the solver's record words it
        cls, message, extra = lookup(solver, "linear").breakdown_for(frozenset(tags))
        site.fail(cls, message, **extra)


def judge_solve(site: Site, *, dtype, n: int, nonfinite=False, backward_error=0.0,
                residual=0.0, rcond=np.nan, refined=False):
    """A direct solve's measures (see the module docstring)."""
    eps = eps_of(dtype)
    tau = refine_above(dtype, n)
    eta, rel, rc = float(backward_error), float(residual), float(rcond)
    if eta <= tau and rel == rel and not nonfinite and not rc < eps:
        return  # the common case, quickly: a solve is many microseconds here
    if np.any(nonfinite):
        site.fail(NonFiniteError, "the right-hand side holds NaN or infinite values.")
    if np.isnan(eta) or np.isnan(rel):  # a NaN solution of a finite system
        site.fail(SingularMatrixError,
                  "the matrix is singular: the solve returned NaN or infinite values for a "
                  "finite matrix and right-hand side (a zero pivot, or a matrix so badly "
                  f"scaled that the solve overflowed; condition number {_cond_text(rc)}). "
                  "Check the matrix for a null space (a missing boundary condition, a "
                  "disconnected part).", backward_error=eta, residual=rel, rcond=rc)
    if not eta <= tau:
        site.fail(SingularMatrixError,
                  f"the solve is inaccurate: its backward error ||b - A x|| / (||A|| ||x|| + "
                  f"||b||) = {eta:.2e} stays above {tau:.1e} after a step of iterative "
                  f"refinement (condition number {_cond_text(rc)}). The matrix is "
                  "numerically singular, badly scaled, or not what its tags (or `assume=`) "
                  "claim.", backward_error=eta, rcond=rc)
    if not np.isnan(rc) and rc < eps:
        if not rel <= np.sqrt(eps):
            site.fail(SingularMatrixError,
                      f"the matrix is singular to working precision (condition number "
                      f"{_cond_text(rc)} > 1/eps = {1 / eps:.1e} for {np.dtype(dtype)}) and "
                      f"the solution does not satisfy the system: relative residual "
                      f"||b - A x|| / ||b|| = {rel:.2e}. The system has no accurate "
                      "solution; check the matrix for a null space (a missing boundary "
                      "condition, a disconnected part).",
                      backward_error=eta, residual=rel, rcond=rc)
        site.warn(IllConditionedWarning,
                  f"the matrix is ill-conditioned: condition number {_cond_text(rc)} exceeds "
                  f"1/eps = {1 / eps:.1e} for {np.dtype(dtype)}, so the solution may have "
                  "no correct digits (its residual is small: it solves a nearby system).")


def example_report(judge, site: Site, **static):
    """`report(**measures)` for a host function that judges a batch in a loop
    (a sparse solve's, on the host): `report(example=(i, batch), **measures)`
    judges example `i` (flat) of a batch of shape `batch` alone, so its
    failure names it and no example's measures mix with another's;
    `report(**measures)` judges at `site`."""
    def report(example=None, **measures):
        judge(site if example is None else site.in_example(*example), **static, **measures)
    return report


# ---------------------------------------------------------------------------
# checks of values computed in the program


def check(judge, site: Site, /, *, when=None, **measures):
    """One host call running `judge(site, **measures)` on values computed in
    the program (scalars or arrays of any dtype, batched under `vmap`); the
    result is a token (an int32 zero, batched like the measures) to `tie`
    into the checked value. Static keyword values (dtypes, tags, solver
    names) are passed as they are. With `when` (a traced bool), the host is
    called only where it holds (`lax.cond`; under `vmap`, everywhere): the
    judgement of measures that pass costs no host call. What the program
    holds when the check runs (`site.held`) is ended from the host before a
    failure raises (`releasing`)."""
    held, site = (site.held, site.bare) if site is not None else ((), site)
    names, values, static = [], [], {}
    for k, v in measures.items():
        if isinstance(v, (jax.Array, jax.core.Tracer)) or (
                isinstance(v, np.ndarray) and v.ndim):
            names.append(k)
            values.append(jnp.asarray(v))
        else:
            static[k] = v
    shapes = [tuple(v.shape) for v in values]

    def judge_all(*vals):
        batch = lead_axes(vals, [len(s) for s in shapes])
        k = int(np.prod(batch, dtype=np.int64))
        flat = [np.broadcast_to(v, batch + s).reshape((k,) + s) for v, s in zip(vals, shapes)]
        for i in range(k):  # the first failing batch element is reported, by its index
            judge(site.in_example(i, batch), **static, **{n: f[i] for n, f in zip(names, flat)})
        return (np.zeros(batch, np.int32),)

    host, values = releasing(judge_all, values, held)

    def call(values):
        (tok,) = host_call(host, (jax.ShapeDtypeStruct((), jnp.int32),), *values,
                           effect=True)
        return tok

    if when is None:
        return call(values)
    return jax.lax.cond(when, call, lambda _: jnp.zeros((), jnp.int32), values)


def releasing(host, operands, held=()):
    """`(host', operands')`: the host function of a check that may raise,
    given the first arrays of what the program made and holds (`held`, a
    `Site.held`: this run's and those lowering it) as extra operands, which
    it ends before it raises: the raise stops the program, whose release
    nodes may then never run (where one already ran, or another failed
    check ended the same value, the host release does nothing). `host'`
    calls `host` with the original operands."""
    if not held:
        return host, list(operands)
    n = len(operands)
    releases = [release for _, release in held]

    def guarded(*vals):
        try:
            return host(*vals[:n])
        except BaseException:
            for release, h in zip(releases, vals[n:]):
                try:
                    release(np.asarray(h))
                except Exception:  # (the check's own error is what the user needs)
                    pass
            raise

    return guarded, [*operands, *(v for v, _ in held)]


def tie(value, *tokens):
    """`value` made to depend on check tokens (it is unchanged: they are 0).
    The token is added to the smallest numeric leaf of a tuple (a factor's
    pivots or its condition estimate), so it costs next to nothing."""
    if not tokens:
        return value
    total = tokens[0]
    for t in tokens[1:]:
        total = total + t
    leaves, treedef = jax.tree_util.tree_flatten(value)
    numeric = [i for i, leaf in enumerate(leaves)
               if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.number)]
    assert numeric, "tie: no numeric leaf to carry the check; this is a bug in sciad"
    i = min(numeric, key=lambda j: jnp.size(leaves[j]))
    leaf = leaves[i]
    leaves[i] = leaf + total.astype(jnp.asarray(leaf).dtype)
    return jax.tree_util.tree_unflatten(treedef, leaves)
