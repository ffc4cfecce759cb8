"""The discrete adjoint of Radau IIA's accepted steps (`_radau`), as one
JAX loop down the steps (`adjoint`), and their forward sensitivity, the
same loop up them (`tangent`), with the forward loop's linear algebra: its real
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
the Jacobian at the step's start, factored afresh: Newton's method with the
exact `G_Z` (its products by JVPs) and GMRES, both preconditioned with `P`
(`_newton_krylov`); a step whose second try fails stops the pass with
status 5 (3 where a derivative of the field was not finite). A small dense
system (`DIRECT_SIZE`) is solved by LU of its whole `G_Z` instead
(`_direct`). The tangent pass solves `G_Z dZ = F_y dy + F_p dp` alike;
both solve any number of directions (right-hand sides) with one set of
stages and factorizations.

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

from ..direct import _small_lu
from . import _radau
from ._bdf import _rms
from ._steps import mass_of, newton_tolerance, refactored, released

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
#: the tightest relative tolerance asked of a dtype, in units of its
#: rounding (`attainable`: float32's floor 7.6e-6, float64's 1.4e-14)
EPS_FLOOR = 64


def step_status(live, ok, *arrays):
    """A step's status in a pass over the recorded steps (Radau's, BDF's):
    `NONFINITE` where anything it made (`arrays`: its stages, its
    cotangents, those of the consts) is not finite (a derivative of the
    field was not), solved or not; else `FAILED` where it did not solve
    (`ok` False); 0 where it solved to finite values, or is not `live` (a
    batch's finished example). (A step whose Newton solve converged can
    still meet a derivative of the field in its consts that is not finite,
    which would otherwise give NaN gradients silently.)"""
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(a))
                                for a in jax.tree_util.tree_leaves(arrays)]
                               or [jnp.asarray(True)]))
    return jnp.where(live & ~(ok & finite), jnp.where(finite, FAILED, NONFINITE), 0)


def hermite_stages(y0, y1, f0, f1, h):
    """The stage increments `(3, n)` on the cubic Hermite interpolant between
    `(y0, f0)` and `(y1, f1)` (`h` apart), at Radau's nodes."""
    c = jnp.asarray(_radau.C, y0.dtype)[:, None]
    h00, h10 = 2 * c ** 3 - 3 * c ** 2 + 1, c ** 3 - 2 * c ** 2 + c
    h01, h11 = -2 * c ** 3 + 3 * c ** 2, c ** 3 - c ** 2
    return (h00 - 1) * y0 + h10 * h * f0 + h01 * y1 + h11 * h * f1


def _stage_fields(field, cs, t, h, y, Z):
    """`F_j = f(t + c_j h, y + Z_j)` (`(3, n)`) of the consts `cs` (`field(cs,
    t, y)`), the state `y` and the stage increments `Z`."""
    C = jnp.asarray(_radau.C, y.dtype)
    return jax.vmap(lambda c, z: field(cs, t + c * h, y + z))(C, Z)


