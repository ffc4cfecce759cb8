"""A sparse Cholesky factor as a value of the program, with derivatives of
every order: what samples of a Gaussian with a sparse precision read.

Every value here is a vector on the factor's layout for a pattern (`param
pattern`: the sparse matrix's; `sciad.solvers.direct._fill_cholesky.Layout`):
the `n` diagonal entries of a lower-triangular matrix on the fill of the
ordered `A + A^T`, then its strictly lower entries. A symmetric matrix is
its lower triangle on that layout.

- `linalg.sparse_cholesky[pattern, spd](a) -> l`: `L L^T = P S P^T`, `S =
  (A + A^T) / 2` the sparse matrix's symmetric part (positive definite;
  else `NotPositiveDefiniteError`, naming the column). With `spd` (the
  matrix is declared so: a tag, `assume=`), `A` is checked as a solve
  checks one: symmetric to rounding, a positive diagonal.
- `linalg.cholesky_tangent[pattern](l, e) -> x`: `tril(X L^T + L X^T) = E`,
  the factor's derivative `dL` for `dA = E` (linear in `e`).
- `linalg.cholesky_adjoint[pattern](l, c) -> e`: that map's transpose
  (linear in `c`): the factorization's reverse mode.
- `linalg.fill_symprod[pattern](x, y) -> tril(X Y^T + Y X^T)`,
  `linalg.fill_symmul[pattern](c, y) -> (C + C^T) Y` (restricted to the
  layout): bilinear, each the other's transpose.
- `linalg.fill_trisolve[pattern, transpose](l, b) -> L^-1 b` (`L^-T b`),
  `b` of shape `(n, m)`.

Rules (`T = cholesky_tangent`, `T* = cholesky_adjoint`):

- `d chol(a) = T(l, lower(da))` (`lower`: the symmetric part on the layout,
  two gathers).
- `d T(l, e) = T(l, de - symprod(T(l, e), dl))` (differentiate
  `tril(X L^T + L X^T) = E` in `L`).
- `d T*(l, c) = T*(l, dc - symmul(T*(l, c), dl))` (the transpose of the
  line above).
- `d L^-1 b = L^-1 (db - dL L^-1 b)`; `d L^-T b = L^-T (db - dL^T L^-T b)`.
- Transposes: `T <-> T*`, `symprod <-> symmul` (in either factor),
  `trisolve <-> trisolve` with the other `transpose`.

So a Hessian-vector product of anything built on the factor is a few more
passes of the same cost as the factorization, never a dense matrix. The
kernels are `csrc/fill_cholesky.cc`, called on the host.
"""

from __future__ import annotations

import jax
import numpy as np

from ..errors import DTypeError, NonFiniteError, NotPositiveDefiniteError, ShapeError
from .. import _ops as ops
from ..graph import (Param, Primitive, Site, SparseType, TensorType, Zero, add_tangents,
                     instantiate, is_zero)
from ..graph._autodiff import is_linear, type_of
from ..graph._cost import Cost
from ..graph._sparsity import dense
from ..graph._types import Pattern
from ..solvers._host import host_call
from ..solvers.direct import _fill_cholesky as fc
from ._checks import releasing
from ._map import map_rule
from ._sparse import coo, gather


def _prim(name: str, **params) -> Primitive:
    return Primitive(name, params={"pattern": Pattern, **params})


linalg_sparse_cholesky_p = Primitive("linalg.sparse_cholesky", runtime_checks=True,
                                     params={"pattern": Pattern,
                                             "spd": Param(bool, default=False)})
linalg_cholesky_tangent_p = _prim("linalg.cholesky_tangent")
linalg_cholesky_adjoint_p = _prim("linalg.cholesky_adjoint")
linalg_fill_symprod_p = _prim("linalg.fill_symprod")
linalg_fill_symmul_p = _prim("linalg.fill_symmul")
linalg_fill_trisolve_p = _prim("linalg.fill_trisolve", transpose=Param(bool, default=False))

