"""The discrete adjoint of Radau IIA's accepted steps (`_radau`), as one
JAX loop down the steps, with the forward loop's linear algebra: its real
and complex iteration matrices, factored (by KLU, kept over steps, on the
CPU) only where the step size changes or the Jacobian is evaluated again.
Plain JAX: `sciad.primitives._ode_radau_adjoint` lowers to it.

A step from `(t, y)` of size `h` solves its stage increments `Z` (`3 n`)
from the collocation system, premultiplied by `A^-1`,

    G(Z) = (A^-1 (x) M) Z / h - F(Z) = 0,   F_j = f(t + c_j h, y + Z_j),

and takes `y + Z_3`. Its derivative is `dZ = G_Z^-1 (F_y dy + F_p dp)`
with `G_Z = (A^-1 (x) M) / h - diag(J_j)`, the field's Jacobian `J_j` at
each stage, so the reverse pass maps the cotangent `lam` of the step's
result by

    G_Z^T mu = (0, 0, lam),   ybar = lam + sum_j J_j^T mu_j,
    pbar += sum_j (df/dp)_j^T mu_j

(one VJP of the three stages' field). `G_Z` is not the forward loop's
iteration matrix: that one, `P = (A^-1 (x) M) / h - I (x) J0` with one
Jacobian `J0` for the three stages, is block-diagonal in the variables `W
= T^-1 Z` (one real and one complex system, `_radau`'s factorizations).
The transposed system is solved by the iteration preconditioned with it,

    mu <- mu + P^-T ((0, 0, lam) - G_Z^T mu),

which converges as the forward's simplified Newton iteration does (its
rate is that of `P^-1 (G_Z - P)`: `h` times the stages' Jacobians' spread),
to `ADJOINT_RTOL`. The stages themselves are solved again, from the cubic
Hermite interpolant between the step's recorded ends (the line between
them with a mass matrix), by the forward's simplified Newton iteration to
`STAGE_TOL`, far below the forward's tolerance: the pass is linearised at
the stages of the recorded states, as `_ode_replay.radau_step` replays
them. Where either iteration fails or is slow, the step is done again with
the Jacobian at the step's start, factored afresh (RADAU5's rule); a step
whose second try fails stops the pass with status 5.

The Jacobian and the factorizations are carried down the steps: the
factorizations are made again only where `h` changes (the forward loop held
its step sizes, so it mostly refactors where the forward did) or a step
asked for a fresh Jacobian.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _radau
from ._bdf import _rms
from ._steps import mass_of, refactored, released

#: the stages' re-solved Newton tolerance, in units of the forward's error
#: scale `atol + rtol |y|` (the forward stops near 0.03; an iterate within
#: the forward's tolerance, or whose residual is at its rounding floor, as
#: on Robertson's long steps, is accepted where the iteration stalls)
STAGE_TOL = 1e-4
NEWTON_MAXITER = 10
#: the transposed stage system's iteration: converged where its last
#: correction is this fraction of its solution; its most iterations, and
#: the rate above which the step is tried again (`robust`)
ADJOINT_RTOL, ADJOINT_MAXITER, SLOW_RATE = 1e-9, 40, 0.3
#: a step whose iterations converged slower than this asks the next one for
#: a fresh Jacobian (as the forward's `renew_jac`)
RENEW_RATE = 1e-2
#: the second try's Newton-Krylov iteration: its most Newton steps, each
#: GMRES's relative tolerance, restart length and most restarts; and the
#: transposed solve's accepted residual, relative to its terms
KRYLOV_NEWTON_MAXITER, KRYLOV_STEP_RTOL, KRYLOV_RESTART, KRYLOV_RESTARTS = 20, 1e-6, 30, 10
KRYLOV_RESIDUAL = 1e-7
#: a dense system of at most this many stage unknowns (`3 n`) is solved
#: directly instead: Newton with the exact stage Jacobian, and the
#: transposed system, by LU of the `3 n` matrix (as cheap as the split's
#: factorizations there, and no iteration to stall)
DIRECT_SIZE = 48
#: how far (units in the last place) `_at_floor` moves the stages
FLOOR_ULPS = 4.0
#: the pass's status where a step failed twice (as `ode.odeint`'s solver
#: failure), and where it failed on values that are not finite (a
#: derivative of the field: as `ode.odeint`'s NaN state)
FAILED, NONFINITE = 5, 3


def hermite_stages(y0, y1, f0, f1, h):
    """The stage increments `(3, n)` on the cubic Hermite interpolant between
    `(y0, f0)` and `(y1, f1)` (`h` apart), at Radau's nodes."""
    c = jnp.asarray(_radau.C, y0.dtype)[:, None]
    h00, h10 = 2 * c ** 3 - 3 * c ** 2 + 1, c ** 3 - 2 * c ** 2 + c
    h01, h11 = -2 * c ** 3 + 3 * c ** 2, c ** 3 - c ** 2
    return (h00 - 1) * y0 + h10 * h * f0 + h01 * y1 + h11 * h * f1