class _Stages:
    """A step's collocation system and its preconditioner, in JAX: `G(Z)`,
    `G_Z^T mu`, and `P^-1`, `P^-T` with the factorizations `lus` (see the
    module docstring)."""

    def __init__(self, field, consts, linear, mass, lus, t, h, y):
        _, _, T, TI, _ = _radau.constants()
        self.field, self.consts, self.linear, self.lus = field, consts, linear, lus
        self.t, self.h, self.y = t, h, y
        self.apply_mass = (lambda v: v) if mass is None else mass.apply
        self.apply_mass_t = (lambda v: v) if mass is None else mass.apply_t
        self.T, self.TI = T, TI  # (NumPy's: `_radau.mix` keeps the values' dtype)
        self.Ainv = np.linalg.inv(_radau.A)

    def residual(self, Z):
        """`G(Z) = (A^-1 (x) M) Z / h - F(Z)`."""
        return _radau.mix(self.Ainv, jax.vmap(self.apply_mass)(Z)) / self.h - \
            _stage_fields(self.field, self.consts, self.t, self.h, self.y, Z)

    def _solve(self, v, transpose: bool):
        # P^-1 v = (T (x) I) K^-1 (T^-1 (x) I) v; P^-T v = (T^-T (x) I) K^-T (T^T (x) I) v,
        # for `v` of shape (directions, 3, n): the directions are the
        # solves' right-hand sides
        lin, dtype = self.linear, v.dtype
        u = _mix(self.T.T if transpose else self.TI, v)
        real_of, cplx_of = (lin.solve_real_t, lin.solve_complex_h) if transpose else \
            (lin.solve_real, lin.solve_complex)

        def solve(fn, lu, rows):  # (rows: one right-hand side each)
            if lin.columns:
                return fn(lu, rows.T).T
            return jnp.stack([fn(lu, r) for r in rows])

        x0 = solve(real_of, self.lus[0], u[:, 0])
        xc = solve(cplx_of, self.lus[1], u[:, 1] + 1j * u[:, 2])
        x = jnp.stack([x0, xc.real.astype(dtype), xc.imag.astype(dtype)], axis=1)
        return _mix(self.TI.T if transpose else self.T, x)

    def preconditioner(self, transpose: bool) -> Callable:
        """`P^-1` (`P^-T` if `transpose`)."""
        return lambda v: self._solve(v, transpose)

    def linear_at(self, Z, transpose: bool) -> Callable:
        """`v -> (G_Z v, the size of its two terms)` at the stages `Z` (`G_Z^T
        v` if `transpose`), for `v` of shape `(directions, 3, n)`: the
        field's JVPs (VJPs) at the three stages."""
        def fields(Z):
            return _stage_fields(self.field, self.consts, self.t, self.h, self.y, Z)

        if transpose:
            _, pull = jax.vjp(fields, Z)
            stages = lambda v: pull(v)[0]  # noqa: E731
            mass, mix = self.apply_mass_t, self.Ainv.T
        else:
            _, stages = jax.linearize(fields, Z)
            mass, mix = self.apply_mass, self.Ainv

        def apply(v):
            a = _mix(mix, jax.vmap(jax.vmap(mass))(v)) / self.h
            b = jax.vmap(stages)(v)
            return a - b, jnp.maximum(jnp.max(jnp.abs(a), axis=(1, 2)),
                                      jnp.max(jnp.abs(b), axis=(1, 2)))

        return apply


def _mix(matrix, v):
    """`(matrix (x) I) v` for each direction of `v`, `(directions, 3, n)`:
    `_radau.mix` on the stage axis (unrolled sums of scaled stages, fused
    by XLA; as an einsum, a matrix kernel with `v` transposed there and
    back, most of an iteration's time outside its solves)."""
    return jax.vmap(lambda x: _radau.mix(matrix, x))(v)


def _relative(d, x):
    """The largest of the directions' `rms(d) / rms(x)` (0 where `d` is)."""
    s = jnp.sqrt(jnp.mean(d.reshape(d.shape[0], -1) ** 2, axis=1))
    norm = jnp.sqrt(jnp.mean(x.reshape(x.shape[0], -1) ** 2, axis=1))
    return jnp.max(jnp.where(s == 0, 0.0, s / jnp.where(norm > 0, norm, 1.0)))


def attainable(tol: float, dtype) -> float:
    """`tol` (a relative tolerance), or where `dtype`'s rounding cannot reach
    it (float32's, for 1e-9), `EPS_FLOOR` units of its rounding."""
    return max(tol, EPS_FLOOR * float(np.finfo(dtype).eps))


def richardson(apply, precondition, rhs, *, rtol: float, maxiter: int, slow: float):
    """`x` with `apply(x) = rhs` (each direction: `rhs` has a leading axis of
    directions) by the iteration preconditioned with `precondition`, from
    `precondition(rhs)`, converged where its last correction is `rtol` of
    `x` (at least `attainable(dtype)`), stopped after `maxiter` iterations
    or where it converges slower than `slow`: `(converged, x, rate)`.
    Radau's stage systems (`G_Z`, its transpose) and BDF's transposed
    iteration matrices (`_bdf_adjoint`)."""
    rtol = attainable(rtol, rhs.dtype)
    def cond(s):
        k, _, size, rate = s
        return (k < maxiter) & ~(size <= rtol) & ~(rate >= slow)

    def body(s):
        k, x, old, _ = s
        d = precondition(rhs - apply(x))
        x = x + d
        size = _relative(d, x)
        return k + 1, x, size, jnp.where(old > 0, size / old, 0.0)

    dtype = rhs.dtype
    inf = jnp.asarray(jnp.inf, dtype)
    _, x, size, rate = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), precondition(rhs), inf, jnp.zeros((), dtype)))
    ok = (size <= rtol) & jnp.all(jnp.isfinite(x))
    return ok, x, jnp.where(jnp.isfinite(rate), rate, inf)