_BINARY = (linalg_cholesky_tangent_p, linalg_cholesky_adjoint_p, linalg_fill_symprod_p,
           linalg_fill_symmul_p)
_KERNELS = {linalg_cholesky_tangent_p: fc.tangent, linalg_cholesky_adjoint_p: fc.adjoint,
            linalg_fill_symprod_p: fc.symprod, linalg_fill_symmul_p: fc.symmul}


def _vector(x, pattern: Pattern, op: str, what: str) -> None:
    if len(pattern.shape) != 2 or pattern.shape[0] != pattern.shape[1]:
        raise ShapeError(f"expects the pattern of a square matrix, got shape {pattern.shape}.",
                         op=op)
    size = fc.layout(pattern).size
    if not isinstance(x, TensorType) or tuple(x.shape) != (size,):
        raise ShapeError(f"`{what}` is a vector on the factor's layout for this pattern, of "
                         f"shape ({size},), got {x.str_short()}.", op=op)
    if np.dtype(x.dtype).kind != "f":
        raise DTypeError(f"expects a real float vector `{what}`, got {np.dtype(x.dtype)}.",
                         op=op)


@linalg_sparse_cholesky_p.def_abstract_eval
def _chol_shape(a, *, pattern, spd=False):
    op = "linalg.sparse_cholesky"
    if not isinstance(a, SparseType) or a.pattern != pattern:
        raise ShapeError(f"expects a sparse matrix on the pattern {pattern}, got "
                         f"{a.str_short()}.", op=op)
    if np.dtype(a.dtype).kind != "f":
        raise DTypeError(f"expects a real float matrix, got {np.dtype(a.dtype)}.", op=op)
    if len(pattern.shape) != 2 or pattern.shape[0] != pattern.shape[1]:
        raise ShapeError(f"expects a square matrix, got shape {pattern.shape}.", op=op)
    return TensorType((fc.layout(pattern).size,), a.dtype)


def _binary_shape(p: Primitive, names: tuple[str, str]):
    def rule(x, y, *, pattern):
        for v, name in zip((x, y), names):
            _vector(v, pattern, p.name, name)
        if x.dtype != y.dtype:
            raise DTypeError(f"expects `{names[0]}` and `{names[1]}` of one dtype, got "
                             f"{x.dtype} and {y.dtype}.", op=p.name)
        return TensorType(x.shape, x.dtype)
    p.def_abstract_eval(rule)


for _p, _names in zip(_BINARY, (("l", "e"), ("l", "c"), ("x", "y"), ("c", "y"))):
    _binary_shape(_p, _names)


@linalg_fill_trisolve_p.def_abstract_eval
def _trisolve_shape(l, b, *, pattern, transpose=False):
    op = "linalg.fill_trisolve"
    _vector(l, pattern, op, "l")
    n = pattern.shape[0]
    if not isinstance(b, TensorType) or len(b.shape) != 2 or b.shape[0] != n:
        raise ShapeError(f"`b` is a matrix of {n} rows (one column per right-hand side), got "
                         f"{b.str_short()}.", op=op)
    if b.dtype != l.dtype:
        raise DTypeError(f"expects `l` and `b` of one dtype, got {l.dtype} and {b.dtype}.",
                         op=op)
    return TensorType(b.shape, b.dtype)


# ---------------------------------------------------------------------------
# implementations: one host call, looping over the examples of a batch


def _examples(arrays, cores):
    """The arrays' leading (batch) axes broadcast together, and each array
    as a list of examples."""
    batch = np.broadcast_shapes(*(a.shape[:a.ndim - c] for a, c in zip(arrays, cores)))
    count = int(np.prod(batch, dtype=np.int64))  # (explicit: a core may be empty)
    flat = [np.broadcast_to(a, batch + a.shape[a.ndim - c:]).reshape(
        (count,) + a.shape[a.ndim - c:]) for a, c in zip(arrays, cores)]
    return batch, flat


