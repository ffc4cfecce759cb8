"""Log-determinants and selected inverses, with their derivatives.

`linalg.slogdet[solver, pattern](a) -> (sign, logabsdet)`: NumPy's
`slogdet` of a dense (`solver` "lu" or "cholesky", in the program) or sparse
(`solver` "splu": SuperLU on the host, `sciad.solvers.direct._selinv`;
"cholmod": sparsax's compiled CHOLMOD) square matrix. `share_factors`
rewrites a dense one into `linalg.factor_slogdet(F, a)` reading the
`linalg.factor` its matrix's solves read (CHOLMOD's is shared through
sparsax's cache). A singular matrix is `(0, -inf)`, as NumPy's; a Cholesky
breakdown (a matrix declared spd that is not) is `NotPositiveDefiniteError`.
(A sparse spd matrix read by sciad's own sparse Cholesky factor, "auto"'s
choice, makes no node of these: its log-determinant and selected inverse are
written with the factor's primitives, `_sparse_cholesky`.)

`linalg.selected_inverse[pattern, at, transpose](a)`: the entries of `A^-1`
(of `A^-T` with `transpose`) at the entries of the pattern `at` (default:
`a`'s own), for a sparse `a`, without the dense inverse (Takahashi's
recurrence on an unpivoted factorization; every entry of `at` must be in
the pattern of `A + A^T`).

Rules:

- `d log|det A| = Re tr(A^-1 dA) = Re sum(A^-T o dA)` (and, for complex
  `A`, `d sign = i sign Im tr(A^-1 dA)`; a real sign is piecewise constant):
  `A^-T` is the dense inverse's transpose (a solve with the identity) for a
  dense `A`, and the selected inverse on `A`'s pattern for a sparse one, so
  a gradient costs `nnz` numbers. Reverse mode transposes this JVP.
- `d(A^-1) = -A^-1 dA A^-1`, needed on a pattern only: the inverse of the
  block matrix `B = [[A, dA], [0, A]]` is `[[A^-1, -A^-1 dA A^-1], [0, A^-1]]`,
  so the JVP of a selected inverse is the selected inverse of `B` read in
  its upper right block, and its VJP (`abar = -A^-T C A^-T` on `A`'s pattern,
  `C` the cotangent on `at`) is that of `[[A^T, C], [0, A^T]]`. Both are
  again selected inverses, so every order of derivative is one: a
  log-determinant's Hessian-vector product is a selected inverse of a
  matrix of twice the order. (The pivots of `B` in any symmetric ordering
  are those of principal submatrices of `A`: nonzero for `A` positive
  definite.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from .. import _ops as ops
from ..errors import (DTypeError, InvalidOptionError, NonFiniteError, NotPositiveDefiniteError,
                      NotSupportedError, ShapeError, SingularMatrixError)
from ..graph import (Factored, Param, Primitive, Site, SparseType, TensorType, Zero, instantiate,
                     is_zero)
from ..graph._autodiff import type_of
from ..graph._cost import Cost
from ..graph._sparsity import dense, dense_all
from ..graph._types import FactorType, Pattern
from ..solvers._host import host_call
from ..solvers.direct import _selinv
from ._checks import check, judge_matrix, releasing, tie
from ._linalg import linalg_backsolve_p, linalg_factor_p
from ._linalg_run import _matrix_fails, _matrix_measures
from ._map import map_rule
from ._sparse import assemble, coo, gather

DENSE_SOLVERS = ("lu", "cholesky")
#: "splu": SuperLU on the host (any nonsingular matrix; the selected inverse
#: without pivoting); "cholmod": sparsax's compiled CHOLMOD (spd matrices,
#: the [cholmod] extra), sharing its factor with the solves of those values
SPARSE_SOLVERS = ("splu", "cholmod")

linalg_slogdet_p = Primitive("linalg.slogdet", multiple_results=True, runtime_checks=True,
                             factored=lambda params: _slogdet_factored(params),
                             params={"solver": str,
                                     "pattern": Param((Pattern, None), default=None)})
linalg_selected_inverse_p = Primitive("linalg.selected_inverse", runtime_checks=True, params={
    "pattern": Pattern, "at": Param((Pattern, None), default=None),
    "transpose": Param(bool, default=False), "solver": Param(str, default="splu")})


def _real(dtype) -> np.dtype:
    return np.finfo(np.dtype(dtype)).dtype


def _square(a, pattern, op: str) -> None:
    sparse = isinstance(a, SparseType)
    if sparse != (pattern is not None) or (sparse and a.pattern != pattern):
        raise ShapeError(f"`pattern` must be the sparse matrix's own (and None for a dense "
                         f"one), got a {a.str_short()} with pattern {pattern}.", op=op)
    if len(a.shape) != 2 or a.shape[0] != a.shape[1]:
        raise ShapeError(f"expects a square matrix, got shape {tuple(a.shape)}.", op=op)
    if np.dtype(a.dtype).kind not in "fc":
        raise DTypeError(f"expects a float or complex matrix, got {np.dtype(a.dtype)}.", op=op)


# ---------------------------------------------------------------------------
# slogdet


@linalg_slogdet_p.def_abstract_eval
def _slogdet_shape(a, *, solver, pattern=None):
    op = "linalg.slogdet"
    _square(a, pattern, op)
    allowed = SPARSE_SOLVERS if pattern is not None else DENSE_SOLVERS
    if solver not in allowed:
        raise InvalidOptionError(f"a {'sparse' if pattern is not None else 'dense'} "
                                 f"log-determinant is read from a factorization by "
                                 f"{' or '.join(map(repr, allowed))}, got {solver!r}.", op=op)
    if solver == "cholmod":
        _cholmod_usable(a, op)
    return [TensorType((), a.dtype), TensorType((), _real(a.dtype))]


def _cholmod_usable(a, op: str) -> None:
    """Refuses solver 'cholmod' where it cannot read `a`: without sparsax's
    compiled CHOLMOD, or for a complex matrix."""
    from ..solvers.direct import _cholmod_ffi

    if not _cholmod_ffi.available():
        raise NotSupportedError("solver 'cholmod' needs sparsax's compiled CHOLMOD (`pip install "
                                "\"sciad[cholmod]\"`, Linux x86-64); use solver='splu'.", op=op)
    if np.dtype(a.dtype).kind == "c":
        raise NotSupportedError("solver 'cholmod' reads real symmetric positive definite "
                                "matrices; a complex one's is solver='splu'.", op=op)


def _spd_checked(a, pattern, site):
    """`a` tied to the checks of a matrix declared spd that a Cholesky
    factorization is given (finite, symmetric, a positive diagonal: CHOLMOD
    reads one triangle, the sparse Cholesky factor the symmetric part),
    measured as a solve's (one compiled pass where built), judged on the host
    only where one fails."""
    measures = _matrix_measures(a, pattern, "spd")
    token = check(judge_matrix, site, when=_matrix_fails(measures, a.dtype), dtype=a.dtype,
                  tags=frozenset({"spd"}), **measures)
    return tie(a, token)


def _judge(site: Site, *, nonfinite=False, breakdown=False):
    if np.any(nonfinite):
        site.fail(NonFiniteError, "the matrix holds NaN or infinite values.")
    if np.any(breakdown):
        site.fail(NotPositiveDefiniteError,
                  "the Cholesky factorization broke down: the matrix is declared spd (a tag, "
                  "or `assume=`) but is not positive definite. Drop the claim to have its "
                  "log-determinant from an LU factorization (a negative determinant then "
                  "shows as sign -1).")


@linalg_slogdet_p.def_impl
def _slogdet_impl(a, *, solver, pattern=None, site=None):
    site = site or Site("linalg.slogdet")
    real = _real(a.dtype)
    if solver == "cholmod":
        from ..solvers.direct import _cholmod_ffi

        logabs = _cholmod_ffi.logdet(pattern, _spd_checked(a, pattern, site)).astype(real)
        return [jnp.ones((), a.dtype), logabs]
    if pattern is not None:
        bare = site.bare

        def host(d):
            batch = d.shape[:-1]
            rows = d.reshape((-1, d.shape[-1]))
            sign, logabs = np.empty(rows.shape[0], a.dtype), np.empty(rows.shape[0], real)
            for i, row in enumerate(rows):
                if not np.isfinite(row).all():
                    _judge(bare.in_example(i, batch), nonfinite=True)
                sign[i], logabs[i] = _selinv.slogdet_host(pattern, row)
            return sign.reshape(batch).astype(a.dtype), logabs.reshape(batch)

        batch = tuple(a.shape[:-1])
        # (a raise ends what the program holds first: `releasing`)
        guarded, operands = releasing(host, [a], site.held)
        return list(host_call(guarded, (jax.ShapeDtypeStruct(batch, a.dtype),
                                        jax.ShapeDtypeStruct(batch, real)), *operands))
    factor = (jnp.linalg.cholesky(a),) if solver == "cholesky" else jsl.lu_factor(a)
    return _dense_from_factor(factor, a, solver, site)


def _dense_from_factor(factor, a, solver: str, site):
    """`[sign, logabsdet]` of a dense `a` from its factor (`(c,)`, Cholesky's,
    or `(lu, piv)`), checked: finite, and (Cholesky) no breakdown."""
    real = _real(a.dtype)
    nonfinite = ~jnp.all(jnp.isfinite(a))
    if solver == "cholesky":
        d = jnp.real(jnp.diagonal(factor[0]))
        breakdown = ~nonfinite & ~jnp.all(jnp.isfinite(d) & (d > 0))
        sign = jnp.ones((), a.dtype)
        logabs = 2.0 * jnp.sum(jnp.log(d))
    else:
        lu, piv = factor[0], factor[1]  # (a checked factor carries its condition estimate)
        d = jnp.diagonal(lu)
        swaps = jnp.sum(piv != jnp.arange(piv.shape[-1], dtype=piv.dtype))
        parity = jnp.where(swaps % 2 == 1, -1.0, 1.0).astype(a.dtype)
        mag = jnp.abs(d)
        unit = jnp.where(mag == 0, 0.0, d / jnp.where(mag == 0, 1.0, mag))
        sign = parity * jnp.prod(unit)
        logabs = jnp.sum(jnp.log(mag)).astype(real)
        breakdown = jnp.asarray(False)
    token = check(_judge, site, when=nonfinite | breakdown, nonfinite=nonfinite,
                  breakdown=breakdown)
    return [tie(sign, token), tie(logabs, token)]


# ---------------------------------------------------------------------------
# a dense log-determinant read from a shared factorization: `share_factors`
# rewrites `linalg.slogdet` into `linalg.factor_slogdet(F, a)` reading the
# `linalg.factor(a) -> F` that the solves of the same matrix read (a sparse
# one by CHOLMOD shares its factor through sparsax's cache instead; by
# SuperLU it factors on its own)


def _slogdet_factored(params) -> Factored | None:
    if params.get("solver") not in DENSE_SOLVERS:
        return None
    return Factored(linalg_factor_p, {"solver": params["solver"]}, linalg_factor_slogdet_p,
                    {"solver": params["solver"]})


linalg_factor_slogdet_p = Primitive("linalg.factor_slogdet", multiple_results=True,
                                    runtime_checks=True, reads_factor=True,
                                    params={"solver": str})


@linalg_factor_slogdet_p.def_abstract_eval
def _factor_slogdet_shape(f, a, *, solver):
    op = "linalg.factor_slogdet"
    if not isinstance(f, FactorType) or (f.method, f.pattern) != (solver, None):
        raise ShapeError(f"needs a {solver!r} factorization of `a`, got {f.str_short()}.",
                         op=op)
    return _slogdet_shape(a, solver=solver)  # (a dense matrix: "lu" or "cholesky")


@linalg_factor_slogdet_p.def_impl
def _factor_slogdet_impl(factor, a, *, solver, site=None):
    return _dense_from_factor(tuple(factor), a, solver, site or Site("linalg.factor_slogdet"))


@linalg_factor_slogdet_p.def_jvp
def _factor_slogdet_jvp(primals, tangents, *, solver):
    # (the factor carries no derivative: the matrix does; A^-T by a
    # transposed backsolve with the same factor)
    (f, a), (_, da) = primals, tangents
    sign, logabs = linalg_factor_slogdet_p.bind(f, a, solver=solver)
    if is_zero(da):
        return (sign, logabs), (Zero(type_of(sign)), Zero(type_of(logabs)))
    t = type_of(a)
    g = linalg_backsolve_p.bind(f, a, ops.eye(t.shape[0], dtype=t.dtype), solver=solver,
                                transpose=True)
    return (sign, logabs), _tangents(sign, g, instantiate(da), t.dtype)


def _tangents(sign, g, da, dtype):
    """`(d sign, d logabsdet)` from `A^-T` (`g`, dense or the values on the
    pattern) and the matching tangent `da`."""
    t = ops.sum(g * da)
    dlog = ops.real(t)
    if np.dtype(dtype).kind == "c":
        return sign * (1j * ops.imag(t)), dlog
    return Zero(type_of(sign)), dlog


def _inverse_transposed(a, pattern, solver):
    """`A^-T`: dense, or on the pattern of a sparse `a` (its values; by
    CHOLMOD where the log-determinant was)."""
    if pattern is None:
        from ._linalg import solve  # (a solve with the identity: its checks, its rules)

        t = type_of(a)
        return ops.transpose(solve(a, ops.eye(t.shape[0], dtype=t.dtype)))
    params = {"solver": solver} if solver != "splu" else {}
    return linalg_selected_inverse_p.bind(a, pattern=pattern, transpose=True, **params)


@linalg_slogdet_p.def_jvp
def _slogdet_jvp(primals, tangents, *, solver, pattern=None):
    (a,), (da,) = primals, tangents
    params = {"solver": solver} if pattern is None else {"solver": solver, "pattern": pattern}
    sign, logabs = linalg_slogdet_p.bind(a, **params)
    if is_zero(da):
        return (sign, logabs), (Zero(type_of(sign)), Zero(type_of(logabs)))
    g = _inverse_transposed(a, pattern, solver)
    da = instantiate(da)
    return (sign, logabs), _tangents(sign, g, da if pattern is None else gather(da),
                                     type_of(a).dtype)


# ---------------------------------------------------------------------------
# selected inverse


@linalg_selected_inverse_p.def_abstract_eval
def _selinv_shape(a, *, pattern, at=None, transpose=False, solver="splu"):
    op = "linalg.selected_inverse"
    if solver not in SPARSE_SOLVERS:
        raise InvalidOptionError(f"a selected inverse is read from a factorization by "
                                 f"{' or '.join(map(repr, SPARSE_SOLVERS))}, got {solver!r}.",
                                 op=op)
    if solver == "cholmod":
        _cholmod_usable(a, op)
        if at is not None:
            raise InvalidOptionError("CHOLMOD's selected inverse is read on the matrix's own "
                                     "pattern (`at=None`).", op=op)
    if not isinstance(a, SparseType):
        raise ShapeError(f"expects a sparse matrix, got {a.str_short()}; the inverse of a "
                         "dense matrix is `sd.numpy.linalg.inv`.", op=op)
    _square(a, pattern, op)
    if at is not None and at.shape != pattern.shape:
        raise ShapeError(f"`at` is a pattern of the matrix's shape {pattern.shape}, got "
                         f"{at.shape}.", op=op)
    return TensorType(((at or pattern).nnz,), a.dtype)


@linalg_selected_inverse_p.def_impl
def _selinv_impl(a, *, pattern, at=None, transpose=False, solver="splu", site=None):
    site = site or Site("linalg.selected_inverse")
    if solver == "cholmod":  # (A symmetric, checked: A^-T = A^-1)
        from ..solvers.direct import _cholmod_ffi

        return _cholmod_ffi.selinv(pattern, _spd_checked(a, pattern, site)).astype(a.dtype)
    bare = site.bare
    want = at or pattern
    rows, cols = want.rows, want.indices
    if transpose:
        rows, cols = cols, rows

    def host(d):
        batch = d.shape[:-1]
        flat = d.reshape((-1, d.shape[-1]))
        out = np.empty((flat.shape[0], rows.size), d.dtype)
        for i, row in enumerate(flat):
            where = bare.in_example(i, batch)
            if not np.isfinite(row).all():
                _judge(where, nonfinite=True)
            try:
                out[i] = _selinv.selinv_host(pattern, row, rows, cols)
            except _selinv.SelinvBreakdown as e:
                at = "" if e.column is None else f" (at the ordered column {e.column})"
                where.fail(SingularMatrixError,
                           "the factorization without pivoting that a selected inverse "
                           f"reads met a zero pivot{at}: the matrix is singular, or neither "
                           "positive definite nor diagonally dominant. (The derivative of a "
                           "log-determinant reads this inverse: at a singular matrix it does "
                           "not exist.)")
        return (out.reshape(batch + (rows.size,)),)

    # (a raise ends what the program holds first: `releasing`)
    guarded, operands = releasing(host, [a], site.held)
    (z,) = host_call(guarded, (jax.ShapeDtypeStruct(tuple(a.shape[:-1]) + (rows.size,),
                                                    a.dtype),), *operands)
    return z


def _shifted(p: Pattern, dr: int, dc: int, n2: int) -> Pattern:
    """`p`'s entries moved by `(dr, dc)` in a matrix of order `n2` (the same
    order of entries: a uniform shift keeps CSR's)."""
    shifted, _ = Pattern.from_coo((n2, n2), p.rows + dr, p.indices + dc)
    return shifted


