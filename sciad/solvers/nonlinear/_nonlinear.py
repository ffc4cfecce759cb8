"""Nonlinear solves in JAX: Newton with a backtracking line search, and
Anderson-accelerated fixed-point iteration.

These are the loops the `optimize.root` primitive lowers to, written as plain
JAX functions of a residual `F: R^n -> R^n` so that other nodes (the Newton
solves of implicit ODE steps) call them too. The Jacobian's handling is a
`LinearSolve`: how to solve `J(x) d = r` at an iterate:

- `sparse_lu(pattern, values)`: `J`'s values on its pattern from `values(x)`
  (`colored_values`: one JVP per color of the pattern detected from the
  residual's graph), factored by SuperLU on the host;
- `dense_lu(matrix)`: `J = matrix(x)` (`jax.jacfwd`), LU in the program;
- `gmres(jvp, rtol)`: matrix-free, GMRES (lineax) on `v -> J(x) v`.

Each returns the step and whether the solve succeeded. A sparse or dense
LU made with `chord=True` keeps its factorization over Newton's iterations
(the chord method): it factors `J` at the first iterate, and again only
after an iteration that did not at least halve `||F||` (or whose step
failed), so a good start costs one factorization and a few solves.

**When a solve has converged.** A root is found to the stated accuracy, not
to an accuracy relative to where the iteration started (a far start makes
`||F(x0)||` huge, and a test scaled by it passes far from the root):

- the residual test: `||F(x)||_inf <= atol`, the user's absolute bound;
- the step test (`error_estimate`): after an accepted step `s` from `x`,
  where the Newton (Gauss-Newton) step was `d`, the error of the new
  iterate, estimated as `||d - s||_inf + ||s||_inf min(1, ||F(x_new)||_inf
  / ||F(x)||_inf)` (what the step left of the full one, plus the next step
  predicted from this one and the fall of `||F||`), is at most `tol
  ||x_new||_inf`: a relative error of `tol` in `x`, as SciPy's `xtol`. A
  linear `F` converges in one full step (`||F||` falls to rounding); a root
  approached quadratically, one step after the step itself is small.

A fixed-point iteration (`anderson`) converges where `||G(x) - x||_inf`, the
next plain step, is at most `atol` or `tol ||x||_inf`. A root (fixed point)
at `x = 0` needs `atol`: no relative accuracy is defined there.

The loops never raise:
they return the iterate, the iteration count, the residual's max-norm and a
status (`STATUS`), and the caller decides (`optimize.root` raises a
`ConvergenceError` with a diagnosis, or returns `success=False`).

A solve that does not converge also measures the floor of rounding errors
of `||F||` at its last iterate (`rounding_floor`): a residual at that floor
is as small as floating point allows there, whatever the tolerance, while
one that stalls far above it has met an obstacle (no root nearby, a
singular or wrong Jacobian). With `at_floor`, a solve that stalls at its
floor has converged: for the solves whose tolerance sciad sets itself (an
implicit ODE stage's), which must never be tighter than rounding allows.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..direct import _sparse_direct
from .._coloring import color_seeds


#: status codes of the loops, and what each says
STATUS = {
    0: "converged: ||F(x)||_inf <= atol (the residual test), or the error in x estimated "
       "from the last step is at most tol relative to ||x||_inf (the step test)",
    1: "the iteration limit was reached",
    2: "the Jacobian is singular (its factorization failed or gave a non-finite step)",
    3: "the line search failed: no step along the Newton direction reduced ||F||",
    4: "the residual is not finite",
    5: "the iteration stagnated: ||F|| fell by less than 1% in 10 consecutive iterations",
}
CONVERGED, MAXITER, SINGULAR, LINE_SEARCH, NONFINITE, STAGNATION = range(6)

#: how many halvings of the step the line search tries
LINE_SEARCH_STEPS = 30
#: Armijo's sufficient-decrease constant
ARMIJO = 1e-4
#: the chord method factors the Jacobian again after an iteration that
#: reduced `||F||_inf` by less than this factor
CHORD_RATE = 0.5
#: how far (in units in the last place) `rounding_floor` moves the iterate
FLOOR_ULPS = 4.0


class LinearSolve(NamedTuple):
    """How Newton solves `J(x) d = r`: `solve(x, r, aux, fresh) -> (d, ok,
    aux)`. `aux` is what the solver threads through the iterations (for a
    sparse LU, the handle of the factor it keeps, 0 for none, and the values
    it factored); `init` is its first value, `handle(aux)` the kept
    factor's handle. `fresh` (a traced bool): factor `J(x)` anew; else a
    `chord` solver solves with the factor in `aux` (see `newton`);
    `started`: `init` holds a matrix (`jac0`) that the first iteration
    solves with, instead of factoring `J(x0)`."""

    solve: Callable
    name: str
    init: Any = 0
    handle: Callable = lambda aux: jnp.zeros((), jnp.int32)
    chord: bool = False
    started: bool = False
    #: `x -> J(x)`, the dense Jacobian (a dense form only; None otherwise):
    #: what the trust-region methods (`trust_region`) step with
    matrix: Callable | None = None


def _norm(v):
    return jnp.max(jnp.abs(v), initial=0.0)


def colored_values(F: Callable, pattern, colors: np.ndarray) -> Callable:
    """`x -> the values of J(x)` on `pattern` (CSR order), from one JVP of
    `F` (JAX's) per color of the columns."""
    rows, cols = pattern.rows, pattern.indices
    seeds = color_seeds(colors, pattern.shape[1])  # color c: the sum of its columns' units
    where = colors[cols]

    def values(x):
        products = jax.vmap(lambda v: jax.jvp(F, (x,), (v,))[1])(jnp.asarray(seeds, x.dtype))
        return products[where, rows]

    return values


def sparse_lu(pattern, values: Callable, dtype, *, keep: bool = False,
              uses: int | None = None, chord: bool = False, start=None) -> LinearSolve:
    """`J(x)` on `pattern`, its values from `values(x)` (CSR order; see
    `colored_values`), factored and solved by SuperLU on the host: one host
    call per Newton iteration. With `keep` (or `chord`), the last
    factorization is kept in the host store and its handle threaded through
    the loop (see `sciad.solvers.direct._sparse_direct.newton_solve`); `uses`
    later solves read the one left at the end. With `chord`, an iteration
    not asked for a `fresh` factor solves with the kept one (the values it
    factored ride in `aux`, so a factor the store let go is made again from
    them: the result never depends on the store). `start`: the values of
    the matrix the chord's first iterations solve with; roots started with
    the same values share one factorization (`_sparse_direct.newton_solve`).
    """
    def solve(x, r, aux, fresh):
        handle, data = aux
        data = jnp.where(fresh, values(x), data) if chord else values(x)
        d, ok, handle = _sparse_direct.newton_solve(pattern, handle, data, r,
                                                    keep=keep or chord, uses=uses,
                                                    fresh=fresh if chord else None)
        return d, ok, (handle, data)

    init = (jnp.zeros((), jnp.int32),
            jnp.zeros((pattern.nnz,), dtype) if start is None else start)

    def handle(aux):  # (a root started converged never factored: the shared factor)
        if start is None:
            return aux[0]
        return jax.lax.cond(aux[0] == 0, lambda: _sparse_direct.shared_handle(pattern, start),
                            lambda: aux[0])

    return LinearSolve(solve, "sparse LU", init, handle, chord, start is not None)


def dense_lu(matrix: Callable, n: int, dtype, *, chord: bool = False,
             start=None) -> LinearSolve:
    """`J(x) = matrix(x)` (e.g. `jax.jacfwd(F)`), LU-factored in the program;
    a tiny pivot counts as singular. With `chord`, an iteration not asked
    for a `fresh` factor solves with the one in `aux`, at first that of the
    matrix `start` if given."""
    def factor(x):
        return jax.scipy.linalg.lu_factor(matrix(x))

    def solve(x, r, aux, fresh):
        if chord:
            lu, piv = jax.lax.cond(fresh, factor, lambda x: aux, x)
        else:
            lu, piv = factor(x)
        d = jax.scipy.linalg.lu_solve((lu, piv), r)
        diag = jnp.abs(jnp.diagonal(lu))
        eps = jnp.finfo(x.dtype).eps
        ok = jnp.all(jnp.isfinite(d)) & (jnp.min(diag) > eps * jnp.max(diag) * x.shape[0])
        return d, ok, (lu, piv) if chord else aux

    if start is not None:
        lu, piv = jax.scipy.linalg.lu_factor(start)
        init = (lu, piv.astype(jnp.int32))
    else:
        init = (jnp.zeros((n, n), dtype), jnp.zeros((n,), jnp.int32)) if chord else 0
    return LinearSolve(solve, "dense LU", init, chord=chord, started=start is not None,
                       matrix=matrix)


def gmres(jvp: Callable, rtol: float, maxiter: int | None = None) -> LinearSolve:
    """Matrix-free: GMRES (lineax) on `v -> J(x) v = jvp(x, v)`, to relative
    tolerance `rtol` (an inexact Newton step); a step that is not finite
    counts as a failed solve."""
    import lineax as lx

    def solve(x, r, aux, fresh):
        struct = jax.ShapeDtypeStruct(x.shape, x.dtype)
        op = lx.FunctionLinearOperator(lambda v: jvp(x, v), struct)
        sol = lx.linear_solve(op, r, lx.GMRES(rtol=rtol, atol=0.0, max_steps=maxiter,
                                              restart=min(50, x.shape[0])), throw=False)
        d = sol.value
        return d, jnp.all(jnp.isfinite(d)), aux

    return LinearSolve(solve, "GMRES")


class Result(NamedTuple):
    x: jax.Array
    nit: jax.Array       # int32
    residual: jax.Array  # ||F(x)||_inf
    status: jax.Array    # int32, see STATUS
    goal: jax.Array      # atol, the bound of the residual test
    aux: jax.Array       # the handle of the factor the linear solver kept (0: none)
    floor: jax.Array     # ||F||'s rounding floor at x (`rounding_floor`; 0 if converged)
    #: the estimated error of `x` relative to `||x||_inf` after the last
    #: accepted step (`error_estimate`; inf where the last step was rejected),
    #: which the step test holds to `tol`
    error: jax.Array = None


def error_estimate(step, full, fn_old, fn_new, x_new):
    """The step test's measure (see the module docstring): the error of
    `x_new`, reached by the accepted step `step` from an iterate `x` whose
    Newton (Gauss-Newton) step was `full`, where `||F||_inf` was `fn_old`
    (now `fn_new`), relative to `||x_new||_inf`: what the step left of the
    full step, `||full - step||_inf`, plus the next step predicted from
    this one, `||step||_inf min(1, fn_new / fn_old)`. (A damped step leaves
    part of the full one: a Newton step cut by the line search, a
    Levenberg-Marquardt step damped along a direction where `F` changes
    little, whose `||F||` may still fall.) 0 where `F` vanished (so a root
    at 0 passes); NaN never passes."""
    fall = jnp.minimum(1.0, fn_new / jnp.where(fn_old > 0, fn_old, 1.0))
    est = jnp.where(fn_new == 0, 0.0, _norm(full - step) + _norm(step) * fall)
    return _relative(est, x_new).astype(fn_new.dtype)


def rounding_floor(F: Callable, x, fx):
    """The floor of rounding errors of `||F||_inf` near the iterate `x`
    (`fx = F(x)`): how much `F` changes when every element of `x` moves by
    `FLOOR_ULPS` units in its last place, in two sign patterns (one alone
    may cancel in a row), the larger. The root itself is only represented
    to half a unit in each element, and `F` is evaluated with rounding
    errors of the same order (the cancellation of its terms included), so
    no iterate can be expected to make `||F||` much smaller than this.

    Two evaluations of `F`. Elements of `x` that are zero do not move: a
    residual whose scale comes from them alone has a floor of 0."""
    eps = jnp.finfo(x.dtype).eps
    u = (FLOOR_ULPS * eps) * jnp.abs(x)
    sign = jnp.where(jnp.arange(x.shape[0]) % 2 == 0, 1.0, -1.0).astype(x.dtype)
    return jnp.maximum(_norm(F(x + u) - fx), _norm(F(x + u * sign) - fx))


def _finish(F: Callable, x, fx, status, at_floor: bool):
    """`(status, floor)` after the loop: the rounding floor is measured where
    the solve did not converge, and with `at_floor` a solve that stopped
    (stalled, or out of iterations) with `||F||` at it has converged."""
    fn = _norm(fx)
    floor = jax.lax.cond(status == CONVERGED, lambda: jnp.zeros((), fn.dtype),
                         lambda: rounding_floor(F, x, fx).astype(fn.dtype))
    if at_floor:
        stalled = (status == MAXITER) | (status == LINE_SEARCH) | (status == STAGNATION)
        status = jnp.where(stalled & (fn <= floor), CONVERGED, status).astype(jnp.int32)
    return status, floor


def _start(f0, tol: float, atol: float):
    """The residual test's bound (`atol`) and the first status: non-finite,
    converged already (`||F(x0)||_inf <= atol`), or iterating."""
    f0n = _norm(f0)
    goal = jnp.asarray(atol, f0n.dtype)
    status = jnp.where(~jnp.all(jnp.isfinite(f0)), NONFINITE,
                       jnp.where(f0n <= goal, CONVERGED, MAXITER)).astype(jnp.int32)
    return goal, status


def _status(fn_new, goal, slow, error, tol, patience: int = 10):
    """After an accepted step: converged (the residual test, or the step
    test on `error`), stagnated, or still iterating."""
    done = (fn_new <= goal) | (error <= tol)
    return jnp.where(done, CONVERGED,
                     jnp.where(slow >= patience, STAGNATION, MAXITER)).astype(jnp.int32)


def newton(F: Callable, x0, linear: LinearSolve, *, tol: float, atol: float,
           maxiter: int, at_floor: bool = False) -> Result:
    """Newton's method on `F(x) = 0` with a backtracking (Armijo) line search
    on `||F||^2 / 2`: stops at the residual or the step test (see the module
    docstring), or with `at_floor` also when it stalls with `||F||` at its
    rounding floor. With a `chord` linear
    solver, the Jacobian's factorization is kept while each iteration at
    least halves `||F||_inf` (`CHORD_RATE`); an iteration with a kept factor
    whose step fails (singular, or no descent) is retried with a fresh one,
    so only a fresh factor's failure ends the solve."""
    f0 = F(x0)
    goal, status0 = _start(f0, tol, atol)

    def cond(s):
        return (s[3] == MAXITER) & (s[2] < maxiter)

    def body(s):
        x, fx, k, status, slow, aux, fresh, _ = s
        d, ok, aux = linear.solve(x, -fx, aux, fresh)
        phi0 = 0.5 * jnp.vdot(fx, fx).real

        def ls_cond(t):
            alpha, xt, ft, accepted, i = t
            return ~accepted & (i < LINE_SEARCH_STEPS)

        def ls_body(t):
            alpha, _, _, _, i = t
            alpha = jnp.where(i == 0, 1.0, alpha * 0.5)
            xt = x + alpha * d
            ft = F(xt)
            phi = 0.5 * jnp.vdot(ft, ft).real
            accepted = jnp.isfinite(phi) & (phi <= (1.0 - 2.0 * ARMIJO * alpha) * phi0)
            return alpha, xt, ft, accepted, i + 1

        init = (jnp.ones((), x.real.dtype), x, fx, jnp.zeros((), bool), jnp.zeros((), jnp.int32))
        alpha, xt, ft, accepted, _ = jax.lax.while_loop(ls_cond, ls_body, init)
        fn_old, fn_new = _norm(fx), _norm(ft)
        slow = jnp.where(accepted & (fn_new > 0.99 * fn_old), slow + 1, 0)
        error = error_estimate(xt - x, d, fn_old, fn_new, xt)
        new_status = jnp.where(~ok, SINGULAR, jnp.where(~accepted, LINE_SEARCH,
                                                        _status(fn_new, goal, slow, error, tol)))
        keep = ok & accepted
        error = jnp.where(keep, error, jnp.inf).astype(error.dtype)
        if linear.chord:  # a kept factor's failure is retried with a fresh one
            new_status = jnp.where(keep | fresh, new_status, MAXITER).astype(jnp.int32)
            fresh = ~keep | (fn_new > CHORD_RATE * fn_old)
        x = jnp.where(keep, xt, x)
        fx = jnp.where(keep, ft, fx)
        return x, fx, k + 1, new_status, slow, aux, fresh, error

    state = (x0, f0, jnp.zeros((), jnp.int32), status0, jnp.zeros((), jnp.int32),
             jax.tree_util.tree_map(jnp.asarray, linear.init),
             jnp.asarray(not linear.started), jnp.asarray(jnp.inf, x0.real.dtype))
    x, fx, k, status, _, aux, _, error = jax.lax.while_loop(cond, body, state)
    status, floor = _finish(F, x, fx, status, at_floor)
    return Result(x, k, _norm(fx), status, goal, linear.handle(aux), floor, error)


def anderson(G: Callable, x0, *, memory: int, tol: float, atol: float, maxiter: int,
             damping: float = 1.0, at_floor: bool = False) -> Result:
    """Fixed-point iteration `x = G(x)` with Anderson acceleration of depth
    `memory` (0: plain Picard iteration), on the residual `F(x) = G(x) - x`:
    stops when `||F(x)||_inf <= max(atol, tol ||x||_inf)` (the next plain
    step is at most `tol` relative to `x`). The mixing
    coefficients solve a small regularized least-squares problem over the
    last `memory` residual differences (Walker and Ni's type-II form)."""
    n = x0.shape[0]
    m = max(int(memory), 0)
    g0 = G(x0)
    f0 = g0 - x0
    goal, status0 = _start(f0, tol, atol)
    dtype = x0.dtype
    zeros = jnp.zeros((max(m, 1), n), dtype)

    def cond(s):
        return (s[4] == MAXITER) & (s[3] < maxiter)

    def body(s):
        x, g, f, k, status, slow, dF, dG = s
        if m:
            # mixing: minimise ||f - dF^T gamma|| over the stored differences
            count = jnp.minimum(k, m)
            live = (jnp.arange(m) < count)[:, None]
            A = jnp.where(live, dF, 0.0)
            B = jnp.where(live, dG, 0.0)
            gram = A @ A.T.conj()
            reg = 1e-10 * (jnp.trace(gram).real + 1e-300)
            gram = gram + (reg + jnp.where(live[:, 0], 0.0, 1.0)) * jnp.eye(m, dtype=dtype)
            gamma = jnp.linalg.solve(gram, A.conj() @ f)
            x_new = g + (damping - 1.0) * f - (B.T @ gamma) - (damping - 1.0) * (A.T @ gamma)
        else:
            x_new = x + damping * f
        g_new = G(x_new)
        f_new = g_new - x_new
        if m:
            slot = k % m
            dF = dF.at[slot].set(f_new - f)
            dG = dG.at[slot].set(g_new - g)
        fn_old, fn_new = _norm(f), _norm(f_new)
        slow = jnp.where(fn_new > 0.99 * fn_old, slow + 1, 0)
        finite = jnp.all(jnp.isfinite(f_new))
        error = _relative(fn_new, x_new)
        new_status = jnp.where(~finite, NONFINITE, _status(fn_new, goal, slow, error, tol))
        keep = finite
        return (jnp.where(keep, x_new, x), jnp.where(keep, g_new, g),
                jnp.where(keep, f_new, f), k + 1, new_status, slow, dF, dG)

    # (converged at the start where the first plain step is small already)
    status0 = jnp.where((status0 == MAXITER) & (_relative(_norm(f0), x0) <= tol), CONVERGED,
                        status0).astype(jnp.int32)
    state = (x0, g0, f0, jnp.zeros((), jnp.int32), status0, jnp.zeros((), jnp.int32),
             zeros, zeros)
    x, g, f, k, status, _, _, _ = jax.lax.while_loop(cond, body, state)
    status, floor = _finish(lambda x: G(x) - x, x, f, status, at_floor)
    fn = _norm(f)
    return Result(x, k, fn, status, goal, jnp.zeros((), jnp.int32), floor, _relative(fn, x))


def _relative(fn, x):
    """`fn / ||x||_inf` (0 for `fn = 0`; inf for a nonzero `fn` at `x = 0`;
    NaN for a NaN `fn`)."""
    xn = _norm(x)
    return jnp.where(fn == 0, 0.0, fn / jnp.where(xn > 0, xn, jnp.finfo(xn.dtype).tiny))


#: iterations in a row without a 1% fall of `||F||_inf` after which a
#: trust-region method gives up (stagnation; rejected steps count: each
#: shrinks the region, so a region 4^20 times smaller has met a minimum of
#: `||F||` that is not a root)
TRUST_PATIENCE = 20


def _lstsq(a, b):
    """The minimum-norm least-squares solution of `a z = b` (SVD; singular
    values below `eps * max(shape) * s_max` count as zero): a singular `a`
    gives a finite step."""
    u, s, vt = jnp.linalg.svd(a, full_matrices=False)
    cut = jnp.finfo(a.dtype).eps * max(a.shape) * jnp.max(s, initial=0.0)
    inv = jnp.where(s > cut, 1.0 / jnp.where(s > cut, s, 1.0), 0.0)
    return vt.T.conj() @ (inv * (u.T.conj() @ b))


def _gauss_newton(J, r):
    """The Gauss-Newton step `J^+ r`: by LU where `J` is square and regular
    (a pivot above `n eps` of the largest: an eighth of an SVD's cost, which
    at n = 1000 took 0.5 s an iteration), else the minimum-norm least-squares
    solution (`_lstsq`)."""
    n = J.shape[0]
    if J.shape[0] != J.shape[1]:
        return _lstsq(J, r)
    lu, piv = jax.scipy.linalg.lu_factor(J)
    pivots = jnp.abs(jnp.diagonal(lu))
    regular = jnp.min(pivots, initial=jnp.inf) > n * jnp.finfo(pivots.dtype).eps * jnp.max(
        pivots, initial=0.0)
    return jax.lax.cond(regular, lambda: jax.scipy.linalg.lu_solve((lu, piv), r),
                        lambda: _lstsq(J, r))


def _dogleg_step(J, f, delta, gn):
    """Powell's dogleg in the region `||d||_2 <= delta`: the Gauss-Newton step
    `gn` (minimum-norm least squares, so a singular `J` has one) where it
    fits, else along the steepest descent of `||F||^2 / 2` to the Cauchy
    point and on towards the Gauss-Newton step to the region's edge."""
    g = J.T.conj() @ f
    jg = J @ g
    gg = jnp.vdot(g, g).real
    sd = -(gg / jnp.maximum(jnp.vdot(jg, jg).real, jnp.finfo(f.dtype).tiny)) * g
    ngn, nsd = jnp.linalg.norm(gn), jnp.linalg.norm(sd)
    edge = -(delta / jnp.maximum(jnp.sqrt(gg), jnp.finfo(f.dtype).tiny)) * g
    # on the segment sd + t (gn - sd), t in [0, 1], where its norm is delta
    w = gn - sd
    a, b, c = jnp.vdot(w, w).real, 2 * jnp.vdot(sd, w).real, nsd ** 2 - delta ** 2
    t = (-b + jnp.sqrt(jnp.maximum(b * b - 4 * a * c, 0.0))) / jnp.maximum(2 * a, jnp.finfo(
        f.dtype).tiny)
    return jnp.where(ngn <= delta, gn, jnp.where(nsd >= delta, edge, sd + t * w))


def _column_norms(J):
    """The Euclidean norms of `J`'s columns, a zero one taken as 1 (MINPACK's
    `diag`)."""
    c = jnp.sqrt(jnp.sum(jnp.abs(J) ** 2, axis=0)).real
    return jnp.where(c > 0, c, 1.0)


def _lm_step(J, f, mu, scale):
    """Levenberg-Marquardt's step: the least-squares solution of `[J; sqrt(mu)
    D] d = [-f; 0]`, `D = diag(scale)` (MINPACK's `lmder`: the largest norm
    each column of the Jacobian has had, so the damping is invariant to the
    unknowns' units), by QR of the stacked matrix (no normal equations),
    defined for a singular `J` while `mu > 0`."""
    a = jnp.concatenate([J, jnp.sqrt(mu) * jnp.diag(scale).astype(J.dtype)])
    b = jnp.concatenate([-f, jnp.zeros((J.shape[1],), f.dtype)])
    q, r = jnp.linalg.qr(a)
    return jax.scipy.linalg.solve_triangular(r, q.T.conj() @ b)


def trust_region(F: Callable, x0, matrix: Callable, *, step: str, tol: float, atol: float,
                 maxiter: int, at_floor: bool = False) -> Result:
    """A globalized Newton method on `F(x) = 0` with the dense Jacobian
    `matrix(x)`, that a singular Jacobian does not stop: `step="dogleg"`
    (Powell's dogleg in a trust region, as MINPACK's `hybrd`, which SciPy's
    `root(method="hybr")` runs, though with the Jacobian formed at each
    accepted iterate instead of Broyden's updates) or `"lm"`
    (Levenberg-Marquardt, Nielsen's update of the damping `mu`). Each
    iteration compares the decrease of `||F||_2^2 / 2` with the one its
    linear model predicts (`rho`); a step with `rho > 1e-4` is accepted. The
    region (`delta`) grows after a good step (`rho > 3/4`) and shrinks by 4
    after a poor one; `mu` falls after a good step and doubles (then more)
    after a rejected one. Stops with `STAGNATION` after `TRUST_PATIENCE`
    iterations without a 1% fall of `||F||_inf` (a minimum of `||F||` that
    is not a root), `NONFINITE` where the Jacobian or the step is not finite.
    Converged at the residual or the step test (see the module docstring;
    the full step is the Gauss-Newton one, formed at every iteration, and
    the step test is taken only where it solves its linear model in every
    row: not in a rank-deficient Jacobian's null space).
    `Result.nit` counts iterations, rejected steps included."""
    f0 = F(x0)
    goal, status0 = _start(f0, tol, atol)
    J0 = matrix(x0)
    real = x0.real.dtype
    if step == "dogleg":  # MINPACK's first region: 100 ||x0||, or 100
        r0 = 100.0 * jnp.linalg.norm(x0)
        r0 = jnp.where(r0 > 0, r0, 100.0).astype(real)
    else:  # mu0 = 1e-3 max diag(S^T S), S = J D^-1 (Madsen, Nielsen and Tingleff; 1e-3 as
        # the columns of the scaled Jacobian have norm 1 at x0, or 0)
        r0 = jnp.asarray(1e-3, real)

    def cond(s):
        return (s[4] == MAXITER) & (s[3] < maxiter)

    def body(s):
        x, fx, J, k, status, slow, r, nu, _, scale = s
        gn = _gauss_newton(J, -fx)  # (which the step test measures against)
        scale = jnp.maximum(scale, _column_norms(J))
        d = _dogleg_step(J, fx, r, gn) if step == "dogleg" else _lm_step(J, fx, r, scale)
        xt = x + d
        ft = F(xt)
        phi, phit = 0.5 * jnp.vdot(fx, fx).real, 0.5 * jnp.vdot(ft, ft).real
        lin = fx + J @ d
        pred = phi - 0.5 * jnp.vdot(lin, lin).real
        rho = (phi - phit) / jnp.where(pred > 0, pred, 1.0)
        finite = jnp.all(jnp.isfinite(d))
        accepted = finite & jnp.isfinite(phit) & (pred > 0) & (rho > 1e-4)
        nd = jnp.linalg.norm(d)
        if step == "dogleg":
            r_new = jnp.where(~accepted | (rho < 0.25), 0.25 * jnp.minimum(r, nd),
                              jnp.where(rho > 0.75, jnp.maximum(r, 2.0 * nd), r))
            nu_new = nu
        else:
            r_new = jnp.where(accepted,
                              r * jnp.maximum(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3), r * nu)
            nu_new = jnp.where(accepted, 2.0, 2.0 * nu)
        error = error_estimate(d, gn, _norm(fx), _norm(ft), xt)
        # (the Gauss-Newton step measures the error only where it solves its
        # linear model, row by row up to rounding: a rank-deficient J's
        # minimum-norm step leaves the rows of its null space unsolved, and
        # may be tiny far from a root)
        eps = jnp.finfo(real).eps
        unsolved = jnp.abs(fx + J @ gn)
        allowed = 0.5 * jnp.abs(fx) + 8 * x.shape[0] * eps * (jnp.abs(J) @ jnp.abs(gn)
                                                               + jnp.abs(fx))
        solves = jnp.all(unsolved <= allowed)
        error = jnp.where(accepted & solves, error, jnp.inf).astype(real)
        x_new = jnp.where(accepted, xt, x)
        fx_new = jnp.where(accepted, ft, fx)
        J_new = jax.lax.cond(accepted, matrix, lambda x: J, x_new)
        fn_old, fn_new = _norm(fx), _norm(fx_new)
        slow = jnp.where(fn_new > 0.99 * fn_old, slow + 1, 0)
        new_status = jnp.where(
            ~finite | ~jnp.all(jnp.isfinite(J_new)), NONFINITE,
            _status(fn_new, goal, slow, error, tol, TRUST_PATIENCE)).astype(jnp.int32)
        return (x_new, fx_new, J_new, k + 1, new_status, slow, r_new.astype(real),
                nu_new.astype(real), error, scale)

    state = (x0, f0, J0, jnp.zeros((), jnp.int32), status0, jnp.zeros((), jnp.int32), r0,
             jnp.asarray(2.0, real), jnp.asarray(jnp.inf, real), _column_norms(J0))
    x, fx, _, k, status, _, _, _, error, _ = jax.lax.while_loop(cond, body, state)
    status, floor = _finish(F, x, fx, status, at_floor)
    return Result(x, k, _norm(fx), status, goal, jnp.zeros((), jnp.int32), floor, error)