class _Stages:
    """A step's collocation system and its preconditioner, in JAX: `G(Z)`,
    `G_Z^T mu`, and `P^-1`, `P^-T` with the factorizations `lus` (see the
    module docstring)."""

    def __init__(self, field, consts, linear, mass, lus, t, h, y):
        _, _, T, TI, _ = _radau.constants()
        dtype = y.dtype
        self.field, self.consts, self.linear, self.lus = field, consts, linear, lus
        self.t, self.h, self.y = t, h, y
        self.apply_mass = (lambda v: v) if mass is None else mass.apply
        self.apply_mass_t = (lambda v: v) if mass is None else mass.apply_t
        self.C, self.T, self.TI = (jnp.asarray(a, dtype) for a in (_radau.C, T, TI))
        self.Ainv = jnp.asarray(np.linalg.inv(_radau.A), dtype)

    def fields(self, cs, y, Z):
        """`F_j = f(t + c_j h, y + Z_j)`, `(3, n)`."""
        return jax.vmap(lambda c, z: self.field(cs, self.t + c * self.h, y + z))(self.C, Z)

    def residual(self, Z):
        """`G(Z) = (A^-1 (x) M) Z / h - F(Z)`."""
        return self.Ainv @ jax.vmap(self.apply_mass)(Z) / self.h - \
            self.fields(self.consts, self.y, Z)

    def _solve(self, v, transpose: bool):
        # P^-1 v = (T (x) I) K^-1 (T^-1 (x) I) v; P^-T v = (T^-T (x) I) K^-T (T^T (x) I) v
        lin, dtype = self.linear, v.dtype
        u = (self.T.T if transpose else self.TI) @ v
        if transpose:
            x0 = lin.solve_real_t(self.lus[0], u[0])
            xc = lin.solve_complex_h(self.lus[1], u[1] + 1j * u[2])
        else:
            x0 = lin.solve_real(self.lus[0], u[0])
            xc = lin.solve_complex(self.lus[1], u[1] + 1j * u[2])
        x = jnp.stack([x0, xc.real.astype(dtype), xc.imag.astype(dtype)])
        return (self.TI.T if transpose else self.T) @ x

    def precondition(self, v):
        return self._solve(v, False)

    def precondition_t(self, v):
        return self._solve(v, True)

    def transposed_at(self, Z):
        """`mu -> (G_Z^T mu, its two terms' sizes)` at the stages `Z`."""
        _, pull = jax.vjp(lambda Z: self.fields(self.consts, self.y, Z), Z)

        def apply(mu):
            a = self.Ainv.T @ jax.vmap(self.apply_mass_t)(mu) / self.h
            b = pull(mu)[0]
            return a - b, jnp.maximum(jnp.max(jnp.abs(a)), jnp.max(jnp.abs(b)))

        return apply


def _relative(d, x):
    s, norm = _rms(d), _rms(x)
    return jnp.where(s == 0, 0.0, s / jnp.where(norm > 0, norm, 1.0))


def _richardson(st: _Stages, apply, rhs):
    """`mu` with `G_Z^T mu = rhs` (`(3, n)`) by the iteration preconditioned
    with `P^-T`, stopped where it converges slower than `SLOW_RATE`:
    `(converged, mu, rate)`."""
    def cond(s):
        k, _, size, rate = s
        return (k < ADJOINT_MAXITER) & ~(size <= ADJOINT_RTOL) & ~(rate >= SLOW_RATE)

    def body(s):
        k, mu, old, _ = s
        d = st.precondition_t(rhs - apply(mu)[0])
        mu = mu + d
        size = _relative(d, mu)
        return k + 1, mu, size, jnp.where(old > 0, size / old, 0.0)

    dtype = rhs.dtype
    inf = jnp.asarray(jnp.inf, dtype)
    _, mu, size, rate = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), st.precondition_t(rhs), inf,
                     jnp.zeros((), dtype)))
    ok = (size <= ADJOINT_RTOL) & jnp.all(jnp.isfinite(mu))
    return ok, mu, jnp.where(jnp.isfinite(rate), rate, inf)


