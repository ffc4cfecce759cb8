"""ESDIRK methods with a mass matrix: a stiffly accurate, singly diagonally
implicit Runge-Kutta tableau with an explicit first stage and an embedded
error estimate (Kvaerno's methods of orders 3, 4 and 5) stepping
`M dy/dt = f(t, y)`, `M` constant and possibly singular (semi-explicit
index-1 DAEs), as one `jax.lax.while_loop`. Plain JAX, no graph:
`ode.odeint`'s lowering calls `integrate` for an ESDIRK stepper given a mass
matrix (without one, diffrax steps the same tableau).

The stages are written in the field's values `F_j = f(t + c_j h, Y_j)`,
never in slopes `dy/dt` (which a singular `M` does not give):

    M (Y_i - y) = h sum_{j < i} a_ij F_j + h gamma F_i,

the first stage `Y_1 = y` (`F_1 = f(t, y)`, the previous step's last, as
the method is first-same-as-last), each later one solved by a simplified
Newton iteration with the iteration matrix `M - h gamma J`, shared by the
stages (one diagonal `gamma`), kept over steps and factored again only
where `h gamma` has moved by more than `_bdf.REFACTOR`, with `J` evaluated
again (at the step's end, predicted) only where the iteration fails with
the kept one. The step's result is its last stage (stiffly accurate: it satisfies
the algebraic equations). A solved stage's `F_i` is read from its equation,
`(M (Y_i - y) - h sum_{j<i} a_ij F_j) / (h gamma)` (no evaluation, and no
amplification of the Newton iteration's error by the field's stiffness).

The error estimate is the embedded method's difference `M (y_new - y_hat) =
h sum_j (b_j - b_hat_j) F_j`, filtered as Hairer and Wanner's RADAU5
filters its own: `err = (M - h gamma J)^{-1} h sum_j e_j F_j`, defined for a
singular `M` (the algebraic variables' error is that the algebraic
equations' linearisation gives the differential ones') and damping the
stiff components' overestimate. The step-size control is the elementary
one with the embedded order's exponent; a step size change of at most 20%
up is held (RADAU5's `quot2`), keeping the factorization.

The iteration matrix is `_bdf`'s (`_dense_linear`, `_sparse_linear`: the
same `M - c J`, the algebraic rows scaled by `1 / c`), the progress over
the output times, the Newton iteration's verdict and the result `_steps`'.
The discrete adjoint replays the steps
(`sciad.primitives._ode_replay.esdirk_mass_step`)."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _bdf
from ._steps import (Counts, Result, Track, advance, blank, finish, inconsistent,
                     newton_verdict, propose, refactored, released, run, start,
                     values_finite)

#: simplified Newton iterations per stage, and a correction's rounding
#: floor, in units of `eps` times the iterate's largest element
NEWTON_MAXITER, FLOOR_EPS = 6, 4.0
#: the step-size control: the least and most a step may shrink or grow at
#: once, its safety factor, and the growth under which the step is held
MIN_FACTOR, MAX_FACTOR, SAFETY, HOLD = 0.2, 10.0, 0.9, 1.2


def check_tableau(c, A, b, e):
    """Refuses a tableau this loop cannot step with a mass matrix (a
    programming error: `Stepper.takes_mass` names the methods)."""
    s = len(b)
    if not (c[0] == 0.0 and np.all(A[0] == 0.0) and np.allclose(A[-1], b) and c[-1] == 1.0
            and np.all(np.diag(A)[1:] == A[1, 1]) and A[1, 1] > 0 and len(e) == s
            and np.allclose(np.triu(A, 1), 0.0)):
        raise ValueError("an ESDIRK tableau with a mass matrix must be stiffly accurate, "
                         "with an explicit first stage, one diagonal and an embedded "
                         "estimate.")


class _State(NamedTuple):
    tr: Track           # the progress over the output times
    y: jax.Array        # the state at tr.t
    f: jax.Array        # f(t, y) there (the next step's first stage)
    v: jax.Array        # dy/dt's estimate there: the stages' predictor
    h_want: jax.Array   # the step size the control asks for next
    J: jax.Array
    lu: object
    lu_c: jax.Array     # the h gamma the factorization is of (nan: none)
    counts: Counts


def integrate(field: Callable, y0, ts, *, tableau, order: int, rtol: float, atol: float,
              max_steps: int, m: int | None = None, jac: str = "dense", pattern=None, dt0=None,
              dtmax=None, record: bool = True, dense: bool = False, mass=None) -> Result:
    """Integrates `M dy/dt = field(t, y)` from `y(ts[0]) = y0` with the ESDIRK
    `tableau` `(c, A, b, e)` of `order` (`e = b - b_hat`, the embedded
    method of `order - 1`; see the module docstring); `ts` increasing
    (checked by the caller). `m`: the error control reads the first `m`
    elements (all: None). `mass`: a dense `(n, n)` matrix, or (with
    `jac="sparse"`) its values on `pattern`, or None (the identity)."""
    c, A, b, e = (np.asarray(x, np.float64) for x in tableau)
    check_tableau(c, A, b, e)
    s = len(b)
    gamma = float(A[1, 1])
    n = y0.shape[0]
    m = n if m is None else m
    dtype = y0.dtype
    eps = float(np.finfo(dtype).eps)
    t0, t_end = ts[0], ts[-1]
    M, linear, newton_tol = _bdf.iteration(field, n, dtype, rtol, jac, pattern, mass)
    apply_mass = (lambda v: v) if M is None else M.apply
    deriv = None if M is None else M.derivative
    strict = jnp.asarray(np.tril(A, -1), dtype)  # (the known stages' weights, row by row)
    cs, es = jnp.asarray(c, dtype), jnp.asarray(e, dtype)
    max_step = jnp.inf if dtmax is None else float(dtmax)

    f0 = field(t0, y0)
    if dt0 is None:
        h0 = _bdf.initial_step(field, t0, y0, f0, t_end - t0, rtol, atol, m, order=order - 1,
                               deriv=deriv)
    else:
        h0 = jnp.asarray(dt0, dtype)
    h0 = jnp.minimum(h0, max_step).astype(dtype)
    J0 = linear.jacobian(t0, y0)
    s0 = _State(tr=start(t0, ts, inconsistent(M, f0, y0, rtol)), y=y0, f=f0,
                v=f0 if deriv is None else deriv(f0), h_want=h0, J=J0,
                lu=linear.factor(J0, jnp.asarray(0.0, dtype)),
                lu_c=jnp.asarray(jnp.nan, dtype),
                counts=Counts(*(jnp.asarray(k, jnp.int32) for k in (
                    2 if dt0 is None else 1, 1, 0))))
    rec0 = blank(t0, y0, ts, max_steps, record, dense)

    def newton(ti, y, z0, known, hg, lu, scale):
        """A stage's simplified Newton iteration for `M (z - y) - known -
        hg f(ti, z) = 0`: `(converged, z, evaluations)`."""
        def cond(st):
            k, _, _, done, failed, _ = st
            return (k < NEWTON_MAXITER) & ~done & ~failed

        def body(st):
            k, z, old, done, failed, nf = st
            f = field(ti, z)
            dz = linear.solve(lu, hg * f + known - apply_mass(z - y))
            size = _bdf._rms((dz / scale)[:m])
            # (a correction at the rounding floor of the iterate's largest
            # element has converged: a DAE's algebraic variable near 0 with a
            # tight atol is solved from equations of O(1) terms, whose
            # rounding no iteration removes)
            floor = _bdf._rms((FLOOR_EPS * eps * jnp.max(jnp.abs(z)) / scale)[:m])
            bad, ok = newton_verdict(k, size, size / old, values_finite(f, m),
                                     tol=newton_tol, maxiter=NEWTON_MAXITER, floor=floor)
            return k + 1, jnp.where(bad, z, z + dz), size, ok, bad, nf + 1

        _, z, _, done, _, nf = jax.lax.while_loop(
            cond, body, (jnp.asarray(0, jnp.int32), z0, jnp.asarray(jnp.inf, dtype),
                         jnp.asarray(False), jnp.asarray(False), jnp.asarray(0, jnp.int32)))
        return done, z, nf

    def stages(st: _State, t, h, lu):
        """The implicit stages, in turn, until one fails: `(solved, F, y_new,
        evaluations)`; `F`: the field's values at the stages."""
        hg = h * gamma
        scale = atol + rtol * jnp.abs(st.y)
        F0 = jnp.zeros((s, n), dtype).at[0].set(st.f)

        def cond(x):
            i, ok = x[0], x[1]
            return (i < s) & ok

        def body(x):
            i, _, F, z, nf = x
            known = h * (strict[i] @ F)
            # (predicted along dy/dt's estimate at the start for the first
            # implicit stage, then along the previous stage's increment)
            z0 = jnp.where(i == 1, st.y + (cs[i] * h) * st.v,
                           st.y + (cs[i] / cs[jnp.maximum(i - 1, 1)]) * (z - st.y))
            done, z, k = newton(t + cs[i] * h, st.y, z0, known, hg, lu, scale)
            Fi = (apply_mass(z - st.y) - known) / hg
            return i + 1, done, F.at[i].set(Fi), z, nf + k

        _, ok, F, z, nf = jax.lax.while_loop(
            cond, body, (jnp.asarray(1, jnp.int32), jnp.asarray(True), F0, st.y,
                         jnp.asarray(0, jnp.int32)))
        return ok, F, z, nf

    def attempt(st: _State):
        live = st.tr.status < 0  # (False only for a batch's finished example)
        t_new, h, land = propose(st.tr, ts, st.h_want, max_step)
        hg = h * gamma

        # up to two passes: with the kept Jacobian, then (where that failed)
        # with one at this step's end predicted along dy/dt's estimate. (The
        # start's can be far from the stages': Robertson's at y = (1, 0, 0)
        # has none of the reactions' rates, and with it the first step's
        # stages converged at a rate of 0.14 and failed at every step size
        # where the tolerance is tight. One renewed for a longer step and
        # kept over the shorter ones tried after it failed them all where
        # an algebraic equation's derivative moved, as `z^2 = 1 - t`'s: its
        # rows do not shrink with the step.)
        def pass_cond(p):
            return (p[0] == 0) | ((p[0] == 1) & ~p[1])

        def pass_body(p):
            k, _, J, lu, lu_c, _, _, counts = p
            renew = k > 0
            J = jax.lax.cond(renew, lambda: linear.jacobian(t_new, st.y + h * st.v),
                             lambda: J)
            refactor = renew | ~(jnp.abs(hg - lu_c) <= _bdf.REFACTOR * jnp.abs(hg))
            lu = refactored(linear, lu, J, hg, refactor & live & pass_cond(p))
            lu_c = jnp.where(refactor, hg, lu_c)
            done, F, z, nf = stages(st, st.tr.t, h, lu)
            counts = Counts(counts.nfev + nf, counts.njev + renew.astype(jnp.int32),
                            counts.nlu + refactor.astype(jnp.int32))
            return k + 1, done, J, lu, lu_c, F, z, counts

        _, converged, J, lu, lu_c, F, y_new, counts = jax.lax.while_loop(
            pass_cond, pass_body, (jnp.asarray(0, jnp.int32), jnp.asarray(False), st.J,
                                   st.lu, st.lu_c, jnp.zeros((s, n), dtype),
                                   st.y, st.counts))
        err = linear.solve(lu, h * (es @ F))
        scale = atol + rtol * jnp.maximum(jnp.abs(st.y), jnp.abs(y_new))
        error_norm = _bdf._rms((err / scale)[:m])
        accept = converged & (error_norm <= 1)
        factor = jnp.where(error_norm > 0, SAFETY * error_norm ** (-1.0 / order), MAX_FACTOR)
        factor = jnp.clip(factor, MIN_FACTOR, MAX_FACTOR)
        factor = jnp.where(accept & (factor >= 1.0) & (factor <= HOLD), 1.0, factor)
        # rejected: half the step where the stages failed, else by the error
        h_want = jnp.where(converged, h * jnp.where(accept, factor, jnp.minimum(factor, 1.0)),
                           0.5 * h)
        tr, taken = advance(st.tr, ts, accept=accept, land=land, t_new=t_new, y_new=y_new,
                            h=h, h_want=h_want, max_steps=max_steps)
        return _State(tr=tr, y=jnp.where(accept, y_new, st.y),
                      f=jnp.where(accept, F[s - 1], st.f),
                      v=jnp.where(accept, (y_new - st.y) / h, st.v), h_want=h_want,
                      J=J, lu=lu, lu_c=lu_c,
                      counts=counts), taken

    end, rec = run(attempt, s0, rec0, y0, record=record, dense=dense)
    # (the status, which the result is judged by, waits for the last free)
    end = end._replace(tr=end.tr._replace(
        status=end.tr.status + released(linear, end.lu, after=[end.tr, rec, end.y])))
    return finish(end.tr, rec, ts, end.y, m, end.counts, record, dense)