def _run(kernel, out_core, *args, cores, dtype):
    """The host function running `kernel(*example, out)` on each example:
    the kernels write a float64 result into `out`, the output's row (no copy;
    None for another dtype), and return it."""
    direct = np.dtype(dtype) == np.float64

    def host(*vals):
        batch, flat = _examples(vals, cores)
        count = len(flat[0])
        out = np.empty((count,) + out_core, dtype)
        for i in range(count):
            row = kernel(*(f[i] for f in flat), out[i] if direct else None)
            if not direct:
                out[i] = row
        return (out.reshape(batch + out_core),)

    return host, args


def _host_binary(p: Primitive):
    def impl(x, y, *, pattern):
        an = fc.layout(pattern)
        kernel = _KERNELS[p]
        host, args = _run(lambda a, b, out: kernel(an, a, b, out), (an.size,), x, y,
                          cores=(1, 1), dtype=x.dtype)
        (out,) = host_call(host, (jax.ShapeDtypeStruct(
            np.broadcast_shapes(x.shape[:-1], y.shape[:-1]) + (an.size,), x.dtype),), *args)
        return out
    p.def_impl(impl)


for _p in _BINARY:
    _host_binary(_p)


@linalg_fill_trisolve_p.def_impl
def _trisolve_impl(l, b, *, pattern, transpose=False):
    an = fc.layout(pattern)

    def kernel(lv, bv, out):
        x = fc.trisolve(an, lv, bv, transpose)
        if out is not None:
            out[...] = x
        return x

    host, args = _run(kernel, tuple(b.shape[-2:]), l, b, cores=(1, 2), dtype=b.dtype)
    shape = np.broadcast_shapes(l.shape[:-1], b.shape[:-2]) + tuple(b.shape[-2:])
    (out,) = host_call(host, (jax.ShapeDtypeStruct(shape, b.dtype),), *args)
    return out


@linalg_sparse_cholesky_p.def_impl
def _chol_impl(a, *, pattern, spd=False, site=None):
    import jax.numpy as jnp

    site = site or Site("linalg.sparse_cholesky")
    bare = site.bare
    an = fc.layout(pattern)
    if spd:
        from ._logdet import _spd_checked

        a = _spd_checked(a, pattern, site)
    e = jnp.zeros(a.shape[:-1] + (an.size,), a.dtype).at[..., an.slot].add(
        a * an.weight.astype(a.dtype))

    def host(vals):
        batch, (flat,) = _examples([vals], (1,))
        out = np.empty(flat.shape, vals.dtype)
        direct = vals.dtype == np.float64  # (the factor written in place)
        for i, row in enumerate(flat):
            where = bare.in_example(i, batch)
            if not np.isfinite(row).all():
                where.fail(NonFiniteError, "the matrix holds NaN or infinite values.")
            l, status = fc.chol(an, row, out[i] if direct else None)
            if not direct:
                out[i] = l
            if status:
                column = int(np.flatnonzero(an.perm == status - 1)[0])
                where.fail(NotPositiveDefiniteError,
                           f"the Cholesky factorization broke down at the matrix's column "
                           f"{column} (a pivot <= 0): the matrix (its symmetric part) is not "
                           "positive definite. A precision matrix, or a matrix declared spd, "
                           "must be; check its assembly, or add a positive shift to its "
                           "diagonal.")
        return (out.reshape(vals.shape),)

    # (a raise ends what the program holds first: `releasing`)
    guarded, operands = releasing(host, [e], site.held)
    (out,) = host_call(guarded, (jax.ShapeDtypeStruct(e.shape, e.dtype),), *operands)
    return out