def _richardson(apply, precondition, rhs):
    """`richardson` on a step's stage system (`apply(x)[0]`, `(3, n)` a
    direction) with this module's constants."""
    return richardson(lambda x: apply(x)[0], precondition, rhs, rtol=ADJOINT_RTOL,
                      maxiter=ADJOINT_MAXITER, slow=SLOW_RATE)


def _solved(apply, rhs, x):
    """Whether `x` solves `apply(x) = rhs` to `KRYLOV_RESIDUAL` in every
    direction, relative to the sizes of its `rhs` and of `apply`'s terms
    (its rounding floor)."""
    r, terms = apply(x)
    scale = jnp.maximum(jnp.max(jnp.abs(rhs), axis=(1, 2)), terms)
    return jnp.all(jnp.isfinite(x)) & jnp.all(
        jnp.max(jnp.abs(rhs - r), axis=(1, 2)) <= attainable(KRYLOV_RESIDUAL, x.dtype) * scale)


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
        precondition = st.preconditioner(False)
        dZ, _ = gmres(jvp, -g, tol=KRYLOV_STEP_RTOL, restart=KRYLOV_RESTART,
                      maxiter=KRYLOV_RESTARTS, M=lambda v: precondition(v[None])[0])
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


def _or_at_floor(st: _Stages, done, Z, m: int):
    """`done`, or the stages `Z` finite and at their rounding floor (measured
    only where not `done`)."""
    return done | (jnp.all(jnp.isfinite(Z)) & jax.lax.cond(
        done, lambda: jnp.asarray(False), lambda: _at_floor(st, Z, m)))


def _direct(st: _Stages, Z, rhs_of: Callable, scale, m: int, transpose: bool):
    """The stages by Newton's method with the exact stage Jacobian `G_Z`
    (dense, by forward mode) and `x` from `G_Z x = rhs_of(Z)` (`G_Z^T` if
    `transpose`) with it, by LU: for a small dense system. `(converged, Z,
    x)`."""
    size = Z.size

    def jacobian(Z):
        return jax.jacfwd(st.residual)(Z).reshape(size, size)

    def cond(s):
        k, _, done, bad = s
        return (k < KRYLOV_NEWTON_MAXITER) & ~done & ~bad

    def body(s):
        k, Z, _, _ = s
        dZ = -_small_lu.lu_solve(_small_lu.lu_factor(jacobian(Z)),
                                 st.residual(Z).reshape(size)).reshape(Z.shape)
        Z = Z + dZ
        step = _rms((dZ / scale)[:, :m])
        return k + 1, Z, step <= STAGE_TOL, ~jnp.isfinite(step)

    _, Z, done, _ = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), Z, jnp.asarray(False), jnp.asarray(False)))
    done = _or_at_floor(st, done, Z, m)
    G = jacobian(Z)
    rhs = rhs_of(Z)
    x = _small_lu.lu_solve(_small_lu.lu_factor(G), rhs.reshape(rhs.shape[0], size).T,
                           trans=int(transpose))
    x = x.T.reshape(rhs.shape)
    return done & jnp.all(jnp.isfinite(x)), Z, x


