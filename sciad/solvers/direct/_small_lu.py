"""LU factorization with partial pivoting of small dense matrices, in
operations XLA compiles into the program (no library call).

The stiff integrators factor and solve with `M - c J` in every Newton
iteration. For a system of a few states (Robertson's kinetics: 3) the
arithmetic is a few dozen multiply-adds, and LAPACK's calls cost more than
it: on the CPU each `getrf` and each of a solve's two `trsm`s is a custom
call of its own, with the column-major copies of its operands around it,
about ten separate passes of XLA's runtime a Newton iteration. Here the
factorization is scalar expressions of the matrix's entries (the pivot of
each column chosen by selects, LAPACK's rule: the first entry of largest
magnitude, `|Re| + |Im|` for complex entries; each column scaled by its
pivot's reciprocal, as LAPACK's `getf2`), and a solve is scalar
expressions of the right-hand side's rows (multiplied by the pivots'
reciprocals), each of which XLA fuses into one pass. It costs compile time:
Robertson's first Radau call (trace and compile) 1.9-2.3 -> 2.2-2.5 s.

From `SMALL` to `LOOPED` unknowns the factorization is a loop over the
columns (pivot, swap, rank-one update: a few operations on the whole
matrix each), and a solve a loop over the rows. Not being library calls,
both let a loop around them be compiled as one function
(`sciad.config.loops_policy`): a 9-state kinetics model's BDF solve went
from 8.5 to 0.8 ms, Radau's from 3.4 to 1.0 ms.

`lu_factor(A)` and `lu_solve(factor, b, trans)` take the place of
`jax.scipy.linalg`'s: up to `LOOPED` unknowns they make and read a
`SmallLU`; above it they are JAX's own (so a caller switches for every
size at once). Real or complex; `b` of shape `(n,)` or `(n, k)`; `trans`
0 (`A x = b`), 1 (`A^T x = b`), 2 (`A^H x = b`); batched by `jax.vmap` as
any elementwise program.

```python
f = lu_factor(A)            # A: (3, 3)
x = lu_solve(f, b)          # A x = b
x = lu_solve(f, b, 1)       # A^T x = b
```
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

#: the largest order written out entry by entry: the expressions grow as
#: `n^3`, and XLA's fusions recompute shared ones. A loop of
#: factorizations and two solves, per iteration against LAPACK's: n = 3,
#: 0.56 against 3.5 us; 4, 1.0 against 4.7 us; 6, 6.6 against 2.3 us; 9,
#: 50 against 3.8 us and 13 s to compile
SMALL = 4
#: the largest order factored by a loop over its columns (each step a few
#: operations on the whole matrix, compiled once whatever `n`); above it,
#: LAPACK through JAX. Not a library call: a loop holding it can be
#: compiled as one function (`sciad.config.loops_policy`), where LAPACK's
#: calls keep it dispatched operation by operation. Alone, a factorization
#: and a solve against LAPACK's: n = 5, 0.43 against 1.2 us; 9, 1.7 against
#: 2.2 us; 16, 6.8 against 6.1 us
LOOPED = 16


class SmallLU(NamedTuple):
    """`P A = L U` of an `(n, n)` matrix: `lu` holds `L`'s strictly lower
    entries (its diagonal is ones) and `U`; `rows[k]` is the row of `A` that
    is row `k` of `P A`; `inv` the reciprocals of `U`'s diagonal (what the
    solves multiply by)."""

    lu: jax.Array
    rows: jax.Array
    inv: jax.Array


def lu_factor(A):
    """The LU factorization of the square matrix `A` with partial pivoting:
    a `SmallLU` up to `LOOPED` rows, else `jax.scipy.linalg.lu_factor(A)`."""
    n = A.shape[-1]
    if A.ndim != 2 or n > LOOPED:
        return jax.scipy.linalg.lu_factor(A)
    if n > SMALL:
        return _looped_factor(A)
    a = [[A[i, j] for j in range(n)] for i in range(n)]
    rows = [jnp.asarray(i, jnp.int32) for i in range(n)]
    invs = []
    for k in range(n):
        # the pivot: the first row from k of largest magnitude in column k
        best, at = _size(a[k][k]), jnp.asarray(k, jnp.int32)
        for i in range(k + 1, n):
            larger = _size(a[i][k]) > best
            best, at = jnp.where(larger, _size(a[i][k]), best), jnp.where(larger, i, at)
        # rows k and `at` swapped (selects: `at` is a value of the program)
        top = [_pick(at, k, [a[i][j] for i in range(k, n)]) for j in range(n)]
        top_row = _pick(at, k, rows[k:])
        for i in range(k + 1, n):
            a[i] = [jnp.where(at == i, a[k][j], a[i][j]) for j in range(n)]
            rows[i] = jnp.where(at == i, rows[k], rows[i])
        a[k], rows[k] = top, top_row
        inv = 1.0 / a[k][k]  # (LAPACK's getf2 scales the column by the reciprocal too)
        invs.append(inv)
        for i in range(k + 1, n):
            m = a[i][k] * inv
            a[i] = a[i][:k] + [m] + [a[i][j] - m * a[k][j] for j in range(k + 1, n)]
    return SmallLU(jnp.stack([jnp.stack(r) for r in a]), jnp.stack(rows), jnp.stack(invs))


def _looped_factor(A):
    """`lu_factor`'s `SmallLU` by a loop over the columns: at column `k`,
    the pivot (the first row from `k` of largest size), the two rows
    swapped, the column below the pivot scaled by its reciprocal, and the
    rank-one update of the rows below; each a pass over the matrix."""
    n = A.shape[0]
    idx = jnp.arange(n)
    below = lambda k: idx > k  # noqa: E731

    def column(k, c):
        a, rows, inv = c
        at = jnp.argmax(jnp.where(idx >= k, _size(a[:, k]), -1.0))
        top, other = a[k], a[at]
        a = jnp.where((idx == k)[:, None], other[None],
                      jnp.where((idx == at)[:, None], top[None], a))
        rows = jnp.where(idx == k, rows[at], jnp.where(idx == at, rows[k], rows))
        r = 1.0 / a[k, k]
        m = jnp.where(below(k), a[:, k] * r, 0.0)
        a = a - m[:, None] * jnp.where(below(k), a[k], 0.0)[None, :]
        a = jnp.where(below(k)[:, None] & (idx == k)[None, :], m[:, None], a)
        return a, rows, jnp.where(idx == k, r, inv)

    return SmallLU(*jax.lax.fori_loop(0, n, column, (A, idx.astype(jnp.int32),
                                                     jnp.zeros((n,), A.dtype))))


def _looped_solve(lu, rows, inv, b, trans: int):
    """`lu_solve` by loops over the rows of a `_looped_factor`'s factor:
    each step one unknown found and taken out of the others, a pass over
    the right-hand sides."""
    n = lu.shape[0]
    idx = jnp.arange(n)
    shape = (n,) + (1,) * (b.ndim - 1)
    col = lambda v: v.reshape(shape)  # noqa: E731

    def eliminate(order, x, entries, scaled: bool, later):
        """The triangular solve whose unknown `k` (taken in `order(j)`) has
        the coefficients `entries(k)` in the rows `later(k)`."""
        def one(j, x):
            k = order(j)
            xk = x[k] * inv[k] if scaled else x[k]
            x = jnp.where(col(idx == k), xk[None], x)
            return x - col(jnp.where(later(k), entries(k), 0.0)) * xk[None]
        return jax.lax.fori_loop(0, n, one, x)

    first, last = (lambda j: j), (lambda j: n - 1 - j)
    if trans == 0:  # L U x = P b
        y = eliminate(first, b[rows], lambda k: lu[:, k], False, lambda k: idx > k)
        return eliminate(last, y, lambda k: lu[:, k], True, lambda k: idx < k)
    # A^T = U^T L^T P: U^T z = b, L^T w = z, x = P^T w (x[rows[k]] = w[k])
    z = eliminate(first, b, lambda k: lu[k], True, lambda k: idx > k)
    w = eliminate(last, z, lambda k: lu[k], False, lambda k: idx < k)
    onehot = (rows[None, :] == idx[:, None]).reshape((n, n) + (1,) * (b.ndim - 1))
    return jnp.sum(jnp.where(onehot, w[None], 0.0), axis=1)


def _size(v):
    """A pivot's size as LAPACK's `i?amax` measures it: `|v|`, and `|Re v| +
    |Im v|` for a complex `v`."""
    if jnp.iscomplexobj(v):
        return jnp.abs(v.real) + jnp.abs(v.imag)
    return jnp.abs(v)


def _pick(at, k: int, values):
    """`values[at - k]` by selects."""
    out = values[0]
    for i, v in enumerate(values[1:], start=k + 1):
        out = jnp.where(at == i, v, out)
    return out


def lu_solve(factor, b, trans: int = 0):
    """`x` with `A x = b` (`trans` 1: `A^T x = b`; 2: `A^H x = b`) from
    `lu_factor(A)`; `b` of shape `(n,)` or `(n, k)`."""
    if not isinstance(factor, SmallLU):
        return jax.scipy.linalg.lu_solve(factor, b, trans=trans)
    lu, rows, inv = factor
    n = lu.shape[0]
    if trans == 2:
        lu, inv = jnp.conj(lu), jnp.conj(inv)
    dtype = jnp.result_type(lu.dtype, b.dtype)
    if n > SMALL:
        return _looped_solve(lu.astype(dtype), rows, inv.astype(dtype), b.astype(dtype), trans)
    f = [[lu[i, j].astype(dtype) for j in range(n)] for i in range(n)]
    d = [inv[i].astype(dtype) for i in range(n)]
    b = b.astype(dtype)
    if trans == 0:  # L U x = P b
        y = _forward(f, [_pick(rows[i], 0, [b[j] for j in range(n)]) for i in range(n)])
        return jnp.stack(_backward(f, y, d))
    # A^T = U^T L^T P: U^T z = b, L^T w = z, x = P^T w
    ft = [[f[j][i] for j in range(n)] for i in range(n)]
    w = _backward(ft, _forward(ft, [b[i] for i in range(n)], d))
    # x[rows[k]] = w[k]
    zero = jnp.zeros_like(w[0])
    x = []
    for j in range(n):
        xj = zero
        for k in range(n):
            xj = jnp.where(rows[k] == j, w[k], xj)
        x.append(xj)
    return jnp.stack(x)


def _forward(m, b, d=None):
    """`y` with `T y = b`, `T` the lower triangle of `m` (lists of rows),
    its diagonal ones (`d` None) or `1 / d`: row by row from the first."""
    y = []
    for i in range(len(b)):
        s = b[i]
        for j in range(i):
            s = s - m[i][j] * y[j]
        y.append(s if d is None else s * d[i])
    return y


def _backward(m, b, d=None):
    """`x` with `T x = b`, `T` the upper triangle of `m`, its diagonal ones
    (`d` None) or `1 / d`: row by row from the last."""
    n = len(b)
    x = [None] * n
    for i in range(n - 1, -1, -1):
        s = b[i]
        for j in range(i + 1, n):
            s = s - m[i][j] * x[j]
        x[i] = s if d is None else s * d[i]
    return x