def _block_selinv(tl, tl_pattern, tr, tr_rows, tr_cols, want: Pattern, transpose: bool):
    """The selected inverse of `B = [[T, R], [0, T]]` (order `2n`; `T` the
    sparse values `tl` on `tl_pattern`, `R` the values `tr` at `(tr_rows,
    tr_cols)`) read in its upper right block at `want`'s entries (with
    `transpose`: `B^-T` in its lower left block), each entry of `want` and
    its mirror stored in `R`'s block (zeros where `R` has none)."""
    n = tl_pattern.shape[0]
    r, c = tl_pattern.rows, tl_pattern.indices
    extra_r = np.concatenate([want.rows, want.indices])
    extra_c = np.concatenate([want.indices, want.rows])
    dtype = type_of(tl).dtype
    t = gather(tl)
    values = ops.concatenate([t, tr, ops.zeros((extra_r.size,), dtype=dtype), t])
    rows = np.concatenate([r, tr_rows, extra_r, r + n])
    cols = np.concatenate([c, tr_cols + n, extra_c + n, c + n])
    B = coo(values, rows, cols, (2 * n, 2 * n))
    at = _shifted(want, n, 0, 2 * n) if transpose else _shifted(want, 0, n, 2 * n)
    return linalg_selected_inverse_p.bind(B, pattern=type_of(B).pattern, at=at,
                                          transpose=transpose)


