"""Radau IIA of order 5: the three-stage collocation method of Hairer and
Wanner's RADAU5 ("Solving ODEs II", IV.8; the layout of SciPy's `Radau`),
as one `jax.lax.while_loop`. Plain JAX, no graph: `ode.odeint`'s lowering
calls `integrate` for the steppers whose `lowering` is "radau".

Each step solves the stages' collocation system by a simplified Newton
iteration in the variables `W = T^-1 Z` that split it into one real system
`(mu_r / h - J) w_0 = ...` and one complex one `(mu_c / h - J) (w_1 + i
w_2) = ...` (the eigenvalues of the method's `A^-1`): two factorizations per
Jacobian and step size, each reused until the step size changes. `J` is
evaluated again where the iteration fails with a stale one, or where it
converged slowly (as RADAU5). The step size follows Gustafsson's predictive
controller from the embedded error estimate (filtered through the real
factorization), held where it would grow by less than `HOLD` so that the
factorizations are kept. Steps land on every output time. The dense output
is the collocation polynomial, which also starts each step's iteration.

Iteration matrices dense (`jax.scipy.linalg`, complex for the complex one)
or sparse on the pattern of `df/dy` (the complex system as a real one of
twice the size, `[[a - J, -b], [b, a - J]]`): factored by KLU in the program
and kept over steps as handles (`_kept_klu`) on the CPU, by SuperLU on the
host elsewhere.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from ..direct import _band, _small_lu
from . import _kept_klu, _ode
from ._bdf import _rms, initial_step
from ._steps import (Counts, Result, Track, advance, blank, finish, inconsistent, mass_of,
                     newton_tolerance, newton_verdict, propose, refactored, released, run,
                     start, values_finite)

S6 = 6.0 ** 0.5
#: the nodes, and the Butcher matrix of Radau IIA (order 5)
C = np.array([(4 - S6) / 10, (4 + S6) / 10, 1.0])
A = np.array([[(88 - 7 * S6) / 360, (296 - 169 * S6) / 1800, (-2 + 3 * S6) / 225],
              [(296 + 169 * S6) / 1800, (88 + 7 * S6) / 360, (-2 - 3 * S6) / 225],
              [(16 - S6) / 36, (16 + S6) / 36, 1 / 9]])
#: the embedded error estimate's weights on the stages (Hairer and Wanner,
#: IV.8, (8.20): `err = (mu_r / h - J)^-1 (f0 + Z^T E / h)`)
E = np.array([-13 - 7 * S6, -13 + 7 * S6, -1.0]) / 3
NEWTON_MAXITER = 6
MIN_FACTOR, MAX_FACTOR = 0.2, 10.0
#: a step size that would grow by less than this is held (the
#: factorizations kept)
HOLD = 1.2


@functools.lru_cache(maxsize=None)
def constants():
    """`(mu_real, mu_complex, T, TI, P)`: `A^-1`'s real eigenvalue and the
    complex one the transformed system solves with, the transformation (`Z
    = T W`, `TI = T^-1`, `TI A^-1 T` block diagonal), and `P`, the
    collocation polynomial's coefficients from the stages (`y(t0 + x h) =
    y0 + (Z^T P) [x, x^2, x^3]`)."""
    lam, V = np.linalg.eig(np.linalg.inv(A))
    real = int(np.argmin(np.abs(lam.imag)))
    cplx = int(np.argmax(lam.imag))  # the eigenvalue alpha + i beta, beta > 0
    v_r = V[:, real].real
    v_c = V[:, cplx]
    T = np.stack([v_r / v_r[-1], v_c.real, v_c.imag], axis=1)
    TI = np.linalg.inv(T)
    # TI A^-1 T = [[mu_r, 0, 0], [0, a, b], [0, -b, a]]: w_1 + i w_2 solves
    # with a - i b
    mu_real = float(lam[real].real)
    mu_complex = complex(lam[cplx].real, -lam[cplx].imag)
    V3 = np.stack([C, C ** 2, C ** 3], axis=1)
    P = np.linalg.inv(V3).T
    return mu_real, mu_complex, T, TI, P


class _Linear(NamedTuple):
    jacobian: Callable   # (t, y) -> J
    factor: Callable     # (J, h) -> (real factorization, complex factorization)
    solve_real: Callable     # (lu, b) -> x
    solve_complex: Callable  # (lu, b) -> x (complex b)
    #: as BDF's (`_steps.refactored`, `_steps.released`): kept KLU factors
    refactor: Callable | None = None
    release: Callable | None = None
    #: the transposed solves with the same factors, for the discrete adjoint
    #: (`_radau_adjoint`): `A^T x = b` with the real one, `C^H x = b` with the
    #: complex one (conjugate-transposed: the transpose of its real form
    #: `[[X, Y], [-Y, X]]` of `C = X - iY`)
    solve_real_t: Callable | None = None
    solve_complex_h: Callable | None = None
    #: the solves take a matrix of right-hand sides, `(n, k)` (not the
    #: host's SuperLU: one vector a call)
    columns: bool = True


def _dense_linear(field, n, dtype, mass=None):
    mu_r, mu_c, *_ = constants()
    M = jnp.eye(n, dtype=dtype) if mass is None else jnp.asarray(mass, dtype)
    cdtype = jnp.result_type(dtype, jnp.complex64)

    def jacobian(t, y):
        return jax.jacfwd(lambda z: field(t, z))(y)

    def factor(J, h):
        real = _small_lu.lu_factor(mu_r / h * M - J)
        cplx = _small_lu.lu_factor((mu_c / h) * M.astype(cdtype) - J.astype(cdtype))
        return real, cplx

    lu_solve = _small_lu.lu_solve
    return _Linear(jacobian, factor, lu_solve, lu_solve,
                   solve_real_t=lambda lu, b: lu_solve(lu, b, trans=1),
                   solve_complex_h=lambda lu, b: lu_solve(lu, b, trans=2))


@functools.lru_cache(maxsize=32)
def _doubled(pattern):
    """The pattern of `[[P, I], [I, P]]` (`P` with its diagonal), and where
    its entries come from: `(pattern2, from_P, diagonal_of_block)` with
    `from_P[k]` the entry of `P` at position `k` (or -1) and the block
    diagonals' positions (-1 elsewhere): `(upper right, lower left)`."""
    n = pattern.shape[0]
    p = sp.csr_matrix((np.arange(1, pattern.nnz + 1, dtype=np.float64), pattern.indices,
                       pattern.indptr), shape=pattern.shape)
    big = sp.bmat([[p, -sp.eye(n)], [-2 * sp.eye(n), p]], format="csr")
    big.sort_indices()
    vals = big.data
    from_p = np.where(vals > 0, vals - 1, -1).astype(np.int64)
    upper = np.flatnonzero(vals == -1)
    lower = np.flatnonzero(vals == -2)
    pat = type(pattern)(big.shape, big.indptr, big.indices)
    for a in (from_p, upper, lower):
        a.setflags(write=False)
    return pat, from_p, upper, lower


def _sparse_linear(field, pattern, mass=None, dtype=None):
    """`mass`: the mass matrix's values on `pattern` (a diagonal one: the
    complex system's off-diagonal blocks, `-+b M`, are on the diagonal), or
    None (the identity). Where the pattern is a narrow band, both systems
    are factored by the banded LU in the program (`_band`; the complex one
    in complex arithmetic). Else the complex system is solved as the real
    one of twice its size on `_doubled`'s pattern, both factored by KLU in
    the program and kept over steps where it can (`_kept_klu`), else by
    SuperLU on the host."""
    mu_r, mu_c, *_ = constants()
    pattern = _ode._with_diagonal(pattern)
    eye = _ode._structure(pattern)[2]
    diagonal = np.asarray(pattern.diagonal_positions())
    from .._coloring import coloring
    from ..nonlinear._nonlinear import colored_values

    colors = coloring(pattern)
    big, from_p, upper, lower = _doubled(pattern)
    n = pattern.shape[0]

    def jacobian(t, y):
        return colored_values(lambda z: field(t, z), pattern, colors)(y)

    def values_of(J, h):
        M = jnp.asarray(eye, J.dtype) if mass is None else mass
        real = mu_r / h * M - J
        a, b = mu_c.real / h, mu_c.imag / h
        block = a * M - J
        values = jnp.where(from_p >= 0, block[jnp.maximum(from_p, 0)], 0.0)
        d = M[diagonal]  # (the rows of the blocks -+b M: M is diagonal)
        return real, values.at[upper].set(-b * d).at[lower].set(b * d)

    def solve_complex_with(solve, lu, rhs, transpose=False):
        # (the doubled real system's transpose is the complex one's
        # conjugate transpose)
        x = solve(big, lu, jnp.concatenate([rhs.real, rhs.imag]), transpose)
        return x[:n] + 1j * x[n:]

    band = _band.Band.of(pattern) if dtype is not None and _band.usable(dtype) else None
    if band is not None:  # (a narrow band: the real and the complex system's LU)
        cdtype = jnp.result_type(dtype, jnp.complex64)

        def band_factor(J, h):
            M = jnp.asarray(eye, J.dtype) if mass is None else mass
            return (band.factor(mu_r / h * M - J),
                    band.factor((mu_c / h) * M.astype(cdtype) - J.astype(cdtype)))

        return _Linear(jacobian, band_factor, band.solve, band.solve,
                       solve_real_t=lambda lu, b: band.solve(lu, b, 1),
                       solve_complex_h=lambda lu, b: band.solve(lu, b, 2))

    if dtype is not None and _kept_klu.usable(dtype):  # (KLU in the program, kept)
        def factor(J, h):  # (the start: no factors yet, `refactor` makes them)
            real, values = values_of(J, h)
            return (real, _kept_klu.none()), (values, _kept_klu.none())

        def refactor(lus, J, h, need):
            made = values_of(J, h)
            return tuple((jnp.where(need, v, lu[0]), _kept_klu.swap(p, need, lu[1], v))
                         for p, v, lu in zip((pattern, big), made, lus))

        def kept_solve(p, lu, b, transpose=False):
            return _kept_klu.solve(p, lu[1], lu[0], b.astype(lu[0].dtype), transpose)

        def release(lus, after):
            return _kept_klu.release(lus[0][1], after) + _kept_klu.release(lus[1][1], after)

        return _Linear(jacobian, factor, lambda lu, b: kept_solve(pattern, lu, b),
                       lambda lu, b: solve_complex_with(kept_solve, lu, b), refactor, release,
                       lambda lu, b: kept_solve(pattern, lu, b, True),
                       lambda lu, b: solve_complex_with(kept_solve, lu, b, True))

    def factor(J, h):
        real, values = values_of(J, h)
        return (real, _ode._factor(pattern, real)), (values, _ode._factor(big, values))

    def host_solve(p, lu, b, transpose=False):
        values, handle = lu
        return _ode._solve(p, handle, values, b.astype(values.dtype), transpose, False)

    return _Linear(jacobian, factor, lambda lu, b: host_solve(pattern, lu, b),
                   lambda lu, b: solve_complex_with(host_solve, lu, b),
                   solve_real_t=lambda lu, b: host_solve(pattern, lu, b, True),
                   solve_complex_h=lambda lu, b: solve_complex_with(host_solve, lu, b, True),
                   columns=False)


def mix(A, X):
    """`A @ X` for a small matrix `A` (`(k, l)`, NumPy's or traced) and the
    rows `X` (`(l, n)`): each row of the result a sum of `l` scaled rows,
    unrolled into elementwise passes that XLA fuses (a 3 x 3 times 3 x n
    product is a library call of its own, and took several times the
    arithmetic's time at n in the thousands)."""
    k, l = A.shape
    # (NumPy's entries as Python floats: weakly typed, they keep X's dtype)
    a = A.tolist() if isinstance(A, np.ndarray) else [[A[i, j] for j in range(l)]
                                                       for i in range(k)]
    return jnp.stack([functools.reduce(lambda acc, j: acc + a[i][j] * X[j], range(1, l),
                                       a[i][0] * X[0]) for i in range(k)])


def newton(field: Callable, linear: _Linear, apply_mass: Callable, t, y, h, Z0, lus, scale, *,
           m: int, tol: float, maxiter: int):
    """The simplified Newton iteration on the collocation system of the step
    from `(t, y)` of size `h`, from the stage increments `Z0` (`(3, n)`), in
    the variables `W = T^-1 Z` with the factorizations `lus` (of `linear`,
    for `h`): `(converged, iterations, Z, rate, evaluations, size)` (`size`:
    the last increment's, taken or not). Converged:
    the increments, scaled by `scale` (the first `m` elements), predicted
    below `tol` (RADAU5's test); failed: a rate of 1 or more, one too slow
    to get there within `maxiter` iterations, or a value not finite."""
    mu_r, mu_c, T, TI, _ = constants()
    dtype = y.dtype
    Cj = jnp.asarray(C, dtype)
    lu_real, lu_complex = lus
    m_real, m_complex = mu_r / h, mu_c / h
    weight = 1.0 / scale  # (once: a multiply per element in each iteration's norm)

    def cond(s):
        k, _, _, _, done, failed = s[:6]
        return (k < maxiter) & ~done & ~failed

    def body(s):
        k, W, Z, old, done, failed, rate, nf = s
        F = jax.vmap(lambda c, z: field(t + c * h, y + z))(Cj, Z)  # (3, n)
        finite = values_finite(F, m)  # (through T^-1 too: 0 * inf is NaN)
        TF = mix(TI, F)
        f_real = TF[0] - m_real * apply_mass(W[0])
        f_complex = jax.lax.complex(TF[1], TF[2]) - m_complex * (
            apply_mass(W[1]) + 1j * apply_mass(W[2]))
        dw_real = linear.solve_real(lu_real, f_real)
        dw_complex = linear.solve_complex(lu_complex, f_complex)
        dW = jnp.stack([dw_real, dw_complex.real.astype(dtype),
                        dw_complex.imag.astype(dtype)])
        size = _rms((dW * weight)[:, :m])  # (the first m elements: as BDF's)
        new_rate = jnp.where(k > 0, size / old, rate)
        bad, ok = newton_verdict(k, size, new_rate, finite, tol=tol, maxiter=maxiter)
        W2 = jnp.where(bad, W, W + dW)
        Z2 = jnp.where(bad, Z, mix(T, W2))
        return k + 1, W2, Z2, size, ok, bad, new_rate, nf + 3

    k, _, Z, size, done, _, rate, nf = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), mix(TI, Z0), Z0, jnp.asarray(jnp.inf, dtype),
                     jnp.asarray(False), jnp.asarray(False),
                     jnp.asarray(jnp.nan, dtype), jnp.asarray(0, jnp.int32)))
    return done, k, Z, rate, nf, size


class _State(NamedTuple):
    tr: Track           # the progress over the output times
    y: jax.Array
    f: jax.Array
    Q: jax.Array        # the last step's collocation polynomial's coefficients (3, n)
    t_old: jax.Array    # and its start
    h_old: jax.Array    # and size (0: none yet)
    err_old: jax.Array  # its error norm (nan: none)
    h_want: jax.Array
    rejected: jax.Array
    J: jax.Array
    J_fresh: jax.Array
    lus: object
    lu_h: jax.Array     # the step size the factorizations are for (nan: none)
    counts: Counts


def integrate(field: Callable, y0, ts, *, rtol: float, atol: float, max_steps: int,
              m: int | None = None, jac: str = "dense", pattern=None, dt0=None, dtmax=None,
              record: bool = True, dense: bool = False, mass=None) -> Result:
    """Integrates `M dy/dt = field(t, y)` from `y(ts[0]) = y0` with Radau
    IIA (see the module docstring); `ts` increasing. `m`: the error control
    reads the first `m` elements (all: None). `mass`: None (the identity),
    a dense `(n, n)` matrix, or (with `jac="sparse"`, a diagonal one) its
    values on `pattern`."""
    *_, P = constants()
    n = y0.shape[0]
    m = n if m is None else m
    dtype = y0.dtype
    t0, t_end = ts[0], ts[-1]
    eps = float(np.finfo(dtype).eps)
    newton_tol = newton_tolerance(rtol, eps)
    linear = _sparse_linear(field, pattern, mass, dtype) if jac == "sparse" else \
        _dense_linear(field, n, dtype, mass)
    M = mass_of(mass, jac, pattern, n, dtype)
    apply_mass = (lambda v: v) if M is None else M.apply
    Cj = jnp.asarray(C, dtype)
    max_step = jnp.inf if dtmax is None else float(dtmax)

    f0 = field(t0, y0)
    deriv = None if M is None else M.derivative
    h0 = initial_step(field, t0, y0, f0, t_end - t0, rtol, atol, m, order=3, deriv=deriv) \
        if dt0 is None else jnp.asarray(dt0, dtype)
    h0 = jnp.minimum(h0, max_step).astype(dtype)
    J0 = linear.jacobian(t0, y0)
    s0 = _State(
        tr=start(t0, ts, inconsistent(M, f0, y0, rtol)),
        y=y0, f=f0, Q=jnp.zeros((3, n), dtype), t_old=t0, h_old=jnp.zeros((), dtype),
        err_old=jnp.asarray(jnp.nan, dtype), h_want=h0, rejected=jnp.asarray(False),
        J=J0, J_fresh=jnp.asarray(True), lus=linear.factor(J0, h0),
        lu_h=jnp.asarray(jnp.nan, dtype),
        counts=Counts(*(jnp.asarray(k, jnp.int32) for k in (
            2 if dt0 is None else 1, 1, 0))))

    def predict(h, h_old, err, err_old):
        """Gustafsson's predictive step factor (SciPy's `predict_factor`)."""
        mult = jnp.where((h_old > 0) & jnp.isfinite(err_old) & (err > 0),
                         h / h_old * (err_old / err) ** 0.25, 1.0)
        return jnp.minimum(1.0, mult) * jnp.where(err > 0, err ** -0.25, jnp.inf)

    def attempt(s: _State):
        live = s.tr.status < 0  # (False only for a batch's finished example)
        t_new, h, land = propose(s.tr, ts, s.h_want, max_step)
        t = s.tr.t
        # the stages started from the last step's collocation polynomial
        x = (t + h * Cj - s.t_old) / jnp.where(s.h_old > 0, s.h_old, 1.0)
        powers = jnp.stack([x, x ** 2, x ** 3], axis=1)  # (3, 3)
        # (u(t) = y_old + Q^T [x, x^2, x^3], and y = u(t_old + h_old))
        Z0 = jnp.where(s.h_old > 0, mix(powers, s.Q) - (s.Q[0] + s.Q[1] + s.Q[2]), 0.0)
        scale = atol + jnp.abs(s.y) * rtol

        def pass_cond(p):
            k, done, fresh = p[0], p[1], p[3]
            return (k == 0) | ((k == 1) & ~done & ~fresh)

        def pass_body(p):
            k, _, J, fresh, lus, lu_h, _, _, _, counts = p
            renew = k > 0
            J = jax.lax.cond(renew, lambda: linear.jacobian(t, s.y), lambda: J)
            fresh = fresh | renew
            refactor = renew | (lu_h != h)
            lus = refactored(linear, lus, J, h, refactor & live & pass_cond(p))
            lu_h = jnp.where(refactor, h, lu_h)
            done, iters, Z, rate, nf, _ = newton(field, linear, apply_mass, t, s.y, h, Z0, lus,
                                              scale, m=m, tol=newton_tol,
                                              maxiter=NEWTON_MAXITER)
            counts = Counts(counts.nfev + nf, counts.njev + renew.astype(jnp.int32),
                            counts.nlu + 2 * refactor.astype(jnp.int32))
            return k + 1, done, J, fresh, lus, lu_h, iters, Z, rate, counts

        _, converged, J, fresh, lus, lu_h, iters, Z, rate, counts = jax.lax.while_loop(
            pass_cond, pass_body, (jnp.asarray(0, jnp.int32), jnp.asarray(False), s.J,
                                   s.J_fresh, s.lus, s.lu_h, jnp.asarray(0, jnp.int32), Z0,
                                   jnp.asarray(jnp.nan, dtype), s.counts))
        y_new = s.y + Z[-1]
        ZE = apply_mass(mix(E[None], Z)[0] / h)
        error = linear.solve_real(lus[0], s.f + ZE)
        weight = 1.0 / (atol + jnp.maximum(jnp.abs(s.y), jnp.abs(y_new)) * rtol)
        err = _rms((error * weight)[:m])
        # a rejected step's estimate filtered once more (RADAU5)
        # (a loop run at most once, not a `lax.cond`: under `jax.vmap` a cond
        # becomes a select of both branches, whose batching a kept KLU
        # factor's solve, a custom-batched call, cannot enter)
        def refilter(c):
            _, e, _, k = c
            e = linear.solve_real(lus[0], field(t, s.y + e) + ZE)
            return False, e, _rms((e * weight)[:m]), k._replace(nfev=k.nfev + 1)

        _, error, err, counts = jax.lax.while_loop(
            lambda c: c[0], refilter, (converged & s.rejected & (err > 1), error, err, counts))
        safety = 0.9 * (2 * NEWTON_MAXITER + 1) / (2 * NEWTON_MAXITER + iters)
        accept = converged & (err <= 1)
        factor = predict(h, s.h_old, err, s.err_old)
        shrink = jnp.where(converged, jnp.maximum(MIN_FACTOR, safety * factor), 0.5)
        grow = jnp.minimum(MAX_FACTOR, safety * factor)
        renew_jac = (iters > 2) & (rate > 1e-3)
        grow = jnp.where(~renew_jac & (grow < HOLD), 1.0, grow)

        f_new = jax.lax.cond(accept, lambda: field(t_new, y_new), lambda: s.f)
        counts = counts._replace(nfev=counts.nfev + accept.astype(jnp.int32))
        J_next = jax.lax.cond(accept & renew_jac, lambda: linear.jacobian(t_new, y_new),
                              lambda: J)
        counts = counts._replace(njev=counts.njev + (accept & renew_jac).astype(jnp.int32))
        h_want = jnp.where(accept, h * grow, h * shrink)
        tr, taken = advance(s.tr, ts, accept=accept, land=land, t_new=t_new, y_new=y_new, h=h,
                            h_want=h_want, max_steps=max_steps)
        # (a failed iteration, or a rejected step: the factorizations are
        # made again for the next step size)
        return _State(
            tr=tr, y=jnp.where(accept, y_new, s.y), f=f_new,
            Q=jnp.where(accept, mix(P.T, Z), s.Q), t_old=jnp.where(accept, t, s.t_old),
            h_old=jnp.where(accept, h, s.h_old), err_old=jnp.where(accept, err, s.err_old),
            h_want=h_want, rejected=~accept, J=J_next,
            J_fresh=jnp.where(accept, renew_jac, fresh), lus=lus,
            lu_h=jnp.where(accept & (renew_jac | (grow != 1.0)), jnp.nan, lu_h),
            counts=counts), taken

    end, rec = run(attempt, s0, blank(t0, y0, ts, max_steps, record, dense), y0,
                   record=record, dense=dense)
    # (the status, which the result is judged by, waits for the last frees)
    end = end._replace(tr=end.tr._replace(
        status=end.tr.status + released(linear, end.lus, after=[end.tr, rec, end.y])))
    return finish(end.tr, rec, ts, end.y, m, end.counts, record, dense)
