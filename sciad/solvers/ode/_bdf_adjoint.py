"""The discrete adjoint of BDF's accepted steps (`_bdf`), as one JAX loop
down the recorded steps (`adjoint`), with the forward loop's linear algebra
(`_bdf._Linear`). Plain JAX: `sciad.primitives._ode_bdf_adjoint` lowers its
`ode.bdf_adjoint` node to it.

The pass is `_ode_bdf_adjoint._in_ops`'s (the module docstring there
derives it): step `k`, of order `q` and `c = h / alpha_q`, maps the
cotangent `L` of the differences after it to that of the differences
before it, through the transposed cumulative sums, one solve

    (M - c J)^T mu = lambda_d,    J = df/dy at the step's result,

one VJP of the field there (`c J^T mu` to the predicted state, `c
(df/dconsts)^T mu` to the consts) and the rescaling `R^T`. The sciad-ops
pass forms `J` and factors `M - c J` at every step through a `linalg.solve`
node. Here:

- where a factorization costs about as much as a few solves
  (`_Linear.direct`: a narrow band, factored by the banded LU; a small dense
  matrix), each step's own matrix is factored and solved once;
- else (KLU's general sparse LU, a large dense LU) a factorization `P = M -
  c' J'` is kept over steps, and the exact transposed system solved by the
  iteration it preconditions,

      mu <- mu + P^-T (lambda_d - (M - c J)^T mu),

  whose products `J^T mu` are VJPs of the field at the step's result, to
  `ADJOINT_RTOL`. `P` is made again where `c` has moved by more than
  `REFACTOR` of itself from the factorization's, with a Jacobian evaluated
  again where the last step's iteration was slower than `RENEW_RATE`. A step
  whose iteration fails (stalls, is slower than `SLOW_RATE`, or meets values
  that are not finite) is done again with the Jacobian at its result,
  factored afresh (then `P` is the step's own matrix).

A step that fails stops the pass (`_radau_adjoint.step_status`: `FAILED`,
or `NONFINITE` where the field's derivative was not finite). Every direction (a row of cotangents:
`jacrev`, a batch of reverse passes over the same steps) is solved with
the same factorizations. Measured on the 1,024-state Brusselator: the
sciad-ops pass 52 ms (KLU, a factorization a step); this loop with KLU's
kept factor 40-45 ms (about six iterations a step, a fifth of the steps
factored), with the banded LU 25-30 ms.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _bdf
from ._radau_adjoint import richardson, step_status
from ._steps import mass_of, product, refactored, released

#: the transposed system's iteration: converged where its last correction
#: is this fraction of its solution; its most iterations; the rate above
#: which it is abandoned (and the step done again with a fresh Jacobian)
ADJOINT_RTOL, ADJOINT_MAXITER, SLOW_RATE = 1e-9, 30, 0.5
#: the factorization is made again where `c` has moved by more than this
#: fraction from the factorization's
REFACTOR = 0.05
#: a step whose iteration converged slower than this asks the next one for
#: a fresh Jacobian
RENEW_RATE = 0.05
#: the rows of the differences (orders up to `MAX_ORDER`, and two more),
#: and those a step size change rescales
ROWS = _bdf.MAX_ORDER + 3
RESCALED = _bdf.MAX_ORDER + 1
#: the positions of `R^T`'s entries in the record's flat `R`
TRANSPOSED = np.arange(RESCALED ** 2).reshape(RESCALED, RESCALED).T.ravel()


def adjoint(field: Callable, consts, grid, marks, states, history, ct, ct_states=None, *,
            jac: str = "dense", pattern=None, mass=None):
    """The cotangents of `consts` (a tuple of arrays, `field(consts, t, y)`'s
    first argument) and of the initial state from `ct`, the cotangents of
    the states at the output times (`(directions, len(marks), n)`; output
    `i` is the state after `marks[i]` steps), and `ct_states`, those of the
    states at every step (or None), through the steps the forward loop
    recorded (`grid`, `states`, `history`: `(max_steps + 1, ...)`). Every
    direction is solved with the same factorizations. `(consts_bar, y0_bar,
    status, t_failed, nlu)` (each cotangent with the leading `directions`
    axis; `nlu`: the factorizations made), status 0, or `FAILED` or
    `NONFINITE` at the step to `t_failed` (the pass stopped there: its
    results NaN). `jac`, `pattern`, `mass`: as `_bdf.integrate` took them."""
    n, dtype, B = states.shape[1], states.dtype, ct.shape[0]
    at = lambda t, y: field(consts, t, y)  # noqa: E731
    M = mass_of(mass, jac, pattern, n, dtype)
    algebraic = None if M is None else M.algebraic
    linear = _bdf._sparse_linear(at, pattern, mass, algebraic, dtype) if jac == "sparse" \
        else _bdf._dense_linear(at, n, mass, dtype, algebraic)
    apply_t = (lambda v: v) if M is None else M.apply_t
    deriv_t = (lambda v: v) if M is None else M.derivative_t
    alpha = jnp.asarray(_bdf.ALPHA, dtype)
    gamma = jnp.asarray(np.concatenate([_bdf.GAMMA, np.zeros(ROWS - _bdf.GAMMA.size)]), dtype)
    rows = jnp.arange(ROWS)[:, None, None]  # (L: (ROWS, directions, n))
    lower = jnp.asarray(np.tril(np.ones((ROWS, ROWS))), dtype)
    eye = jnp.eye(ROWS, dtype=dtype)
    steps = marks[-1]

    def given(k):
        """The cotangent the state after `k` steps receives (`(directions,
        n)`: the output times' there, and its own at every step)."""
        g = jnp.sum(jnp.where((marks == k)[None, :, None], ct, 0.0), axis=1)
        return g if ct_states is None else g + ct_states[:, k]

    def solve(t, y, c, lam, pull, J, lu, lu_c, renew, live):
        """`mu` with `(M - c J)^T mu = lam` at `(t, y)` (`pull`: the field's
        VJP there): where a factorization is cheap (`linear.direct`), by the
        step's own matrix factored; else a first try with the kept `J` (made
        again where `renew`) and factorization (made again where `c` moved),
        a second, where that failed, with the Jacobian at `(t, y)` factored
        afresh. `(ok, mu, J, lu, lu_c, renew, made)`: `renew`, the next step
        should evaluate the Jacobian again; `made`, the factorizations made."""
        if linear.direct:  # (the step's own matrix, factored)
            J = linear.jacobian(t, y)
            lu = linear.factor(J, c)
            mu = jax.vmap(lambda v: linear.solve_t(lu, v))(lam)
            return jnp.all(jnp.isfinite(mu)), mu, J, lu, c, renew, jnp.asarray(1, jnp.int32)

        def a_t(x):  # (M - c J)^T x, each direction
            return jax.vmap(lambda v: apply_t(v) - c * pull(v)[1])(x)

        # (a loop of at most two passes, not a `lax.cond`: as `_bdf`'s, for
        # the kept factors' swaps under `jax.vmap`)
        def cond(p):
            k, ok = p[0], p[1]
            return (k == 0) | ((k == 1) & ~ok)

        def body(p):
            k, _, mu, rate, J, lu, lu_c, renew, made = p
            fresh = renew | (k > 0)
            J = jax.lax.cond(fresh, lambda: linear.jacobian(t, y), lambda: J)
            need = fresh | ~(jnp.abs(c - lu_c) <= REFACTOR * jnp.abs(c))
            lu = refactored(linear, lu, J, c, need & live & cond(p))
            lu_c = jnp.where(need, c, lu_c)
            ok, mu, rate = richardson(
                a_t, lambda r: jax.vmap(lambda v: linear.solve_t(lu, v))(r), lam,
                rtol=ADJOINT_RTOL, maxiter=ADJOINT_MAXITER, slow=SLOW_RATE)
            return (k + 1, ok, mu, rate, J, lu, lu_c, jnp.asarray(False),
                    made + need.astype(jnp.int32))

        _, ok, mu, rate, J, lu, lu_c, _, made = jax.lax.while_loop(
            cond, body, (jnp.asarray(0, jnp.int32), jnp.asarray(False), jnp.zeros_like(lam),
                         jnp.zeros((), dtype), J, lu, lu_c, renew, jnp.asarray(0, jnp.int32)))
        return ok, mu, J, lu, lu_c, rate > RENEW_RATE, made

    def cond(s):
        k, status = s[0], s[-3]
        return (k >= 0) & (status == 0)

    def body(s):
        k, L, acc, J, lu, lu_c, renew, status, t_failed, nlu = s
        live = k >= 0  # (a batch's finished example runs the body too: its step 0 again)
        kk = jnp.maximum(k, 0)
        L = jnp.concatenate([L[:1] + given(kk + 1)[None], L[1:]])
        record = history[kk + 1]
        q = record[0].astype(jnp.int32)
        # (R^T read from the record transposed: a dot on R.T XLA's CPU
        # backend runs by a slow generic kernel, 18 us a step here)
        RT = record[1 + TRANSPOSED].reshape(RESCALED, RESCALED)
        t, y = grid[kk + 1], states[kk + 1]
        aq = alpha[q]
        c = (t - grid[kk]) / aq
        # The step's map of L, linear but for the solve's terms, composed
        # as small matrices first (ROWS x ROWS: the transposed cumulative
        # sums D_i += D_{i+1}, i = q, ..., 0; the moves of rows q + 1 and
        # q + 2, as selects; R^T, one product with the solve terms' weights
        # u and v), then applied to L once, as [G; w] L: `lam = w L`, and
        # after the solve `L <- G L + u ybar - v M^T mu`. Two calls of XLA's
        # matrix kernel a step. (Applied to L in turn, each a pass over it,
        # XLA fused their selects into every consumer and computed them
        # again there: most of a step's time.)
        r = rows[:, 0, 0]
        P1 = jnp.where(r[:, None] <= q + 1, lower, eye)
        w = P1[q + 1] + P1[q + 2]
        Q = jnp.where(r[:, None] == q + 1, -P1[q + 2][None],
                      jnp.where(r[:, None] == q + 2, 0.0, P1))
        psi = jnp.where((r >= 1) & (r <= q), gamma, 0.0) / aq
        Quv = jnp.concatenate([Q, (r <= q).astype(dtype)[:, None], psi[:, None]], axis=1)
        Quv = jnp.concatenate([product(RT, Quv[:RESCALED]), Quv[RESCALED:]])
        G, u, v = Quv[:, :ROWS], Quv[:, ROWS], Quv[:, ROWS + 1]
        # (`L`'s rows mapped as one 2-D product: XLA's matrix kernel reads
        # `L` where it is, where an einsum with the rows second transposed
        # it there and back, a third of the pass's time; on a few states,
        # written out)
        GL = product(jnp.concatenate([G, w[None]]), L)
        lam = GL[ROWS]
        _, pull = jax.vjp(lambda cs, z: field(cs, t, z), consts, y)
        ok, mu, J, lu, lu_c, renew, made = solve(t, y, c, lam, pull, J, lu, lu_c, renew, live)
        cbar, ybar = jax.vmap(pull)(c * mu)
        L = GL[:ROWS] + u[:, None, None] * ybar[None] \
            - v[:, None, None] * jax.vmap(apply_t)(mu)[None]
        acc = jax.tree_util.tree_map(jnp.add, acc, cbar)
        bad = step_status(live, ok, mu, ybar, cbar)
        return (k - 1, L, acc, J, lu, lu_c, renew, jnp.where(bad != 0, bad, status).astype(
            jnp.int32), jnp.where(bad != 0, t, t_failed), nlu + made)

    last = jnp.maximum(steps - 1, 0)
    J0 = linear.jacobian(grid[last + 1], states[last + 1])
    lu0 = linear.factor(J0, jnp.ones((), dtype))
    acc0 = jax.tree_util.tree_map(lambda c: jnp.zeros((B,) + c.shape, c.dtype), consts)
    s0 = (steps - 1, jnp.zeros((ROWS, B, n), dtype), acc0, J0, lu0,
          jnp.asarray(jnp.nan, dtype), jnp.asarray(False), jnp.asarray(0, jnp.int32),
          jnp.asarray(jnp.nan, dtype), jnp.asarray(0, jnp.int32))
    _, L, acc, _, lu, _, _, status, t_failed, nlu = jax.lax.while_loop(cond, body, s0)
    # the first differences [y0, P f(t0, y0), 0, ...] (h0 is in the first R)
    _, pull0 = jax.vjp(lambda cs, z: field(cs, grid[0], z), consts, states[0])
    cbar0, ybar0 = jax.vmap(pull0)(jax.vmap(deriv_t)(L[1]))
    ybar0 = ybar0 + L[0] + given(0)
    acc = jax.tree_util.tree_map(jnp.add, acc, cbar0)
    status = status + released(linear, lu, after=[ybar0, *jax.tree_util.tree_leaves(acc)])
    failed = status != 0
    acc = jax.tree_util.tree_map(lambda a: jnp.where(failed, jnp.nan, a), acc)
    return acc, jnp.where(failed, jnp.nan, ybar0), status, t_failed, nlu