class _Steps:
    """What both passes over the recorded steps share: the linear algebra
    of the forward loop (`linear`, its factorizations kept over steps), and
    `solve`, one step's stages and the solution of the step's linear system
    `G_Z x = rhs` (the tangent pass) or `G_Z^T x = rhs` (the adjoint), for
    any number of right-hand sides (directions: `(directions, 3, n)`)."""

    def __init__(self, field, consts, states, *, rtol, atol, jac, pattern, mass,
                 transpose: bool):
        n, dtype = states.shape[1], states.dtype
        self.field, self.consts, self.rtol, self.atol = field, consts, rtol, atol
        self.n, self.dtype, self.transpose = n, dtype, transpose
        self.linear = _radau._sparse_linear(lambda t, y: field(consts, t, y), pattern, mass,
                                            dtype) \
            if jac == "sparse" else _radau._dense_linear(lambda t, y: field(consts, t, y), n,
                                                         dtype, mass)
        self.M = mass_of(mass, jac, pattern, n, dtype)
        self.C = jnp.asarray(_radau.C, dtype)
        # (a stage iterate within the forward's own Newton tolerance is as
        # good a point to linearise at as the forward's)
        self.loose = newton_tolerance(rtol, float(np.finfo(dtype).eps))
        self.small = jac != "sparse" and 3 * n <= DIRECT_SIZE

    def stages(self, lus, t, h, y):
        return _Stages(self.field, self.consts, self.linear, self.M, lus, t, h, y)

    def start(self, grid, states, k):
        """The carry's Jacobian and factorizations before the first step a
        pass solves (`k`): the Jacobian at that step's end, no factors."""
        J = self.linear.jacobian(grid[k + 1], states[k + 1])
        return J, self.linear.factor(J, jnp.ones((), self.dtype)), \
            jnp.asarray(jnp.nan, self.dtype)

    def solve(self, t, h, y, y1, f0, f1, rhs_of: Callable, J, lus, lu_h, renew, live):
        """The step from `(t, y)` to `(t + h, y1)` (`f0`, `f1`: the field
        there): its stages `Z` and `x` with `G_Z x = rhs_of(Z)` (or `G_Z^T
        x`). A first try with the Jacobian `J` (at the step's end where
        `renew`) and the kept factorizations `lus` (made again for `h` where
        it changed); where it fails, a second with the Jacobian at the
        step's start, fresh factorizations, Newton-Krylov and GMRES; a small
        dense system by LU of the stage matrix instead. `(ok, Z, x, J, lus,
        lu_h, renew)`; `renew`: the next step should evaluate the Jacobian
        again. `live`: False for a batch's example that is done (no
        factor is swapped for it)."""
        from jax.scipy.sparse.linalg import gmres

        linear, m, transpose = self.linear, self.n, self.transpose
        scale = self.atol + jnp.abs(y) * self.rtol
        Z0 = hermite_stages(y, y1, f0, f1, h) if self.M is None else \
            self.C[:, None] * (y1 - y)
        if self.small:  # (no factorizations kept: the 3n system by LU)
            ok, Z, x = _direct(self.stages(lus, t, h, y), Z0, rhs_of, scale, m, transpose)
            return ok, Z, x, J, lus, lu_h, renew
        J = jax.lax.cond(renew, lambda: linear.jacobian(t + h, y1), lambda: J)
        need = renew | (lu_h != h)
        lus = refactored(linear, lus, J, h, need & live)
        lu_h = jnp.where(need, h, lu_h)
        st = self.stages(lus, t, h, y)
        done, iters, Z, rate_z, _, size = _radau.newton(
            lambda s, v: self.field(self.consts, s, v), linear, st.apply_mass, t, y, h, Z0,
            lus, scale, m=m, tol=STAGE_TOL, maxiter=NEWTON_MAXITER)
        done = _or_at_floor(st, done | (jnp.all(jnp.isfinite(Z)) & (size <= self.loose)), Z,
                            m)
        ok, x, rate = _richardson(st.linear_at(Z, transpose), st.preconditioner(transpose),
                                  rhs_of(Z))
        slow = (rate > RENEW_RATE) | ((iters > 4) & (rate_z > RENEW_RATE))

        # (a loop run at most once, not a `lax.cond`: as `_radau`'s refilter,
        # for the kept factors' swaps under `jax.vmap`)
        def again(r):
            retry, _, Z, x, J, lus = r
            J = linear.jacobian(t, y)
            lus = refactored(linear, lus, J, h, retry & live)
            st = self.stages(lus, t, h, y)
            done, Z = _newton_krylov(st, jnp.where(jnp.all(jnp.isfinite(Z)), Z, Z0), scale, m)
            done = _or_at_floor(st, done, Z, m)
            apply, precondition = st.linear_at(Z, transpose), st.preconditioner(transpose)
            rhs = rhs_of(Z)
            # (the correction to P^-1 rhs, from 0: GMRES's `x0` and right-hand
            # side batched apart under `jax.vmap` break its `device_put`)
            x0 = precondition(rhs)
            d, _ = gmres(lambda v: apply(v)[0], rhs - apply(x0)[0],
                         tol=attainable(ADJOINT_RTOL, rhs.dtype),
                         restart=KRYLOV_RESTART, maxiter=KRYLOV_RESTARTS, M=precondition)
            x = x0 + d
            return jnp.asarray(False), done & _solved(apply, rhs, x), Z, x, J, lus

        retry = ~(done & ok)
        _, ok, Z, x, J, lus = jax.lax.while_loop(lambda r: r[0], again,
                                                 (retry, done & ok, Z, x, J, lus))
        return ok, Z, x, J, lus, jnp.where(retry, h, lu_h), slow | retry