def _solved(apply, rhs, mu):
    """Whether `mu` solves `apply(mu) = rhs` to `KRYLOV_RESIDUAL`, relative
    to the sizes of `rhs` and of `apply`'s terms (its rounding floor)."""
    r, terms = apply(mu)
    scale = jnp.maximum(jnp.max(jnp.abs(rhs)), terms)
    return jnp.all(jnp.isfinite(mu)) & (jnp.max(jnp.abs(rhs - r)) <= KRYLOV_RESIDUAL * scale)


def _newton_krylov(st: _Stages, Z, scale, m: int):
    """The stages by Newton's method with the exact `G_Z` (its products by
    JVPs), each step solved by GMRES preconditioned with `P^-1`: for the
    steps whose simplified iteration converges too slowly (a long step of a
    strongly nonlinear field). `(converged, Z)`."""
    from jax.scipy.sparse.linalg import gmres

    def cond(s):
        k, _, done, bad = s
        return (k < KRYLOV_NEWTON_MAXITER) & ~done & ~bad

    def body(s):
        k, Z, _, _ = s
        g, jvp = jax.linearize(st.residual, Z)
        dZ, _ = gmres(jvp, -g, tol=KRYLOV_STEP_RTOL, restart=KRYLOV_RESTART,
                      maxiter=KRYLOV_RESTARTS, M=st.precondition)
        Z = Z + dZ
        size = _rms((dZ / scale)[:, :m])
        return k + 1, Z, size <= STAGE_TOL, ~jnp.isfinite(size)

    _, Z, done, _ = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), Z, jnp.asarray(False), jnp.asarray(False)))
    return done, Z


def _at_floor(st: _Stages, Z, m: int):
    """Whether the stages' residual `G(Z)` is at its floor of rounding errors
    (as `optimize.root`'s `at_floor`, `rounding_floor`): how much `G`
    changes when the stage values `y + Z` move by `FLOOR_ULPS` units in
    their last place, in two sign patterns. On a long step of a stiff field
    no iterate can make the residual smaller."""
    def norm(v):
        return jnp.max(jnp.abs(v[:, :m]))

    g = st.residual(Z)
    u = (FLOOR_ULPS * jnp.finfo(Z.dtype).eps) * jnp.abs(st.y + Z)
    sign = jnp.where(jnp.arange(Z.shape[1]) % 2 == 0, 1.0, -1.0).astype(Z.dtype)
    floor = jnp.maximum(norm(st.residual(Z + u) - g), norm(st.residual(Z + u * sign) - g))
    return norm(g) <= floor


def _direct(st: _Stages, Z, rhs, scale, m: int):
    """The stages by Newton's method with the exact stage Jacobian `G_Z`
    (dense, by forward mode) and `mu` from `G_Z^T mu = rhs` with it, by LU:
    for a small dense system. `(converged, Z, mu)`."""
    size = Z.size

    def jacobian(Z):
        return jax.jacfwd(st.residual)(Z).reshape(size, size)

    def cond(s):
        k, _, done, bad = s
        return (k < KRYLOV_NEWTON_MAXITER) & ~done & ~bad

    def body(s):
        k, Z, _, _ = s
        dZ = -jnp.linalg.solve(jacobian(Z), st.residual(Z).reshape(size)).reshape(Z.shape)
        Z = Z + dZ
        step = _rms((dZ / scale)[:, :m])
        return k + 1, Z, step <= STAGE_TOL, ~jnp.isfinite(step)

    _, Z, done, _ = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), Z, jnp.asarray(False), jnp.asarray(False)))
    done = done | (jnp.all(jnp.isfinite(Z)) & jax.lax.cond(
        done, lambda: jnp.asarray(False), lambda: _at_floor(st, Z, m)))
    mu = jnp.linalg.solve(jacobian(Z).T, rhs.reshape(size)).reshape(Z.shape)
    return done & jnp.all(jnp.isfinite(mu)), Z, mu


