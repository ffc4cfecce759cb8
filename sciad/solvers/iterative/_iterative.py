"""The machinery of the Krylov solvers on a matrix-free `matvec` (the records
`_cg.py` and `_gmres.py`, through lineax, and `_bicgstab.py`), each with an
optional preconditioner: any linear `v -> M^-1 v` (the records of the
"preconditioner" family, `AbstractPreconditioner`: `_jacobi.py`, `_amg.py`).

`solve` returns `(x, converged, relative_residual, steps)`; it never raises.
Converged means `||A x - b||_2 <= rtol ||b||_2 + atol` with everything
finite. A matrix of right-hand sides is solved column by column (`jax.vmap`).

Each column is solved in scaled units, so that neither its size nor the
matrix's reaches the solvers (whose squared norms and dot products over- or
underflow beyond about 1e+-154, and whose GMRES takes a residual below
machine epsilon, absolutely, for a breakdown):

    u = b / s,   B = k A,   B y = u,   x = s k y

with `s` and `k` powers of two (exact), `s` from `max |b|` and `k` from
`max |A u|`. The test becomes `||u - B y|| <= rtol ||u|| + atol / s`,
the same inequality divided by `s`, so every tolerance is relative to the
column's own size; `atol` is added, never substituted for it. A zero
column gives `x = 0` exactly, with no step taken.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import StructureError
from .._registry import lookup

_HIGHEST = lax.Precision.HIGHEST


def _pow2(e, dtype):
    """`2**e` exactly, built from its bits (`e` is clipped to the normal range).
    (Not `jnp.ldexp`: XLA flushes subnormal intermediates, so it is not exact.)"""
    fi = jnp.finfo(dtype)
    itype = jnp.dtype(f"int{fi.bits}")
    bias = fi.maxexp - 1
    e = jnp.clip(e, fi.minexp, bias).astype(itype)
    return lax.bitcast_convert_type((e + bias) << fi.nmant, dtype)


def _exponent(v):
    """`e` with `max |v| / 2**e` in `[0.5, 1)` (read from its bits), clipped
    so that `2**±e` are normal; 0 for a zero or non-finite `v`. Also
    whether `v == 0`."""
    fi = jnp.finfo(v.dtype)
    m = jnp.max(jnp.abs(v))
    field = lax.bitcast_convert_type(m, jnp.dtype(f"int{fi.bits}")) >> fi.nmant
    e = jnp.clip(field - (fi.maxexp - 2), fi.minexp, fi.maxexp - 2)
    return jnp.where(jnp.isfinite(m) & (m > 0), e, 0), m == 0


def bicgstab(op: Callable, u, tol, maxiter: int, restarts: int = 3):
    """BiCGStab (van der Vorst 1992) for `op(z) = u` from `z = 0`, until
    `||u - op(z)||_2 <= tol`; returns `(z, steps)`.

    Written here because `lx.BiCGStab` forms `omega = (t.s) / (t.t)` even
    after the half step has solved the system (`s = 0`, so `t = 0`): the
    identity matrix, or any `b` that is an eigenvector, gives NaN. Here the
    half step's iterate is kept, and a breakdown (`rho`, `rhat.v`, `omega`
    zero, or a non-finite iterate) stops with the last finite iterate.

    A cycle runs until its updated residual is `<= tol / 2`; the true one
    can drift above `tol`, so a cycle whose true residual is too large is
    followed by another from its iterate (at most `restarts` more)."""
    one = jnp.ones((), u.dtype)
    dot = lambda a, c: jnp.dot(a, c, precision=_HIGHEST)  # noqa: E731

    def cycle(z, r, steps):
        rhat, zero = r, jnp.zeros_like(r)

        def cond(c):
            *_, step, done = c
            return ~done & (step < maxiter)

        def body(c):
            z, r, p, v, rho, alpha, omega, step, _ = c
            rho_new = dot(rhat, r)
            p_new = r + (rho_new / rho) * (alpha / omega) * (p - omega * v)
            v_new = op(p_new)
            rv = dot(rhat, v_new)
            alpha_new = rho_new / jnp.where(rv == 0, one, rv)
            h = z + alpha_new * p_new
            s = r - alpha_new * v_new
            t = op(s)
            tt = dot(t, t)
            omega_new = jnp.where(tt > 0, dot(t, s) / jnp.where(tt > 0, tt, one), 0)
            half = jnp.linalg.norm(s) <= tol / 2
            z_new = jnp.where(half, h, h + omega_new * s)
            r_new = jnp.where(half, s, s - omega_new * t)
            broken = (rho_new == 0) | (rv == 0) | ~jnp.all(jnp.isfinite(z_new))
            z_new, r_new = jnp.where(broken, z, z_new), jnp.where(broken, r, r_new)
            done = broken | half | (omega_new == 0) | (jnp.linalg.norm(r_new) <= tol / 2)
            return (z_new, r_new, p_new, v_new, rho_new, alpha_new, omega_new, step + 1,
                    done)

        init = (z, r, zero, zero, one, one, one, steps, jnp.linalg.norm(r) <= tol / 2)
        out = lax.while_loop(cond, body, init)
        return out[0], out[7]

    def cond(c):
        _, r, steps, k = c
        return (jnp.linalg.norm(r) > tol) & (steps < maxiter) & (k <= restarts)

    def body(c):
        z, r, steps, k = c
        z, steps = cycle(z, r, steps)
        return z, u - op(z), steps, k + 1

    z, _, steps, _ = lax.while_loop(cond, body, (jnp.zeros_like(u), u, jnp.array(0), 0))
    return z, steps


def lineax_solve(solver_cls, op: Callable, u, rtol: float, tol, maxiter: int, *,
                 spd: bool = False, precond=None):
    """Solves `op(y) = u` to `||u - op(y)||_2 <= tol` with lineax's
    `solver_cls` (`lx.CG`, `lx.GMRES`); returns `(y, steps)`. `spd`: the
    operator is tagged symmetric positive semidefinite (CG's); `precond`: a
    left preconditioner `v -> M^-1 v` (symmetric positive semidefinite:
    CG's). (lineax, with equinox, is imported where a solve is traced, not
    with sciad: it would add about 0.2 s to `import sciad`.)"""
    import lineax as lx

    spd_tags = (lx.positive_semidefinite_tag, lx.symmetric_tag)
    # lineax's test is elementwise, `|r_i| <= atol + rtol |u_i|` for all i
    # (and `|diff_i| <= atol + rtol |y_i|` for its last step). With
    # atol = tol / (2 sqrt(n)) and rtol / 2 the right-hand sides have a 2-norm
    # <= tol/2 + rtol ||u|| / 2 <= tol, so meeting it implies the 2-norm
    # test (no false success), and a residual spread evenly meets it at about
    # ||r|| = tol/2. atol > 0 even where u_i = 0 (a localized source).
    n = u.size
    method = solver_cls(rtol=rtol / 2, atol=tol / (2 * n**0.5), max_steps=maxiter)
    struct = jax.ShapeDtypeStruct(u.shape, u.dtype)
    operator = lx.FunctionLinearOperator(op, struct, tags=spd_tags if spd else ())
    # the first iterate, zero, behind a barrier: lineax's first residual is
    # `u - op(y0)`, and a zero that XLA sees as a constant makes `op(0)` a
    # gather of constants, which XLA's constant folding evaluates element by
    # element at compile time (49 s for a 2 * 10^7-entry matrix, against
    # 1.2 s with the barrier; the product at run time costs milliseconds)
    options = {"y0": jax.lax.optimization_barrier(jnp.zeros_like(u))}
    if precond is not None:
        options["preconditioner"] = lx.FunctionLinearOperator(precond, struct, tags=spd_tags)
    sol = lx.linear_solve(operator, u, method, options=options, throw=False)
    return sol.value, sol.stats["num_steps"]


def _solve_vector(matvec: Callable, b, method, rtol: float, atol: float,
                  maxiter: int | None, precond):
    e_b, b_zero = _exponent(b)
    u = b * _pow2(-e_b, b.dtype)
    # GMRES and BiCGStab are preconditioned on the right, `A M z = u` with
    # `y = M z`, so that the residual they test is the true one (lineax's
    # GMRES tests `M r` against a scale made from `b`). CG needs a
    # symmetric preconditioner and takes it on the left.
    right = None if method.left_preconditioned else precond

    def precondition(z):
        return z if right is None else right(z)

    e_a, _ = _exponent(matvec(precondition(u)))
    k = _pow2(-e_a, b.dtype)

    def op(z):
        return k * matvec(precondition(z))

    unorm = jnp.linalg.norm(u)
    atol_u = atol * _pow2(-e_b, b.dtype)  # inf if it overflows: then any x does
    tol = rtol * unorm + atol_u
    left = None
    if method.left_preconditioned and precond is not None:  # ~ (k A)^-1 = A^-1 / k
        left = lambda v: precond(v) * _pow2(e_a, b.dtype)  # noqa: E731
    z, steps = method.krylov(op, u, rtol, tol, 10 * u.size if maxiter is None else maxiter,
                             left)
    y = precondition(z)
    # x = s k y = y 2**d, |d| <= 2044: two normal factors with exponents of
    # one sign, so the product is exact unless x itself over- or underflows.
    # Then `y_x`, the y that the returned x stands for, is not y, and it is
    # y_x whose residual is judged.
    d = e_b - e_a
    d1 = jnp.clip(d, jnp.finfo(b.dtype).minexp, -jnp.finfo(b.dtype).minexp)
    f1, f2 = _pow2(d1, b.dtype), _pow2(d - d1, b.dtype)
    x = y * f1 * f2
    y_x = x / f2 / f1
    rnorm = jnp.linalg.norm(u - k * matvec(y_x))
    ok = jnp.all(jnp.isfinite(x)) & jnp.isfinite(rnorm) & (rnorm <= tol)
    rel = rnorm / jnp.where(b_zero, 1, unorm)
    x = jnp.where(b_zero, 0, x)
    return (x, ok | b_zero, jnp.where(b_zero, 0, rel),
            jnp.where(b_zero, 0, steps).astype(jnp.int32))


def solve(matvec: Callable, b, *, method, rtol: float, atol: float,
          maxiter: int | None, precond: Callable | None = None):
    """Solves `matvec(x) = b` for `b` of shape `(n,)` or `(n, k)` with the
    Krylov method `method` (an `AbstractIterativeSolver`, or its name);
    `precond`: `v -> M^-1 v` with `M ~ A` (linear; symmetric positive
    definite for CG), or None."""
    if isinstance(method, str):
        method = lookup(method, "linear")
    assert not method.direct, f"{method.name!r} is not an iterative solver"
    if b.shape[0] == 0:  # a system of no unknowns: solved, in no steps (NumPy's answer)
        zero = jnp.zeros((), b.real.dtype)
        return b, jnp.ones((), bool), zero, jnp.zeros((), jnp.int32)
    if b.ndim == 1:
        return _solve_vector(matvec, b, method, rtol, atol, maxiter, precond)
    cols = jax.vmap(lambda col: _solve_vector(matvec, col, method, rtol, atol, maxiter,
                                              precond), in_axes=1, out_axes=(1, 0, 0, 0))
    x, ok, rel, steps = cols(b)
    return x, jnp.all(ok), jnp.max(rel), jnp.max(steps)


def missing_diagonal(pattern, who: str, shown: str = ""):
    """A preconditioner's refusal (`rejects`' form) of `pattern` where it
    does not store every diagonal entry, which `who` divides by; None where
    it does."""
    if not np.any(pattern.diagonal_positions() < 0):
        return None
    return StructureError, (
        f"{who} needs every diagonal entry stored; {shown or 'the matrix'} lacks some. Store "
        "it explicitly, zeros included (SciPy: `A.setdiag(A.diagonal())`).")


class AbstractPreconditioner:
    """A preconditioner: a record registered in the `"preconditioner"` family,
    named by `linalg.solve`'s `preconditioner` param.

    - `name`: the param's value.
    - `matrices`: which of "dense", "sparse" it takes (a matrix-free
      operator takes none).
    - `where`: where its setup runs, "device" (in the program) or "host".
    - `rejects(matrix=, pattern=, shown=)`: why it cannot precondition such
      a matrix, `(exception class, message)`, or None (asked at trace time).
    - `setup(a, pattern=, after=)`: its state (a tuple of arrays) from the
      matrix's values `a` (dense, or on `pattern`), in the program (possibly
      a host call); the same state serves the transposed solve. `after`: the
      solve's right-hand side, which a host setup may wait for (an adjoint
      solve's then builds its state after the forward solve ran, not beside
      it); others ignore it.
    - `apply(state, a, v, pattern=, transpose=)`: `M^-1 v` with `M ~ op(A)`,
      a JAX function, linear in `v`; symmetric positive definite for an spd
      `A` (CG needs it).
    - `setup_bytes`, `apply_flops`, `describe`: its cost (`sd.cost`): the
      memory its state takes, the FLOPs of one application, a note.
    - `shardable`: it runs in a sharded solve (`partition=`), each device on
      its rows; `partitioned`: it is built over a row partition's blocks and
      runs only there (block-AMG: its setup and application are the sharded
      solve's own, `sciad.primitives._sparse_sharded`); `partitioned_cost`
      `(pattern, partition, itemsize) -> (flops, bytes, note)` is then its cost.
    """

    family = "preconditioner"
    name: str
    matrices: frozenset = frozenset({"dense", "sparse"})
    where: str = "device"
    shardable: bool = False
    partitioned: bool = False

    def rejects_partition(self, pattern, *, shown: str = ""):
        """Why it cannot precondition a sharded solve of a matrix on
        `pattern`, `(exception class, message)`, or None."""
        return None

    def partitioned_cost(self, pattern, partition, itemsize: int):
        raise NotImplementedError

    def rejects(self, *, matrix: str, pattern=None, shown: str = ""):
        return None

    def setup(self, a, *, pattern=None, after=None) -> tuple:
        raise NotImplementedError

    def apply(self, state, a, v, *, pattern=None, transpose: bool = False):
        raise NotImplementedError

    def setup_bytes(self, n: int, pattern, dtype) -> int:
        return 0

    def apply_flops(self, n: int, pattern) -> float:
        return 0.0

    def describe(self, n: int, pattern, dtype) -> str:
        return self.name