def adjoint(field: Callable, consts, grid, marks, states, ct, ct_states=None, *, rtol: float,
            atol: float, jac: str = "dense", pattern=None, mass=None):
    """The cotangents of `consts` (a tuple of arrays, `field(consts, t, y)`'s
    first argument) and of the initial state from `ct`, the cotangents of
    the states at the output times (`(directions, len(marks), n)`; output
    `i` is the state after `marks[i]` steps), and `ct_states`, those of the
    states at every step (or None), through the steps the forward loop
    recorded (`grid`, `states`, `(max_steps + 1, ...)`). Every direction
    (a row of cotangents) is solved with the same stages and
    factorizations. `(consts_bar, y0_bar, status, t_failed)` (each
    cotangent with the leading `directions` axis), status 0, or `FAILED` or
    `NONFINITE` at the step from `t_failed` (the pass stopped there: its
    results NaN). `jac`, `pattern`, `mass`: as `_radau.integrate` took
    them."""
    S = _Steps(field, consts, states, rtol=rtol, atol=atol, jac=jac, pattern=pattern,
               mass=mass, transpose=True)
    n, dtype, B = S.n, S.dtype, ct.shape[0]
    steps = marks[-1]

    def given(k):
        """The cotangent the state after `k` steps receives (`(directions,
        n)`: the output times' there, and its own at every step), read per
        step: not a `(directions, max_steps + 1, n)` array of them (33.5 MB
        a direction for the 1,024-state Brusselator, zeroed every call), as
        BDF's pass reads them."""
        g = jnp.einsum("i,bin->bn", (marks == k).astype(dtype), ct)
        return g if ct_states is None else g + ct_states[:, k]

    def cond(c):
        k, status = c[0], c[-2]
        return (k >= 0) & (status == 0)

    def body(c):
        k, lam, acc, f1, J, lus, lu_h, renew, status, t_failed = c
        live = k >= 0  # (a batch's finished example runs the body too: its step 0 again)
        kk = jnp.maximum(k, 0)
        t = grid[kk]
        h = grid[kk + 1] - t
        y = states[kk]
        f0 = field(consts, t, y)
        ok, Z, mu, J, lus, lu_h, renew = S.solve(
            t, h, y, states[kk + 1], f0, f1,
            lambda Z: jnp.zeros((B, 3, n), dtype).at[:, 2].set(lam), J, lus, lu_h, renew, live)
        # y + Z_3 is the step's result: (0, 0, lam) is its stages' cotangent
        _, pull = jax.vjp(lambda cs, y: _stage_fields(field, cs, t, h, y, Z), consts, y)
        cbar, ybar = jax.vmap(pull)(mu)
        lam = lam + ybar + given(kk)
        acc = jax.tree_util.tree_map(jnp.add, acc, cbar)
        bad = step_status(live, ok, mu, Z, ybar, cbar)
        return (k - 1, lam, acc, f0, J, lus, lu_h, renew,
                jnp.where(bad != 0, bad, status).astype(jnp.int32),
                jnp.where(bad != 0, t, t_failed))

    last = states[steps]
    J0, lus0, lu_h0 = S.start(grid, states, steps - 1)
    acc0 = jax.tree_util.tree_map(lambda c: jnp.zeros((B,) + c.shape, c.dtype), consts)
    c0 = (steps - 1, given(steps), acc0, field(consts, grid[steps], last), J0, lus0, lu_h0,
          jnp.asarray(False), jnp.asarray(0, jnp.int32), jnp.asarray(jnp.nan, dtype))
    _, lam, acc, _, _, lus, _, _, status, t_failed = jax.lax.while_loop(cond, body, c0)
    status = status + released(S.linear, lus, after=[lam, *jax.tree_util.tree_leaves(acc)])
    failed = status != 0
    acc = jax.tree_util.tree_map(lambda a: jnp.where(failed, jnp.nan, a), acc)
    return acc, jnp.where(failed, jnp.nan, lam), status, t_failed