def adjoint(field: Callable, consts, grid, marks, states, ct, ct_states=None, *, rtol: float,
            atol: float, jac: str = "dense", pattern=None, mass=None):
    """The cotangents of `consts` (a tuple of arrays, `field(consts, t, y)`'s
    first argument) and of the initial state from `ct`, the cotangent of the
    states at the output times (`(len(marks), n)`; output `i` is the state
    after `marks[i]` steps), and `ct_states`, that of the states at every
    step (or None), through the steps the forward loop recorded (`grid`,
    `states`, `(max_steps + 1, ...)`): `(consts_bar, y0_bar, status,
    t_failed)`, status 0, or `FAILED` or `NONFINITE` at the step from
    `t_failed` (the pass stopped there: its results NaN).
    `jac`, `pattern`, `mass`: as `_radau.integrate` took them."""
    n, dtype = states.shape[1], states.dtype
    m = n
    linear = _radau._sparse_linear(lambda t, y: field(consts, t, y), pattern, mass, dtype) \
        if jac == "sparse" else _radau._dense_linear(lambda t, y: field(consts, t, y), n, dtype,
                                                     mass)
    M = mass_of(mass, jac, pattern, n, dtype)
    Cj = jnp.asarray(_radau.C, dtype)
    # (a stage iterate within the forward's own Newton tolerance is as good a
    # point to linearise at as the forward's)
    loose = _radau.newton_tolerance(rtol, float(np.finfo(dtype).eps))
    small = jac != "sparse" and 3 * n <= DIRECT_SIZE
    steps = marks[-1]
    # the cotangents each state receives (output times and every step)
    given = jnp.zeros_like(states).at[marks].add(ct)
    if ct_states is not None:
        given = given + ct_states

    def simplified(st, lam, Z0, scale):
        """The first try: the simplified Newton iteration and the
        preconditioned one on the transposed system, with the kept
        factorizations. `(ok, Z, mu, slow)`."""
        done, iters, Z, rate_z, _, size = _radau.newton(
            lambda s, v: field(consts, s, v), st.linear, st.apply_mass, st.t, st.y, st.h, Z0,
            st.lus, scale, m=m, tol=STAGE_TOL, maxiter=NEWTON_MAXITER)
        finite = jnp.all(jnp.isfinite(Z))
        done = done | (finite & ((size <= loose) | jax.lax.cond(
            done, lambda: jnp.asarray(False), lambda: _at_floor(st, Z, m))))
        rhs = jnp.zeros((3, n), dtype).at[2].set(lam)
        ok, mu, rate_mu = _richardson(st, st.transposed_at(Z), rhs)
        slow = (rate_mu > RENEW_RATE) | ((iters > 4) & (rate_z > RENEW_RATE))
        return done & ok, Z, mu, slow

    def robust(st, lam, Z, scale):
        """The second try (fresh factorizations): Newton-Krylov on the stages,
        GMRES on the transposed system, both preconditioned as the first
        try's. `(ok, Z, mu)`."""
        from jax.scipy.sparse.linalg import gmres

        done, Z = _newton_krylov(st, Z, scale, m)
        done = done | (jnp.all(jnp.isfinite(Z)) & jax.lax.cond(
            done, lambda: jnp.asarray(False), lambda: _at_floor(st, Z, m)))
        apply = st.transposed_at(Z)
        rhs = jnp.zeros((3, n), dtype).at[2].set(lam)
        # (the correction to P^-T rhs, from 0: GMRES's `x0` and right-hand
        # side batched apart under `jax.vmap` break its `device_put`)
        mu0 = st.precondition_t(rhs)
        d, _ = gmres(lambda v: apply(v)[0], rhs - apply(mu0)[0], tol=ADJOINT_RTOL,
                     restart=KRYLOV_RESTART, maxiter=KRYLOV_RESTARTS, M=st.precondition_t)
        mu = mu0 + d
        return done & _solved(apply, rhs, mu), Z, mu

    def cond(c):
        k, status = c[0], c[-2]
        return (k >= 0) & (status == 0)

    def body(c):
        k, lam, acc, f1, J, lus, lu_h, renew, status, t_failed = c
        live = k >= 0  # (a batch's finished example runs the body too: its step 0 again)
        kk = jnp.maximum(k, 0)
        t = grid[kk]
        h = grid[kk + 1] - t
        y, y1 = states[kk], states[kk + 1]
        f0 = field(consts, t, y)
        scale = atol + jnp.abs(y) * rtol
        Z0 = hermite_stages(y, y1, f0, f1, h) if M is None else Cj[:, None] * (y1 - y)
        if small:  # (no factorizations kept: the 3n system by LU)
            ok, Z, mu = _direct(_Stages(field, consts, linear, M, lus, t, h, y), Z0,
                                jnp.zeros((3, n), dtype).at[2].set(lam), scale, m)
            return finish(k, kk, t, h, y, lam, acc, f0, J, lus, lu_h, ok, Z, mu, renew,
                          status, t_failed)
        # the first try: the Jacobian the later step left (at this step's
        # end where that step asked for a fresh one), factored again where
        # `h` changed
        J = jax.lax.cond(renew, lambda: linear.jacobian(t + h, y1), lambda: J)
        need = renew | (lu_h != h)
        lus = refactored(linear, lus, J, h, need & live)
        lu_h = jnp.where(need, h, lu_h)
        ok, Z, mu, slow = simplified(_Stages(field, consts, linear, M, lus, t, h, y), lam, Z0,
                                     scale)

        # where it failed, a second: the Jacobian at the step's start, its
        # own factorizations, exact Newton steps and GMRES (a loop run at
        # most once, not a `lax.cond`: as `_radau`'s refilter, for the kept
        # factors' swaps under `jax.vmap`)
        def again(r):
            retry, _, Z, mu, J, lus = r
            J = linear.jacobian(t, y)
            lus = refactored(linear, lus, J, h, retry & live)
            st = _Stages(field, consts, linear, M, lus, t, h, y)
            Z = jnp.where(jnp.all(jnp.isfinite(Z)), Z, Z0)
            ok, Z, mu = robust(st, lam, Z, scale)
            return jnp.asarray(False), ok, Z, mu, J, lus

        retry = ~ok
        _, ok, Z, mu, J, lus = jax.lax.while_loop(lambda r: r[0], again,
                                                  (retry, ok, Z, mu, J, lus))
        lu_h = jnp.where(retry, h, lu_h)
        return finish(k, kk, t, h, y, lam, acc, f0, J, lus, lu_h, ok, Z, mu, slow | retry,
                      status, t_failed)

    def finish(k, kk, t, h, y, lam, acc, f0, J, lus, lu_h, ok, Z, mu, renew, status,
               t_failed):
        """The step's cotangents from `mu`, and the carry down to the next."""
        live = k >= 0
        _, pull = jax.vjp(lambda cs, y, Z: jax.vmap(
            lambda c, z: field(cs, t + c * h, y + z))(Cj, Z), consts, y, Z)
        cbar, ybar, _ = pull(mu)
        lam = lam + ybar + given[kk]
        acc = jax.tree_util.tree_map(jnp.add, acc, cbar)
        # (NaN or inf in the step's stages, `mu` or what the field's VJP made
        # of them: a derivative of the field is not finite there)
        finite = jnp.all(jnp.isfinite(mu)) & jnp.all(jnp.isfinite(Z)) & jnp.all(
            jnp.isfinite(ybar)) & jnp.all(jnp.stack([jnp.all(jnp.isfinite(c)) for c in
                                                      jax.tree_util.tree_leaves(cbar)] +
                                                     [jnp.asarray(True)]))
        failed = live & ~ok
        status = jnp.where(failed, jnp.where(finite, FAILED, NONFINITE), status)
        return (k - 1, lam, acc, f0, J, lus, lu_h, renew, status.astype(jnp.int32),
                jnp.where(failed, t, t_failed))

    last = states[steps]
    J0 = linear.jacobian(grid[steps], last)
    acc0 = jax.tree_util.tree_map(jnp.zeros_like, consts)
    c0 = (steps - 1, given[steps], acc0, field(consts, grid[steps], last), J0,
          linear.factor(J0, jnp.ones((), dtype)), jnp.asarray(jnp.nan, dtype),
          jnp.asarray(False), jnp.asarray(0, jnp.int32), jnp.asarray(jnp.nan, dtype))
    _, lam, acc, _, _, lus, _, _, status, t_failed = jax.lax.while_loop(cond, body, c0)
    status = status + released(linear, lus, after=[lam, *jax.tree_util.tree_leaves(acc)])
    failed = status != 0
    acc = jax.tree_util.tree_map(lambda a: jnp.where(failed, jnp.nan, a), acc)
    return acc, jnp.where(failed, jnp.nan, lam), status, t_failed
