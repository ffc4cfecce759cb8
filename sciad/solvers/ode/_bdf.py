"""BDF: variable-order (1-5), variable-step backward differentiation in the
quasi-constant step size form with the numerical differentiation formulas'
`kappa` (NDF, Klopfenstein and Shampine; as SciPy's `BDF` and MATLAB's
`ode15s`), as one `jax.lax.while_loop`. Plain JAX, no graph: `ode.odeint`'s
lowering calls `integrate` for the steppers whose `lowering` is "bdf".

The method (Shampine and Reichelt, "The MATLAB ODE suite", 1997; the
layout of SciPy's `scipy/integrate/_ivp/bdf.py`): the backward differences
`D` of the solution at the current step size `h` predict the next state;
a modified Newton iteration solves

    M (d + psi) = c f(t + h, y_pred + d),   c = h / alpha_k

for the correction `d`, with the iteration matrix `M - c J` (`M` the mass
matrix, the identity for an ODE; `J = df/dy`) factored once and reused over
steps: it is factored again where `c` has moved by more than `REFACTOR`
(`REFACTOR_DIRECT` where factoring is cheap) from the factorization's, and
`J` evaluated again (at the predicted state) only where the iteration fails
to converge with a stale one. The local
error `error_const[k] |d|` controls the step; after `k + 1` steps of equal
size the order moves by one where the neighbouring orders' error estimates
promise a longer step. A step size change rescales `D` (`change_D`). Steps
land on every output time (the step is shortened to reach it, `D` rescaled,
and the step size wanted is restored after it).

The iteration matrix is dense (LAPACK's LU through JAX; up to
`_small_lu.SMALL` states, expressions of its entries fused into the loop)
or sparse on the pattern of `df/dy` (colored JVPs for its values): a narrow
band by sciad's banded LU (`_band`), else on the CPU factored by KLU in
the program, the factor kept over steps as a handle in the loop's
state (`_kept_klu`); elsewhere by SuperLU on the host (`_ode._factor`,
`_ode._solve`). The progress over the output times, and the
result, are `_steps`', which the Radau loop shares.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..direct import _band, _small_lu
from . import _kept_klu, _ode
from ._steps import (Counts, Result, Track, advance, blank, finish, inconsistent, mass_of,
                     newton_tolerance, newton_verdict, propose, refactored, released, run,
                     start, values_finite)

MAX_ORDER = 5
#: Newton iterations per attempt (SciPy's NEWTON_MAXITER)
NEWTON_MAXITER = 4
#: the least and most a step may shrink or grow at once
MIN_FACTOR, MAX_FACTOR = 0.2, 10.0
#: the iteration matrix is factored again where `c = h / alpha` has moved
#: by more than this fraction from the factorization's: `REFACTOR` where a
#: factorization costs many solves (KLU's, a large dense LU),
#: `REFACTOR_DIRECT` where it costs a few (`_Linear.direct`: a narrow band, a
#: small dense matrix), which keeps the Newton iterations SciPy's (it
#: factors at every change of `c`): on Robertson's problem 0.3 made 16-28
#: Jacobians against SciPy's 9, as rounding fell, 0.1 makes 9
REFACTOR, REFACTOR_DIRECT = 0.3, 0.1
#: a dense iteration matrix of at most this many unknowns counts as cheap to
#: factor (`_Linear.direct`)
DIRECT_SIZE = 64
#: the NDF's kappa by order (Shampine and Reichelt's), gamma_k = sum 1/j
KAPPA = np.array([0.0, -0.1850, -1.0 / 9.0, -0.0823, -0.0415, 0.0])
GAMMA = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, MAX_ORDER + 1))])
ALPHA = (1.0 - KAPPA) * GAMMA
ERROR_CONST = KAPPA * GAMMA + 1.0 / np.arange(1, MAX_ORDER + 2)
#: the columns of an accepted step's record (`integrate(history=True)`):
#: its order, then the `(MAX_ORDER + 1)^2` matrix that took the differences
#: after the previous accepted step to those the step starts from (the step
#: size changes in between, rejected attempts' included; for the first
#: step, from `[y0, dy/dt(t0), 0, ...]`: the first step size `h0` too)
HISTORY = 1 + (MAX_ORDER + 1) ** 2


def _rms(x):
    return jnp.sqrt(jnp.mean(jnp.square(x))) if x.size else jnp.zeros((), x.dtype)


def _change_matrix(order, factor, dtype):
    """The `(MAX_ORDER + 1)^2` matrix `(R U)^T` that rescales the first
    `order + 1` differences to the step `factor` times the current one (the
    identity past them): SciPy's `compute_R(order, factor)
    compute_R(order, 1)`, each the cumulative product down the rows of
    `M[i, j] = (i - 1 - factor j) / i` (first row ones), whose leading
    `order + 1` block does not depend on the rows past it (the blocks are
    cut out before their product)."""
    k = MAX_ORDER + 1
    i = np.arange(k)[:, None]
    j = np.arange(k)[None, :]

    def R(f):
        M = jnp.where(i == 0, 1.0, (i - 1 - f * j) / jnp.maximum(i, 1)).astype(dtype)
        M = jnp.where((i > 0) & (j == 0), 0.0, M)
        return jnp.cumprod(M, axis=0)

    inside = (i <= order) & (j <= order)
    eye = jnp.eye(k, dtype=dtype)
    RU = jnp.where(inside, R(factor), 0.0) @ jnp.where(inside, R(jnp.asarray(1.0, dtype)), 0.0)
    return jnp.where(inside, RU, eye).T


def change_D(D, order, factor):
    """`D` (differences, `(MAX_ORDER + 3, n)`) for a step `factor` times the
    current one, at `order`."""
    return _rescaled(D, _change_matrix(order, factor, D.dtype))


def _rescaled(D, C):
    """`D` with its first `MAX_ORDER + 1` differences mapped by `C`."""
    return D.at[:MAX_ORDER + 1].set(C @ D[:MAX_ORDER + 1])


class _Linear(NamedTuple):
    """How the iteration matrix `M - c J` is formed, factored and solved."""

    jacobian: Callable   # (t, y) -> J (dense, or values on the pattern)
    factor: Callable     # (J, c) -> factorization
    solve: Callable      # (factorization, b) -> x
    #: (factorization, J, c, need) -> the factorization of `M - c J` where
    #: `need`, the one given elsewhere (None: `factor` in a `lax.cond`;
    #: `_steps.refactored`)
    refactor: Callable | None = None
    #: (factorization, after) -> an int32 zero once the last factorization
    #: is freed (None: nothing to free; `_steps.released`)
    release: Callable | None = None
    #: (factorization, b) -> x with `(M - c J)^T x = b` (the rows' scaling
    #: undone: the discrete adjoint's, `_bdf_adjoint`)
    solve_t: Callable | None = None
    #: a factorization costs a few solves (a narrow band, a small dense
    #: matrix): the discrete adjoint factors each step's own matrix rather
    #: than iterate with a kept one
    direct: bool = False


def _updated(D, d, order):
    """The differences after an accepted step of `order` with correction
    `d`: row `order + 2` is `d - D[order + 1]`, row `order + 1` is `d`, and
    each row `j <= order` is `D[j]` plus the new row `j + 1` (SciPy's
    sums, in its order); the rows above `order + 2` as they were. Row by
    row, each a select of whole rows: one fused pass over `D` (a select of
    all of `D` per row made a copy of it each, seven a step)."""
    acc = jnp.zeros_like(d)
    rows = [None] * D.shape[0]
    for j in range(D.shape[0] - 1, -1, -1):
        acc = jnp.where(j == order + 1, d, jnp.where(j <= order, D[j] + acc, acc))
        rows[j] = jnp.where(j <= order + 1, acc,
                            jnp.where(j == order + 2, d - D[max(j - 1, 0)], D[j]))
    return jnp.stack(rows)


def _row_scale(algebraic, c):
    """The rows of `M - c J` (and of its right-hand sides) scaled by `1 / c`
    where `M` has none (a DAE's algebraic equations, whose rows `-c J` would
    otherwise vanish with the step and their solve lose its accuracy to
    rounding), 1 elsewhere; None for an ODE."""
    if algebraic is None:
        return None
    return jnp.where(algebraic, 1.0 / c, 1.0)


def _scaled(jacobian, factor, solve, **options) -> _Linear:
    """The `_Linear` of factorizations `(*lu, s)` of `S (M - c J)` (`s`: the
    rows' scaling, `_row_scale`, or None) whose `solve(lu, b, transpose)`
    solves with `lu` (`S (M - c J)` or its transpose): `S b` is solved for
    `M - c J`, and the transposed solve's result scaled by `S` (`(S (M - c
    J))^T z = b`, then `(M - c J)^T (S z) = b`)."""
    def forward(lu, b):
        s = lu[-1]
        return solve(lu[:-1], b if s is None else s * b, False)

    def transposed(lu, b):
        s = lu[-1]
        x = solve(lu[:-1], b, True)
        return x if s is None else s * x

    return _Linear(jacobian, factor, forward, solve_t=transposed, **options)


def _dense_linear(field, n, mass, dtype, algebraic=None):
    Mm = jnp.eye(n, dtype=dtype) if mass is None else jnp.asarray(mass, dtype)

    def jacobian(t, y):
        return jax.jacfwd(lambda z: field(t, z))(y)

    def factor(J, c):
        s = _row_scale(algebraic, c)
        A = Mm - c * J
        return _small_lu.lu_factor(A if s is None else s[:, None] * A), s

    return _scaled(jacobian, factor,
                   lambda lu, b, t: _small_lu.lu_solve(lu[0], b, trans=int(t)),
                   direct=n <= DIRECT_SIZE)


def _sparse_linear(field, pattern, mass_values, algebraic=None, dtype=None):
    """The iteration matrix on `pattern` (with its diagonal; its values by
    colored JVPs): where the pattern is a narrow band, factored by the banded
    LU in the program (`_band`: its factor two arrays); else by KLU in the
    program and kept over steps as a handle (`_kept_klu`) where it can, else
    by SuperLU on the host (the factorization a handle into `_ode`'s store)."""
    pattern = _ode._with_diagonal(pattern)
    eye = _ode._structure(pattern)[2]
    from ..nonlinear._nonlinear import colored_values
    from .._coloring import coloring

    colors = coloring(pattern)
    rows = np.asarray(pattern.rows)

    def jacobian(t, y):
        return colored_values(lambda z: field(t, z), pattern, colors)(y)

    def values_of(J, c):
        M = jnp.asarray(eye, J.dtype) if mass_values is None else mass_values
        values = M - c * J
        s = _row_scale(algebraic, c)
        if s is not None:
            values = values * s[rows]
        return values, s

    band = _band.Band.of(pattern) if dtype is not None and _band.usable(dtype) else None
    if band is not None:  # (a narrow band: its LU, two arrays the loop keeps)
        def factor(J, c):
            values, s = values_of(J, c)
            return band.factor(values), s

        return _scaled(jacobian, factor, lambda lu, b, t: band.solve(lu[0], b, int(t)),
                       direct=True)

    if dtype is not None and _kept_klu.usable(dtype):
        def factor(J, c):  # (the start: no factor yet, `refactor` makes it)
            values, s = values_of(J, c)
            return values, _kept_klu.none(), s

        def refactor(lu, J, c, need):
            values, s = values_of(J, c)
            handle = _kept_klu.swap(pattern, need, lu[1], values)
            keep = lambda new, old: None if new is None else jnp.where(need, new, old)  # noqa: E731
            return keep(values, lu[0]), handle, keep(s, lu[2])

        def solve(lu, b, transpose):
            values, handle = lu
            return _kept_klu.solve(pattern, handle, values, b.astype(values.dtype), transpose)

        return _scaled(jacobian, factor, solve, refactor=refactor,
                       release=lambda lu, after: _kept_klu.release(lu[1], after))

    def factor(J, c):
        values, s = values_of(J, c)
        return values, _ode._factor(pattern, values), s

    def solve(lu, b, transpose):
        values, handle = lu
        return _ode._solve(pattern, handle, values, b.astype(values.dtype), transpose, False)

    return _scaled(jacobian, factor, solve)


def iteration(field, n: int, dtype, rtol: float, jac: str, pattern, mass):
    """`(M, linear, newton_tol)` of a loop whose iteration matrix is `M - c J`
    (BDF's, the ESDIRK methods'): the mass matrix's `Mass` (None: the
    identity), the `_Linear` that forms, factors and solves the matrix
    (dense, or sparse on `pattern`), and the Newton iteration's tolerance
    for `rtol` (SciPy's)."""
    M = mass_of(mass, jac, pattern, n, dtype)
    algebraic = None if M is None else M.algebraic
    linear = _sparse_linear(field, pattern, mass, algebraic, dtype) if jac == "sparse" else \
        _dense_linear(field, n, mass, dtype, algebraic)
    return M, linear, newton_tolerance(rtol, float(np.finfo(dtype).eps))


def initial_step(field, t0, y0, f0, span, rtol, atol, m, order=1, deriv=None):
    """SciPy's `select_initial_step` (Hairer, Norsett and Wanner's
    algorithm) for a method of `order`, over the first `m` elements;
    `deriv`: `dy/dt` from the field's value (a mass matrix's; None: the
    field is `dy/dt`)."""
    deriv = deriv or (lambda f: f)
    scale = atol + jnp.abs(y0[:m]) * rtol
    yp0 = deriv(f0)
    d0, d1 = _rms(y0[:m] / scale), _rms(yp0[:m] / scale)
    h0 = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / d1)
    h0 = jnp.minimum(h0, span)
    yp1 = deriv(field(t0 + h0, y0 + h0 * yp0))
    d2 = _rms((yp1[:m] - yp0[:m]) / scale) / h0
    h1 = jnp.where((d1 <= 1e-15) & (d2 <= 1e-15), jnp.maximum(1e-6, h0 * 1e-3),
                   (0.01 / jnp.maximum(d1, d2)) ** (1.0 / (order + 1)))
    h = jnp.minimum(jnp.minimum(100 * h0, h1), span)
    # at least a step that moves t by a few hundred of its floating-point
    # spacings (a tiny atol on a fast component asks for less, which t
    # far from 0, as where an adjoint integrates backwards from a late time,
    # cannot represent), within the span
    spacing = jnp.abs(jnp.nextafter(t0, jnp.asarray(jnp.inf, t0.dtype)) - t0)
    return jnp.minimum(jnp.maximum(h, 10 * _ode.MIN_STEP_ULPS * spacing), span)


class _State(NamedTuple):
    tr: Track           # the progress over the output times
    D: jax.Array
    h_D: jax.Array      # the step size D's differences are at
    h_want: jax.Array   # the step size the control asks for next
    order: jax.Array
    equal: jax.Array    # steps taken at this step size and order
    J: jax.Array
    J_fresh: jax.Array  # J is the Jacobian at the last failed attempt's prediction
    lu: object
    lu_c: jax.Array     # the c the factorization is of (nan: none)
    counts: Counts
    R: jax.Array        # the rescaling of D since the last accepted step


def integrate(field: Callable, y0, ts, *, rtol: float, atol: float, max_steps: int,
              m: int | None = None, jac: str = "dense", pattern=None, dt0=None, dtmax=None,
              record: bool = True, dense: bool = False, mass=None,
              history: bool = False) -> Result:
    """Integrates `M dy/dt = field(t, y)` from `y(ts[0]) = y0` with BDF
    (see the module docstring); `ts` increasing (checked by the caller).
    `m`: the error control reads the first `m` elements (all: None).
    `mass`: None (the identity), a dense `(n, n)` matrix, or (with
    `jac="sparse"`) its values on `pattern`. `history` (with `dense`):
    each accepted step's order and rescaling of the differences (`HISTORY`
    columns, `Result.history`), which the discrete adjoint reads."""
    n = y0.shape[0]
    m = n if m is None else m
    dtype = y0.dtype
    t0, t_end = ts[0], ts[-1]
    M, linear, newton_tol = iteration(field, n, dtype, rtol, jac, pattern, mass)
    apply_mass = (lambda v: v) if M is None else M.apply
    refactor_tol = REFACTOR_DIRECT if linear.direct else REFACTOR
    alpha, gamma, error_const = (jnp.asarray(a, dtype) for a in (ALPHA, GAMMA, ERROR_CONST))
    max_step = jnp.inf if dtmax is None else float(dtmax)

    f0 = field(t0, y0)
    deriv = None if M is None else M.derivative
    if dt0 is None:
        h0 = initial_step(field, t0, y0, f0, t_end - t0, rtol, atol, m, deriv=deriv)
    else:
        h0 = jnp.asarray(dt0, dtype)
    h0 = jnp.minimum(h0, max_step).astype(dtype)
    D = jnp.zeros((MAX_ORDER + 3, n), dtype).at[0].set(y0)
    D = D.at[1].set((f0 if deriv is None else deriv(f0)) * h0)
    J0 = linear.jacobian(t0, y0)
    lu0 = linear.factor(J0, jnp.asarray(0.0, dtype))
    s0 = _State(tr=start(t0, ts, inconsistent(M, f0, y0, rtol)),
                D=D, h_D=h0, h_want=h0,
                order=jnp.asarray(1, jnp.int32),
                equal=jnp.asarray(0, jnp.int32), J=J0, J_fresh=jnp.asarray(True),
                lu=lu0, lu_c=jnp.asarray(jnp.nan, dtype),
                counts=Counts(*(jnp.asarray(k, jnp.int32) for k in (
                    2 if dt0 is None else 1, 1, 0))),
                # (D starts as diag(1, h0, 1, ...) [y0, dy/dt(t0), 0, ...])
                R=jnp.eye(MAX_ORDER + 1, dtype=dtype).at[1, 1].set(h0))
    rec0 = blank(t0, y0, ts, max_steps, record, dense, HISTORY if history else 0)

    def newton(t_new, y_pred, c, psi, lu, weight):
        """The modified Newton iteration: `(converged, iterations, y, d,
        evaluations)`."""
        def cond(s):
            k, _, _, _, done, failed = s[:6]
            return (k < NEWTON_MAXITER) & ~done & ~failed

        def body(s):
            k, y, d, old, done, failed, nf = s
            f = field(t_new, y)
            finite = values_finite(f, m)
            dy = linear.solve(lu, c * f - apply_mass(psi + d))
            # (measured on the first m elements, as the error: a sensitivity
            # system's iterations then stop where its primal's do, so it
            # takes the primal's steps)
            size = _rms((dy * weight)[:m])
            bad, ok = newton_verdict(k, size, size / old, finite, tol=newton_tol,
                                     maxiter=NEWTON_MAXITER)
            y2, d2 = jnp.where(bad, y, y + dy), jnp.where(bad, d, d + dy)
            return k + 1, y2, d2, size, ok, bad, nf + 1

        k, y, d, _, done, _, nf = jax.lax.while_loop(
            cond, body, (jnp.asarray(0, jnp.int32), y_pred, jnp.zeros_like(y_pred),
                         jnp.asarray(jnp.inf, dtype), jnp.asarray(False), jnp.asarray(False),
                         jnp.asarray(0, jnp.int32)))
        return done, k, y, d, nf

    def attempt(s: _State):
        live = s.tr.status < 0  # (False only for a batch's finished example)
        t_new, h, land = propose(s.tr, ts, s.h_want, max_step)
        moved = h != s.h_D

        def rescale():  # (and the rescaling since the last accepted step, recorded)
            C = _change_matrix(s.order, h / s.h_D, dtype)
            return _rescaled(s.D, C), C @ s.R

        D, R = jax.lax.cond(moved, rescale, lambda: (s.D, s.R))
        equal = jnp.where(moved, 0, s.equal)
        order = s.order
        # (y_pred's sum unrolled, an elementwise pass XLA fuses, and psi's
        # weights on all of D's rows: a masked D and a slice of it were two
        # more copies of it a step. psi stays a product, a library call,
        # not multiply-adds that a fusion may contract or not: a DAE's
        # gradient read rounding differences in it between programs)
        y_pred = D[0]
        for j in range(1, MAX_ORDER + 1):
            y_pred = y_pred + jnp.where(j <= order, D[j], 0.0)
        g = jnp.where((jnp.arange(MAX_ORDER + 3) >= 1) & (jnp.arange(MAX_ORDER + 3) <= order),
                      jnp.concatenate([gamma, jnp.zeros(2, dtype)]), 0.0)
        psi = (g @ D) / alpha[order]
        # (the error weights' reciprocals once: a multiply per element, where
        # a division in each iteration's norm was most of its time)
        weight = 1.0 / (atol + rtol * jnp.abs(y_pred))
        c = h / alpha[order]

        # up to two passes: with the kept Jacobian, then (where that failed
        # and it was stale) with one at the prediction
        def pass_cond(p):
            k, done, fresh = p[0], p[1], p[3]
            return (k == 0) | ((k == 1) & ~done & ~fresh)

        def pass_body(p):
            k, _, J, fresh, lu, lu_c, _, _, _, counts = p
            renew = k > 0
            J = jax.lax.cond(renew, lambda: linear.jacobian(t_new, y_pred), lambda: J)
            fresh = fresh | renew
            refactor = renew | ~(jnp.abs(c - lu_c) <= refactor_tol * jnp.abs(c))
            lu = refactored(linear, lu, J, c, refactor & live & pass_cond(p))
            lu_c = jnp.where(refactor, c, lu_c)
            done, iters, y, d, nf = newton(t_new, y_pred, c, psi, lu, weight)
            counts = Counts(counts.nfev + nf, counts.njev + renew.astype(jnp.int32),
                            counts.nlu + refactor.astype(jnp.int32))
            return k + 1, done, J, fresh, lu, lu_c, iters, y, d, counts

        zero = jnp.zeros_like(y_pred)
        _, converged, J, fresh, lu, lu_c, iters, y_new, d, counts = jax.lax.while_loop(
            pass_cond, pass_body, (jnp.asarray(0, jnp.int32), jnp.asarray(False), s.J,
                                   s.J_fresh, s.lu, s.lu_c, jnp.asarray(0, jnp.int32),
                                   y_pred, zero, s.counts))
        safety = 0.9 * (2 * NEWTON_MAXITER + 1) / (2 * NEWTON_MAXITER + iters)
        weight = 1.0 / (atol + rtol * jnp.abs(y_new))
        error_norm = _rms((error_const[order] * d * weight)[:m])
        accept = converged & (error_norm <= 1)
        # rejected: half the step where Newton failed, else by the error
        shrink = jnp.where(converged,
                           jnp.maximum(MIN_FACTOR, safety * error_norm ** (-1.0 / (order + 1))),
                           0.5)

        # accepted: the differences updated, the next order and step
        D_new = _updated(D, d, order)
        equal_new = equal + 1
        ready = equal_new >= order + 1
        em = jnp.where(order > 1, _rms((error_const[order - 1] * D_new[order] * weight)[:m]),
                       jnp.inf)
        ep = jnp.where(order < MAX_ORDER,
                       _rms((error_const[order + 1] * D_new[order + 2] * weight)[:m]), jnp.inf)
        norms = jnp.stack([em, error_norm, ep])
        powers = -1.0 / (order + jnp.arange(3, dtype=dtype))
        factors = jnp.where(norms > 0, norms ** powers, jnp.inf)
        best = jnp.argmax(factors)
        new_order = jnp.where(ready, order + best.astype(jnp.int32) - 1, order)
        grow = jnp.where(ready, jnp.minimum(MAX_FACTOR, safety * jnp.max(factors)), 1.0)

        h_want = jnp.where(accept, h * grow, h * shrink)
        row = jnp.concatenate([order.astype(dtype)[None], R.reshape(-1)]) if history else None
        tr, taken = advance(s.tr, ts, accept=accept, land=land, t_new=t_new, y_new=y_new, h=h,
                            h_want=h_want, max_steps=max_steps, row=row)
        return _State(
            tr=tr, D=jnp.where(accept, D_new, D), h_D=h,
            h_want=h_want, order=jnp.where(accept, new_order, order),
            equal=jnp.where(accept, jnp.where(ready, 0, equal_new), 0),
            J=J, J_fresh=jnp.where(accept, False, fresh), lu=lu, lu_c=lu_c, counts=counts,
            R=jnp.where(accept, jnp.eye(MAX_ORDER + 1, dtype=dtype), R)), taken

    end, rec = run(attempt, s0, rec0, y0, record=record, dense=dense)
    # (the status, which the result is judged by, waits for the last free)
    end = end._replace(tr=end.tr._replace(
        status=end.tr.status + released(linear, end.lu, after=[end.tr, rec, end.D])))
    return finish(end.tr, rec, ts, end.D[0], m, end.counts, record, dense)