@linalg_selected_inverse_p.def_jvp
def _selinv_jvp(primals, tangents, *, pattern, at=None, transpose=False, solver="splu"):
    # (the block matrices are not symmetric: their selected inverses are SuperLU's)
    (a,), (da,) = primals, tangents
    params = dict(pattern=pattern, transpose=transpose, **({} if at is None else {"at": at}),
                  **({} if solver == "splu" else {"solver": solver}))
    z = linalg_selected_inverse_p.bind(a, **params)
    if is_zero(da):
        return z, Zero(type_of(z))
    dz = _block_selinv(a, pattern, gather(instantiate(da)), pattern.rows, pattern.indices,
                       at or pattern, transpose)
    return z, dz


@linalg_selected_inverse_p.def_vjp
def _selinv_vjp(primals, z, ct, *, pattern, at=None, transpose=False, solver="splu"):
    # abar = -(A^-T C A^-T) on A's pattern, C the cotangent at `at` (at its
    # mirror with `transpose`): the upper right block of [[A^T, C], [0, A^T]]^-1
    (a,) = primals
    if is_zero(ct):
        return (None,)
    want = at or pattern
    c_rows, c_cols = (want.indices, want.rows) if transpose else (want.rows, want.indices)
    pattern_t, perm = pattern.transposed()
    at_ = assemble(ops.take(gather(a), perm), pattern_t)
    abar = _block_selinv(at_, pattern_t, instantiate(ct), c_rows, c_cols, pattern, False)
    return (assemble(abar, pattern),)


for _p in (linalg_slogdet_p, linalg_factor_slogdet_p, linalg_selected_inverse_p):
    _p.def_batch(map_rule(_p))
linalg_slogdet_p.def_sparsity(lambda outs, a, **params: dense_all(outs, a))
linalg_factor_slogdet_p.def_sparsity(lambda outs, f, a, **params: dense_all(outs, a))
linalg_selected_inverse_p.def_sparsity(lambda outs, a, **params: dense(outs[0], a))


@linalg_slogdet_p.def_cost
def _slogdet_cost(node, body):
    n = node.inputs[0].type.shape[0]
    return Cost(2.0 / 3.0 * n ** 3 if node.params.get("pattern") is None
                else 10.0 * node.params["pattern"].nnz)


@linalg_factor_slogdet_p.def_cost
def _factor_slogdet_cost(node, body):
    return Cost(float(node.inputs[1].type.shape[0]))


@linalg_selected_inverse_p.def_cost
def _selinv_cost(node, body):
    return Cost(100.0 * node.params["pattern"].nnz)