def lower(values, pattern: Pattern):
    """The symmetric part of the matrix with `values` on `pattern`, on the
    factor's layout (each slot the mean of an entry and its mirror: a
    scatter-add of `nnz` halves, whose transpose is a gather of `nnz`)."""
    an = fc.layout(pattern)
    dtype = type_of(values).dtype
    return ops.zeros((an.size,), dtype=dtype).at[an.slot].add(values * an.weight.astype(dtype))


def factor(A, pattern: Pattern, spd: bool = False):
    """`l`: the factor of the sparse matrix `A`'s symmetric part."""
    params = {"spd": True} if spd else {}
    return linalg_sparse_cholesky_p.bind(A, pattern=pattern, **params)


def logdet(l, pattern: Pattern):
    """`log det A = 2 sum(log diag L)` from the factor's values `l`."""
    n = pattern.shape[0]
    return 2.0 * ops.sum(ops.log(l[:n]))


def inverse_on_layout(l, pattern: Pattern):
    """`Z = A^-1` on the factor's layout (its diagonal, then the strictly
    lower fill): the gradient of `log det` in the layout's values is
    `T*(l, [2 / diag L, 0])`, which is `Z` with the off-diagonal entries
    doubled (each stands for two entries of the symmetric matrix): Takahashi's
    recurrence, as one adjoint pass of the factorization."""
    an = fc.layout(pattern)
    n = an.n
    dtype = type_of(l).dtype
    seed = ops.concatenate([2.0 / l[:n], ops.zeros((an.size - n,), dtype=dtype)])
    half = np.concatenate([np.ones(n), np.full(an.size - n, 0.5)]).astype(dtype)
    return adjoint(l, seed, pattern) * half


def inverse_on_pattern(l, pattern: Pattern):
    """`A^-1` at the entries of `pattern` (`A`'s own, symmetric values)."""
    return ops.take(inverse_on_layout(l, pattern), fc.layout(pattern).slot)


# ---------------------------------------------------------------------------
# derivatives


def tangent(l, e, pattern):
    return linalg_cholesky_tangent_p.bind(l, e, pattern=pattern)


def adjoint(l, c, pattern):
    return linalg_cholesky_adjoint_p.bind(l, c, pattern=pattern)


def symprod(x, y, pattern):
    return linalg_fill_symprod_p.bind(x, y, pattern=pattern)


def symmul(c, y, pattern):
    return linalg_fill_symmul_p.bind(c, y, pattern=pattern)


def trisolve(l, b, pattern, transpose=False):
    params = {"transpose": True} if transpose else {}
    return linalg_fill_trisolve_p.bind(l, b, pattern=pattern, **params)


@linalg_sparse_cholesky_p.def_jvp
def _chol_jvp(primals, tangents, *, pattern, spd=False):
    (a,), (da,) = primals, tangents
    l = factor(a, pattern, spd)
    if is_zero(da):
        return l, Zero(type_of(l))
    return l, tangent(l, lower(gather(instantiate(da)), pattern), pattern)


def _map_jvp(p: Primitive, derivative):
    """The JVP of `p(l, c)`, linear in `c`: `p(l, dc - derivative(out, dl))`
    (one application of the map for both terms)."""
    def rule(primals, tangents, *, pattern):
        (l, c), (dl, dc) = primals, tangents
        out = p.bind(l, c, pattern=pattern)
        rhs = Zero(type_of(c)) if is_zero(dc) else instantiate(dc)
        if not is_zero(dl):
            rhs = add_tangents(rhs, -derivative(out, instantiate(dl), pattern))
        return out, Zero(type_of(out)) if is_zero(rhs) else p.bind(l, rhs, pattern=pattern)
    p.def_jvp(rule)


_map_jvp(linalg_cholesky_tangent_p, symprod)
_map_jvp(linalg_cholesky_adjoint_p, symmul)


@linalg_cholesky_tangent_p.def_transpose
def _tangent_transpose(ct, l, e, *, pattern):
    assert not is_linear(l), "cholesky_tangent: linear in `e` only"
    return None, adjoint(l, instantiate(ct), pattern)