def tangent(field: Callable, consts, dconsts, grid, marks, states, dy0, *, rtol: float,
            atol: float, jac: str = "dense", pattern=None, mass=None):
    """The tangents of the states at every step (`(directions, max_steps +
    1, n)`, zeros past the last) and at the output times (`(directions,
    len(marks), n)`) from the tangents `dconsts` of `consts` (a tuple, as
    `adjoint`'s; each with the leading `directions` axis) and `dy0` of the
    initial state (`(directions, n)`), through the recorded steps: the
    discrete forward sensitivity, each step's `G_Z dZ = F_y dy + F_p dp`
    solved as the adjoint solves its transpose, every direction with the
    same stages and factorizations. `(dstates, dys, status, t_failed)`, as
    `adjoint`'s."""
    S = _Steps(field, consts, states, rtol=rtol, atol=atol, jac=jac, pattern=pattern,
               mass=mass, transpose=False)
    steps = marks[-1]

    def cond(c):
        k, status = c[0], c[-2]
        return (k < steps) & (status == 0)

    def body(c):
        k, dy, out, f0, J, lus, lu_h, renew, status, t_failed = c
        live = k < steps
        kk = jnp.minimum(k, jnp.maximum(steps - 1, 0))
        t = grid[kk]
        h = grid[kk + 1] - t
        y, y1 = states[kk], states[kk + 1]
        f1 = field(consts, t + h, y1)

        def rhs_of(Z):  # F_y dy + F_p dp at the stages, per direction
            def one(dc, d):
                return jax.jvp(lambda cs, y: _stage_fields(field, cs, t, h, y, Z), (consts, y),
                               (dc, d))[1]

            return jax.vmap(one)(dconsts, dy)

        ok, Z, dZ, J, lus, lu_h, renew = S.solve(t, h, y, y1, f0, f1, rhs_of, J, lus, lu_h,
                                                 renew, live)
        dy = dy + dZ[:, 2]
        bad = step_status(live, ok, dZ, Z)
        out = out.at[:, kk + 1].set(jnp.where(live, dy, out[:, kk + 1]))
        return (k + 1, dy, out, f1, J, lus, lu_h, renew,
                jnp.where(bad != 0, bad, status).astype(jnp.int32),
                jnp.where(bad != 0, t, t_failed))

    J0, lus0, lu_h0 = S.start(grid, states, 0)
    out0 = jnp.zeros((dy0.shape[0],) + states.shape, S.dtype).at[:, 0].set(dy0)
    c0 = (jnp.asarray(0, marks.dtype), dy0, out0, field(consts, grid[0], states[0]), J0, lus0,
          lu_h0, jnp.asarray(False), jnp.asarray(0, jnp.int32),
          jnp.asarray(jnp.nan, S.dtype))
    _, _, out, _, _, lus, _, _, status, t_failed = jax.lax.while_loop(cond, body, c0)
    status = status + released(S.linear, lus, after=[out])
    out = jnp.where(status != 0, jnp.nan, out)
    return out, out[:, marks], status, t_failed
