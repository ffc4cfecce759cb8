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
#: scale `atol + rtol |y|` (the forward stops near 0.03)
STAGE_TOL = 1e-5
#: the transposed stage system's iteration: converged where its last
#: correction is this fraction of its solution
ADJOINT_RTOL = 1e-10
#: its most iterations, and the rate above which a step is done again with
#: a fresh Jacobian
ADJOINT_MAXITER, SLOW_RATE = 40, 0.3
#: a step whose iterations converged slower than this asks the next one for
#: a fresh Jacobian (as the forward's `renew_jac`)
RENEW_RATE = 1e-2
NEWTON_MAXITER = 10
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


def _transposed(linear, apply_mass_t, stages_vjp, lus, h, rhs, m: int):
    """`mu` with `G_Z^T mu = rhs` (`(3, n)`) by the iteration preconditioned
    with the factorizations `lus` (see the module docstring):
    `(converged, mu, rate)`."""
    mu_r, mu_c, T, TI, _ = _radau.constants()
    dtype = rhs.dtype
    Tj, TIj = jnp.asarray(T, dtype), jnp.asarray(TI, dtype)
    Ainv = jnp.asarray(np.linalg.inv(_radau.A), dtype)

    def apply(mu):  # G_Z^T mu
        return Ainv.T @ jax.vmap(apply_mass_t)(mu) / h - stages_vjp(mu)

    def precondition(v):  # P^-T v = (T^-T (x) I) K^-T (T^T (x) I) v
        u = Tj.T @ v
        x0 = linear.solve_real_t(lus[0], u[0])
        xc = linear.solve_complex_h(lus[1], u[1] + 1j * u[2])
        return TIj.T @ jnp.stack([x0, xc.real.astype(dtype), xc.imag.astype(dtype)])

    def size_of(d, mu):
        s = _rms(d[:, :m])
        norm = _rms(mu[:, :m])
        return jnp.where(s == 0, 0.0, s / jnp.where(norm > 0, norm, 1.0))

    def cond(s):
        k, _, size, rate = s
        return (k < ADJOINT_MAXITER) & ~(size <= ADJOINT_RTOL) & ~(rate >= SLOW_RATE)

    def body(s):
        k, mu, old, _ = s
        d = precondition(rhs - apply(mu))
        mu = mu + d
        size = size_of(d, mu)
        return k + 1, mu, size, jnp.where(old > 0, size / old, 0.0)

    mu0 = precondition(rhs)
    inf = jnp.asarray(jnp.inf, dtype)
    _, mu, size, rate = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), mu0, inf, jnp.zeros((), dtype)))
    ok = (size <= ADJOINT_RTOL) & jnp.all(jnp.isfinite(mu))
    return ok, mu, jnp.where(jnp.isfinite(rate), rate, inf)


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
    apply_mass = (lambda v: v) if M is None else M.apply
    apply_mass_t = (lambda v: v) if M is None else M.apply_t
    Cj = jnp.asarray(_radau.C, dtype)
    steps = marks[-1]
    # the cotangents each state receives (output times and every step)
    given = jnp.zeros_like(states).at[marks].add(ct)
    if ct_states is not None:
        given = given + ct_states

    def stages_field(cs, y, Z, t, h):
        return jax.vmap(lambda c, z: field(cs, t + c * h, y + z))(Cj, Z)

    def attempt(lam, t, h, y, y1, f0, f1, J, lus, lu_h, renew, live):
        """The step's stages and `mu`, with the Jacobian `J` (evaluated at
        the step's start where `renew`) and the factorizations `lus` (made
        again where `renew` or the step size changed): `(ok, Z, mu, J, lus,
        lu_h, slow)`; `slow`: the next step should evaluate the Jacobian."""
        J = jax.lax.cond(renew, lambda: linear.jacobian(t, y), lambda: J)
        need = renew | (lu_h != h)
        lus = refactored(linear, lus, J, h, need & live)
        lu_h = jnp.where(need, h, lu_h)
        Z0 = hermite_stages(y, y1, f0, f1, h) if M is None else Cj[:, None] * (y1 - y)
        scale = atol + jnp.abs(y) * rtol
        done, iters, Z, rate_z, _ = _radau.newton(
            lambda s, v: field(consts, s, v), linear, apply_mass, t, y, h, Z0, lus, scale, m=m,
            tol=STAGE_TOL, maxiter=NEWTON_MAXITER)
        _, pull = jax.vjp(lambda Z: stages_field(consts, y, Z, t, h), Z)
        rhs = jnp.zeros((3, n), dtype).at[2].set(lam)
        ok, mu, rate_mu = _transposed(linear, apply_mass_t, lambda v: pull(v)[0], lus, h, rhs,
                                      m)
        slow = (rate_mu > RENEW_RATE) | ((iters > 4) & (rate_z > RENEW_RATE))
        return done & ok, Z, mu, J, lus, lu_h, slow

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

        # a first try with what the later step left; a second with the
        # Jacobian at the step's start, where the first failed without it
        def try_cond(p):
            i, ok, renewed = p[:3]
            return (i == 0) | ((i == 1) & ~ok & ~renewed)

        def try_body(p):
            i, _, renewed, _, _, J, lus, lu_h, _ = p
            fresh = (i > 0) | renew
            ok, Z, mu, J, lus, lu_h, slow = attempt(lam, t, h, y, y1, f0, f1, J, lus, lu_h,
                                                    fresh, live & try_cond(p))
            return i + 1, ok, renewed | fresh, Z, mu, J, lus, lu_h, slow

        zeros = jnp.zeros((3, n), dtype)
        no = jnp.asarray(False)
        _, ok, _, Z, mu, J, lus, lu_h, slow = jax.lax.while_loop(
            try_cond, try_body, (jnp.asarray(0, jnp.int32), no, no, zeros, zeros, J, lus, lu_h,
                                 no))
        _, pull = jax.vjp(lambda cs, y, Z: stages_field(cs, y, Z, t, h), consts, y, Z)
        cbar, ybar, _ = pull(mu)
        lam = lam + ybar + given[kk]
        acc = jax.tree_util.tree_map(jnp.add, acc, cbar)
        finite = jnp.all(jnp.isfinite(mu)) & jnp.all(jnp.isfinite(Z))
        failed = live & ~ok
        status = jnp.where(failed, jnp.where(finite, FAILED, NONFINITE), status)
        return (k - 1, lam, acc, f0, J, lus, lu_h, slow, status.astype(jnp.int32),
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