@linalg_cholesky_adjoint_p.def_transpose
def _adjoint_transpose(ct, l, c, *, pattern):
    assert not is_linear(l), "cholesky_adjoint: linear in `c` only"
    return None, tangent(l, instantiate(ct), pattern)


def _bilinear_jvp(p: Primitive):
    def rule(primals, tangents, *, pattern):
        (x, y), (dx, dy) = primals, tangents
        out = p.bind(x, y, pattern=pattern)
        t = Zero(type_of(out))
        if not is_zero(dx):
            t = add_tangents(t, p.bind(instantiate(dx), y, pattern=pattern))
        if not is_zero(dy):
            t = add_tangents(t, p.bind(x, instantiate(dy), pattern=pattern))
        return out, t
    p.def_jvp(rule)


_bilinear_jvp(linalg_fill_symprod_p)
_bilinear_jvp(linalg_fill_symmul_p)


@linalg_fill_symprod_p.def_transpose
def _symprod_transpose(ct, x, y, *, pattern):
    # <C, tril(X Y^T + Y X^T)> = <(C + C^T) Y, X>, symmetric in X and Y
    ct = instantiate(ct)
    return (symmul(ct, y, pattern) if is_linear(x) else None,
            symmul(ct, x, pattern) if is_linear(y) else None)


@linalg_fill_symmul_p.def_transpose
def _symmul_transpose(ct, c, y, *, pattern):
    # <B, (C + C^T) Y> = <C, tril(B Y^T + Y B^T)> = <(C + C^T) B, Y>
    ct = instantiate(ct)
    return (symprod(ct, y, pattern) if is_linear(c) else None,
            symmul(c, ct, pattern) if is_linear(y) else None)


def _factor_product(dl, x, pattern, transpose: bool):
    """`dL x` (`dL^T x`): the lower-triangular `dl` on the layout as a sparse
    matrix, times the matrix `x`."""
    an = fc.layout(pattern)
    rows, cols = (an.cols, an.rows) if transpose else (an.rows, an.cols)
    return coo(dl, rows, cols, (an.n, an.n)) @ x


@linalg_fill_trisolve_p.def_jvp
def _trisolve_jvp(primals, tangents, *, pattern, transpose=False):
    (l, b), (dl, db) = primals, tangents
    x = trisolve(l, b, pattern, transpose)
    rhs = Zero(type_of(b)) if is_zero(db) else instantiate(db)
    if not is_zero(dl):
        rhs = add_tangents(rhs, -_factor_product(instantiate(dl), x, pattern, transpose))
    return x, Zero(type_of(x)) if is_zero(rhs) else trisolve(l, rhs, pattern, transpose)


@linalg_fill_trisolve_p.def_transpose
def _trisolve_transpose(ct, l, b, *, pattern, transpose=False):
    assert not is_linear(l), "fill_trisolve: linear in `b` only"
    return None, trisolve(l, instantiate(ct), pattern, not transpose)


_ALL = (linalg_sparse_cholesky_p, *_BINARY, linalg_fill_trisolve_p)
for _p in _ALL:
    _p.def_batch(map_rule(_p))
linalg_sparse_cholesky_p.def_sparsity(lambda outs, a, **params: dense(outs[0], a))
for _p in _BINARY:
    _p.def_sparsity(lambda outs, x, y, **params: dense(outs[0], x, y))
linalg_fill_trisolve_p.def_sparsity(lambda outs, l, b, **params: dense(outs[0], l, b))


def _flops(node) -> float:
    return fc.layout(node.params["pattern"]).flops()


for _p in (linalg_sparse_cholesky_p, *_BINARY):
    _p.def_cost(lambda node, body: Cost(2.0 * _flops(node)))


@linalg_fill_trisolve_p.def_cost
def _trisolve_cost(node, body):
    an = fc.layout(node.params["pattern"])
    return Cost(2.0 * an.size * node.inputs[1].type.shape[-1])
