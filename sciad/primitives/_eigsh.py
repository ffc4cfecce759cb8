"""`linalg.eigsh[pattern, k, which, sigma, tol, maxiter, degenerate_tol](a) -> (w, v)`:
`k` eigenpairs of a real symmetric sparse matrix, by ARPACK on the host.

`a` is a square sparse matrix (at run time its data vector on `pattern`);
`w` (`f64[k]`, ascending) and `v` (`f64[n, k]`, unit columns, `a v = v
diag(w)`) are what `scipy.sparse.linalg.eigsh(a, k, which=..., sigma=...)`
returns, in SciPy's ascending order (`which` defaults to SciPy's "LM";
SciPy's "BE" is an "SA" node and an "LA" node, built by
`sciad.linalg.eigsh`). With `sigma`, ARPACK runs in shift-invert mode and
SciPy factors `a - sigma I` itself (SuperLU, on the host, each call):
`which` then refers to `1 / (w - sigma)`, as in SciPy. The start vector is fixed
(a seeded random vector), so a run is reproducible; each eigenvector's
sign is fixed too (its entry of largest magnitude is positive).

Derivatives, by implicit differentiation of `a v_i = w_i v_i`, `v_i^T v_i =
1`, written in sciad ops so that they compose (higher orders, `vmap`). With
`dA` the tangent of `a` (a sparse matrix on `a`'s pattern; its symmetric
part `dS = (dA + dA^T) / 2` is what a symmetric problem sees), `V` the `k`
computed vectors and `C = V^T dS V` (`k x k`):

    dw_i = v_i^T dA v_i
    dv_i = V (F o C)[:, i] + x_i,     F_ij = 1 / (w_j - w_i) apart, 0 in a cluster

where `x_i` is the part of `dv_i` outside the computed subspace, from the
bordered system (one sparse solve per computed pair, `linalg.solve`):

    [[a - w_i I, V], [V^T, 0]] [x_i; y] = [-dS v_i; 0]

(`V^T x_i = 0`, and projected on the complement of `V`, `(a - w_i I) x_i =
-dS v_i`: the pseudo-inverse on the complement of `v_i`, split into the
computed part, `F o C` as in `linalg.eigh`, and the rest). The bordered
matrix is nonsingular when `w_i` is not an eigenvalue of `a` outside the
computed set, i.e. when `k` does not cut a cluster of repeated eigenvalues
in two; where it does, the eigenvectors are not differentiable and the
solve fails (`SingularMatrixError`) or is inaccurate.

In reverse mode every use of `dA` is a product `dA @ V` (or `dA^T @ V`),
whose transpose is `sparse.sddmm`: the cotangent of `a` is `sum_i wbar_i
v_i v_i^T` (plus the eigenvector terms) sampled on `a`'s pattern, never a
dense `n x n` array.

Degeneracy is treated as in `linalg.eigh`: eigenvalues of the computed set
within `degenerate_tol * max|w|` of each other are one cluster; sums of a
cluster's eigenvalues (and its projector) differentiate exactly, and `w`
and `dv` pass through `linalg.eigh_guard`, whose transpose raises
`DegenerateEigenvalueError` when a reverse-mode loss depends on one
eigenvalue of a cluster apart from the others or on the basis inside it.

Failures when the program runs: ARPACK's non-convergence
(`ConvergenceError`, with the number of pairs that did converge, or pairs
that are not finite), NaN or infinity in `a` (`NonFiniteError`), an `a`
that is not symmetric (`StructureError`), a `sigma` that is an eigenvalue
(`SingularMatrixError`: shift-invert factors `a - sigma M`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from ..config import x64_scope
from ..errors import (ArpackNoConvergenceError, ConvergenceError, DTypeError, InvalidOptionError, NonFiniteError,
                      NotPositiveDefiniteError, ShapeError, SingularMatrixError,
                      StructureError, plain)
from .. import _ops as ops
from ..graph import Body, Param, Primitive, Site, SparseType, Zero, instantiate, is_zero
from ..graph import jvp_eval, lower
from ..graph._body import inline, trace_body
from ..graph._cost import Cost
from ..graph._sparsity import dense_all
from ..graph._serialize import graph_param_v1, register_v1_migration
from ..graph._types import Pattern, TensorType
from ..solvers._host import host_call
from ._checks import symmetry_tolerance
from ._eigen import _gaps, default_tol, eigh_guard_p
from ._linalg import solve, solve_operator
from ._map import map_rule
from ._sparse import coo, gather, sparse_matmul_p

WHICH = ("LM", "SM", "LA", "SA")

eigsh_p = Primitive("linalg.eigsh", multiple_results=True, runtime_checks=True, params={
    "pattern": Pattern,
    "k": int,
    "which": str,
    "sigma": Param((float, None), default=None),
    "tol": Param(float, default=0.0),
    "maxiter": Param((int, None), default=None),
    "degenerate_tol": float,
    "mass_pattern": Param((Pattern, None), default=None),
    "mode": Param(str, default="normal"),
    "v0": Param((tuple[float, ...], None), default=None),
    "ncv": Param((int, None), default=None),
})

#: SciPy's modes of shift-invert (`mode`), and what `which` refers to in each:
#: `1 / (w - sigma)` ("normal"), `(w + sigma) / (w - sigma)` ("cayley");
#: "buckling" is built by `sciad.linalg.eigsh` as "normal" on the swapped pencil
MODES = ("normal", "cayley")


def _check_matrix(t, name: str, pattern, op: str) -> None:
    if not isinstance(t, SparseType):
        raise DTypeError(f"`{name}` must be a sparse matrix (`sd.sparse.coo_matrix`, "
                         f"`csr_matrix`), got {t.str_short()}; use `sd.linalg.eigh` for "
                         "dense ones.", op=op)
    n, m = t.shape
    if n != m:
        raise ShapeError(f"`{name}` must be square, got {t.str_short()}.", op=op)
    if t.pattern != pattern:
        raise ShapeError(f"the operand `{name}`'s pattern {t.pattern} differs from the "
                         f"node's param {pattern}.", op=op)
    if t.dtype != np.float64:
        raise DTypeError(f"`{name}` must be real float64, got {t.str_short()} (complex "
                         "Hermitian and float32 matrices are not supported yet).", op=op)


@eigsh_p.def_abstract_eval
def _eigsh_shape(a, *m, pattern, k, which, sigma=None, tol=0.0, maxiter=None,
                 degenerate_tol, mass_pattern=None, mode="normal", v0=None, ncv=None):
    op = "linalg.eigsh"
    _check_matrix(a, "A", pattern, op)
    if (mass_pattern is None) != (not m) or len(m) > 1:
        raise ShapeError("takes `A`, or `A` and `M` with the `mass_pattern` param.", op=op)
    n = a.shape[0]
    if m:
        _check_matrix(m[0], "M", mass_pattern, op)
        if m[0].shape != a.shape:
            raise ShapeError(f"`M` must have `A`'s shape {a.shape}, got "
                             f"{m[0].str_short()}.", op=op)
    if mode not in MODES or (mode != "normal" and not sigma):
        raise InvalidOptionError(f"`mode` must be one of {MODES} (a cayley mode with a "
                                 f"nonzero sigma), got mode={mode!r}, sigma={sigma}.", op=op)
    return _checked_results(n, k, which, tol, maxiter, degenerate_tol, op, v0, ncv)


def _checked_results(n, k, which, tol, maxiter, degenerate_tol, op, v0=None, ncv=None):
    """The options' trace-time checks; the result types `(w, v, edge)`."""
    if not 1 <= k < n:
        raise ShapeError(f"`k` must satisfy 1 <= k < n = {n} (ARPACK computes fewer "
                         f"than n eigenpairs), got k={k}. For all of them use "
                         "`sd.linalg.eigh` of the dense matrix.", op=op)
    if which not in WHICH:
        raise InvalidOptionError(f"`which` must be one of {WHICH}, got {which!r} (SciPy's "
                                 "'BE' is two nodes, 'SA' and 'LA': see `sd.linalg.eigsh`).",
                                 op=op)
    if not tol >= 0:
        raise InvalidOptionError(f"`tol` must be >= 0, got {plain(tol)}.", op=op)
    if maxiter is not None and maxiter < 1:
        raise InvalidOptionError(f"`maxiter` must be a positive integer or None, got "
                                 f"{plain(maxiter)}.", op=op)
    if not degenerate_tol >= 0:
        raise InvalidOptionError(f"`degenerate_tol` must be >= 0, got {plain(degenerate_tol)}.",
                                 op=op)
    if v0 is not None and len(v0) != n:
        raise ShapeError(f"`v0` must have n = {n} entries, got {len(v0)}.", op=op)
    if ncv is not None and not k < ncv <= n:
        raise InvalidOptionError(f"`ncv` must satisfy k < ncv <= n (k={k}, n={n}), as "
                                 f"SciPy's, got ncv={ncv}.", op=op)
    f64 = np.dtype(np.float64)
    return TensorType((k,), f64), TensorType((n, k), f64), TensorType((), f64)


def _start_vector(n: int) -> np.ndarray:
    # a fixed start vector: reproducible runs (ARPACK's default is random),
    # and, being random, not orthogonal to any eigenvector in practice
    return np.random.default_rng(0).standard_normal(n)


def _arpack_args(n: int, k: int, v0, ncv):
    """The start vector and basis size ARPACK gets for `k + 1` pairs: `v0`
    (a fixed seeded one when None), and `ncv + 1` (at most `n`): sciad asks
    for one pair more than `k`, and keeps the `ncv - k` spare vectors the
    caller asked for."""
    v0 = _start_vector(n) if v0 is None else np.asarray(v0, np.float64)
    return v0, None if ncv is None else min(int(ncv) + 1, n)


def _key(w, which: str, sigma, mode: str = "normal"):
    """ARPACK's order of wantedness for `which` (on `1 / (w - sigma)` in
    shift-invert mode, `(w + sigma) / (w - sigma)` in cayley mode): the
    most wanted eigenvalues have the smallest key."""
    x = w if sigma is None else (1.0 / (w - sigma) if mode == "normal"
                                 else (w + sigma) / (w - sigma))
    return {"SA": x, "LA": -x, "LM": -np.abs(x), "SM": np.abs(x)}[which]


def _eigsh_host(data, mdata=None, *, pattern, mass_pattern, k, which, sigma, tol, maxiter,
                site, mode="normal", v0=None, ncv=None):
    """ARPACK on each matrix of a batch (leading axes of `data`): the `k`
    wanted eigenpairs, and the next eigenvalue in ARPACK's order (`k + 1`
    are computed; a small matrix is solved densely)."""
    import scipy.linalg as sla  # (SciPy's ARPACK and LAPACK load in ~0.1 s: when first used)
    import scipy.sparse.linalg as spla

    n = pattern.shape[0]
    data = np.asarray(data)
    batch = data.shape[:-1]
    if mdata is not None:  # (either may be the batched one)
        mdata = np.asarray(mdata)
        batch = np.broadcast_shapes(batch, mdata.shape[:-1])
    flat = np.broadcast_to(data, batch + (pattern.nnz,)).reshape((-1, pattern.nnz))
    mflat = None if mdata is None else np.broadcast_to(
        mdata, batch + (mass_pattern.nnz,)).reshape((-1, mass_pattern.nnz))
    ws, vs, edges = np.empty((len(flat), k)), np.empty((len(flat), n, k)), np.empty(len(flat))
    v0, ncv = _arpack_args(n, k, v0, ncv)

    def matrix(d, p, name):
        if not np.all(np.isfinite(d)):
            site.fail(NonFiniteError, f"`{name}` holds NaN or infinite values.")
        m = sp.csr_matrix((d, p.indices, p.indptr), shape=p.shape)
        scale = float(np.max(np.abs(d), initial=0.0))
        asym = float(abs(m - m.T).max()) / scale if scale > 0 else 0.0
        if not asym <= symmetry_tolerance(np.float64):
            site.fail(StructureError,
                      f"`{name}` must be symmetric, but max |{name} - {name}.T| / "
                      f"max |{name}| = {asym:.3e}. Symmetrize it.", asymmetry=asym)
        return m

    for b, d in enumerate(flat):
        a = matrix(d, pattern, "A")
        mm = None if mflat is None else matrix(mflat[b], mass_pattern, "M")
        if mm is not None and not float(mm.diagonal().min(initial=np.inf)) > 0:
            site.fail(NotPositiveDefiniteError, "`M` must be positive definite, but its "
                      f"diagonal has the entry {float(mm.diagonal().min()):.3e}.")
        if k + 1 >= n - 1:  # ARPACK needs k < n - 1 (k + 1 wanted): small, dense
            try:
                w, v = sla.eigh(a.toarray(), None if mm is None else mm.toarray())
            except np.linalg.LinAlgError:
                site.fail(NotPositiveDefiniteError, "`M` must be positive definite.")
        else:
            try:
                w, v = spla.eigsh(a, k=k + 1, M=mm, which=which, sigma=sigma, tol=tol,
                                  maxiter=maxiter, v0=v0, ncv=ncv, mode=mode)
            except spla.ArpackNoConvergence as e:
                _no_convergence(site, e, k, which, sigma, tol, maxiter, mode)
            except RuntimeError as e:  # SuperLU's "Factor is exactly singular"
                if sigma is None or "singular" not in str(e):
                    raise
                site.fail(SingularMatrixError,
                          f"shift-invert factors `A - sigma M`, which is singular: sigma="
                          f"{sigma!r} is an eigenvalue. Move sigma off it (by 1e-8 |sigma|, "
                          "say): the eigenvalues nearest it are found all the same.")
        _finite_pairs(site, w, v)
        ws[b], vs[b], edges[b] = _finish(w, v, k, which, sigma, mode)
    return ws.reshape(batch + (k,)), vs.reshape(batch + (n, k)), edges.reshape(batch)


def _finish(w, v, k: int, which: str, sigma, mode: str = "normal"):
    """From `k + 1` or more eigenpairs (ARPACK's, or a dense solver's all):
    the `k` most wanted sorted ascending, each vector's largest entry
    positive, and the next eigenvalue in ARPACK's order (`edge`)."""
    wanted = np.argsort(_key(w, which, sigma, mode), kind="stable")[:k + 1]
    edge = w[wanted[-1]]
    w, v = w[wanted[:-1]], v[:, wanted[:-1]]
    order = np.argsort(w)
    w, v = w[order], v[:, order]
    return w, _signed(v), edge


def _signed(v):
    """Each column with its entry of largest magnitude positive."""
    big = np.argmax(np.abs(v), axis=0)
    return v * np.where(v[big, np.arange(v.shape[1])] < 0, -1.0, 1.0)


def _finite_pairs(site, w, v):
    """ARPACK's (or LAPACK's) eigenpairs, finite for a finite matrix: NaN
    there is a failure, never a result."""
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(v))):
        site.fail(ConvergenceError, "the eigensolver returned NaN or infinite eigenpairs for "
                  "a finite matrix. Raise `maxiter`, or use shift-invert (`sigma`) near the "
                  "eigenvalues wanted.")


#: the most entries of converged eigenvectors a no-convergence error carries
#: (they cross XLA in the error's text)
ATTACHED_ENTRIES = 1 << 20


def converged_pairs(e, k: int, which: str, sigma, mode: str = "normal"):
    """ARPACK's converged pairs of a no-convergence (`e`, SciPy's
    `ArpackNoConvergence`): the `k` most wanted of them, ascending, signed as
    the results are."""
    w, v = np.asarray(e.eigenvalues).real, np.asarray(e.eigenvectors).real
    keep = np.isfinite(w) & np.all(np.isfinite(v), axis=0)
    w, v = w[keep], v[:, keep]
    wanted = np.argsort(_key(w, which, sigma, mode), kind="stable")[:k]
    w, v = w[wanted], v[:, wanted]
    order = np.argsort(w)
    return w[order], _signed(v[:, order]) if v.size else v[:, order]


def _no_convergence(site, e, k, which, sigma, tol, maxiter, mode="normal"):
    w, v = converged_pairs(e, k, which, sigma, mode)
    got = len(w)
    vectors = v.tolist() if v.size <= ATTACHED_ENTRIES else None
    site.fail(ArpackNoConvergenceError,
              f"ARPACK did not converge: {len(e.eigenvalues)} of the {k + 1} eigenpairs "
              f"converged (k={k} and the next, which={which!r}, sigma={sigma}, tol={tol:g}, "
              f"maxiter={maxiter}); the error's `eigenvalues` and `eigenvectors` hold the "
              f"{got} converged ones among the k wanted, as SciPy's ArpackNoConvergence "
              "does. Raise `maxiter`, loosen `tol`, or for eigenvalues in the interior or "
              "near a value use shift-invert (`sigma`).",
              converged=got, iterations=maxiter, tolerance=float(tol),
              eigenvalues=w.tolist(), eigenvectors=vectors)


@eigsh_p.def_impl
def _eigsh_impl(data, *mdata, pattern, k, which, sigma=None, tol=0.0, maxiter=None,
                degenerate_tol, mass_pattern=None, mode="normal", v0=None, ncv=None,
                site=None):
    site = site or Site("linalg.eigsh")
    n = pattern.shape[0]

    def host(d, *m):
        return _eigsh_host(d, *m, pattern=pattern, mass_pattern=mass_pattern, k=k,
                           which=which, sigma=sigma, tol=tol, maxiter=maxiter, site=site,
                           mode=mode, v0=v0, ncv=ncv)

    return tuple(host_call(host, (jax.ShapeDtypeStruct((k,), jnp.float64),
                                  jax.ShapeDtypeStruct((n, k), jnp.float64),
                                  jax.ShapeDtypeStruct((), jnp.float64)), data, *mdata))


def _bordered(a, m, w_i, v, mv):
    """`[[a - w_i m, m V], [V^T m, 0]]` (`m` the identity where None) as a
    sparse matrix, its data built from `a`'s, `m`'s, `w_i` and `m V`:
    differentiable in all of them."""
    t = a.type
    n, k = t.shape[0], v.shape[1]
    p = t.pattern
    ar = np.arange(n)
    border_r = np.repeat(ar, k)                 # (m V)[r, j] at (r, n + j), row-major
    border_c = n + np.tile(np.arange(k), n)
    if m is None:
        mp_rows, mp_cols, m_data = ar, ar, -w_i * ops.ones((n,), np.float64)
    else:
        mp = m.type.pattern
        mp_rows, mp_cols, m_data = mp.rows, mp.indices, -w_i * gather(m)
    row = np.concatenate([p.rows, mp_rows, border_r, border_c])
    col = np.concatenate([p.indices, mp_cols, border_c, border_r])
    flat = ops.reshape(mv, (n * k,))
    data = ops.concatenate([gather(a), m_data, flat, flat])
    return coo(data, row, col, (n + k, n + k))


def _sym_times(d, v):
    """`(d + d^T) / 2 @ V` for a sparse tangent `d`: two products whose
    transposes are `sddmm`s on `d`'s pattern."""
    p = d.type.pattern
    return (sparse_matmul_p.bind(d, v, pattern=p)
            + sparse_matmul_p.bind(d, v, pattern=p, transpose=True)) / 2


@eigsh_p.def_jvp
def _eigsh_jvp(primals, tangents, **params):
    # A v_i = w_i M v_i, V^T M V = I. With dK_i = dA - w_i dM (symmetric
    # parts) and c_ji = v_j^T dK_i v_i: dw_i = c_ii, and dv_i = V a_i + x_i,
    # a_ji = c_ji / (w_i - w_j) apart, -(v_j^T dM v_i) / 2 inside a cluster
    # (the normalization; 0 without M), and x_i the part M-orthogonal to V,
    # from the bordered solve (module docstring)
    a, m = primals[0], (primals[1] if len(primals) > 1 else None)
    w, v, edge = eigsh_p.bind(*primals, **params)
    tol = params["degenerate_tol"]
    dsv = _sym_times(instantiate(tangents[0]), v)              # dS_A V
    mv = v if m is None else sparse_matmul_p.bind(m, v, pattern=m.type.pattern)
    dmv = None
    if m is not None and not is_zero(tangents[1]):
        dmv = _sym_times(instantiate(tangents[1]), v)          # dS_M V
        dsv = dsv - dmv * w                                    # column i: dK_i v_i
    gaps = _gaps(w, tol)
    a_in = gaps * ops.matmul(ops.transpose(v), dsv)
    if dmv is not None:
        a_in = a_in - ops.where(gaps == 0, ops.matmul(ops.transpose(v), dmv), 0.0) / 2
    return _pair_tangents(w, v, edge, dsv, a_in, tol,
                          lambda i, rhs: solve(_bordered(a, m, w[i], v, mv), rhs))


def _pair_tangents(w, v, edge, dkv, a_in, tol: float, bordered_solve):
    """The JVP's results from `dK_i v_i` (`dkv`, column `i`) and the
    coefficients `a_in` of the tangents in the computed subspace:
    `dw_i = v_i^T dK_i v_i`, `dv = V a_in + x` with `x_i` from
    `bordered_solve(i, [-dK_i v_i; 0])`."""
    n, k = v.shape
    dw = ops.sum(v * dkv, axis=0)
    inside = ops.matmul(v, a_in)
    outside = [bordered_solve(i, ops.concatenate([-dkv[:, i], ops.zeros((k,), np.float64)]))
               [:n] for i in range(k)]
    # The guard judges `V^T vbar`, which only the computed-subspace part sees;
    # the solves stay outside it, so that a loss of `w` alone (a zero `vbar`)
    # transposes to no solve at all. `edge` (the next eigenvalue) lets it
    # refuse a cluster that `k` cuts.
    dw, inside = eigh_guard_p.bind(dw, inside, w, v, edge, degenerate_tol=tol, check=False,
                                   op="linalg.eigsh")
    dedge = Zero(TensorType((), np.dtype(np.float64)))
    return (w, v, edge), (dw, inside + ops.stack(outside, axis=1), dedge)


eigsh_p.def_batch(map_rule(eigsh_p))


@eigsh_p.def_cost
def _eigsh_cost(node, body):
    # ARPACK (implicitly restarted Lanczos) with ncv = max(2k + 1, 20) basis
    # vectors: per restart about ncv matrix-vector products (2 nnz each) and
    # the reorthogonalization, 4 n ncv^2; a few restarts for well-separated
    # eigenvalues (counted as 10). Shift-invert adds a sparse LU of
    # `a - sigma I` (counted as 20 nnz n^0.5) and replaces each product with
    # a pair of triangular solves.
    p = node.params
    n, k, nnz = p["pattern"].shape[0], p["k"], p["pattern"].nnz
    ncv = min(max(2 * k + 1, 20) if p.get("ncv") is None else p["ncv"] + 1, n)
    per_product = 2.0 * nnz if p.get("sigma") is None else 8.0 * nnz
    flops = 10.0 * ncv * (per_product + 4.0 * n * ncv)
    if p.get("sigma") is not None:
        flops += 20.0 * nnz * np.sqrt(n)
    return Cost(float(flops))


def eigsh(a, k: int = 6, m=None, *, which: str | None = None, sigma=None,
          tol: float = 0.0, maxiter: int | None = None,
          degenerate_tol: float | None = None, mode: str = "normal", v0=None,
          ncv: int | None = None):
    """`eigsh_p` with SciPy's defaults resolved (see `sciad.linalg.eigsh`);
    returns `(w, v)`."""
    op = "linalg.eigsh"
    for name, x in (("A", a), ("M", m)):
        t = getattr(x, "type", None)
        if x is not None and not isinstance(t, SparseType):
            shown = t.str_short() if t is not None else type(x).__name__
            raise DTypeError(f"`{name}` must be a sparse matrix (`sd.sparse.coo_matrix`, "
                             f"`csr_matrix`), got {shown}; use `sd.linalg.eigh` for dense "
                             "ones.", op=op)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ShapeError(f"`k` must be an int, got {k!r}.", op=op)
    if which is None:
        which = "LM"  # SciPy's default, with or without `sigma`
    if sigma is not None:
        sigma = float(sigma)
    if maxiter is not None:
        maxiter = int(maxiter)
    tol_d = default_tol(np.float64) if degenerate_tol is None else float(degenerate_tol)
    operands = (a,) if m is None else (a, m)
    w, v, _ = eigsh_p.bind(*operands, pattern=a.type.pattern, k=int(k), which=str(which),
                           sigma=sigma, tol=float(tol), maxiter=maxiter,
                           degenerate_tol=tol_d,
                           mass_pattern=None if m is None else m.type.pattern,
                           mode=str(mode) if sigma is not None else "normal",
                           v0=_as_v0(v0), ncv=None if ncv is None else int(ncv))
    return w, v


def eigsh_host_operator(A, k, M, sigma, which, v0, ncv, maxiter, tol, return_eigenvectors,
                        Minv, OPinv, mode, rng=None):
    """SciPy's `eigsh` run now, on the host, for a SciPy `LinearOperator`
    (`A` or `M`): SciPy's results, as constants (a host operator has no
    derivative to give), ascending (or in SciPy's order without vectors),
    each vector's largest entry positive; `v0` fixed as sciad's, unless
    `rng` is given (SciPy's: its random start, as SciPy draws it). A
    no-convergence raises `ArpackNoConvergenceError` with SciPy's converged
    pairs."""
    import scipy.sparse.linalg as spla  # (when first used: see `_eigsh_host`)

    op = "linalg.eigsh"
    n = A.shape[0]
    if v0 is None and rng is None:
        v0 = _start_vector(n)
    try:
        out = spla.eigsh(A, k, M=M, sigma=sigma, which=which, v0=v0, ncv=ncv,
                         maxiter=maxiter, tol=tol, return_eigenvectors=return_eigenvectors,
                         Minv=Minv, OPinv=OPinv, mode=mode,
                         **({} if rng is None else {"rng": rng}))
    except spla.ArpackNoConvergence as e:
        w, v = converged_pairs(e, k, which, sigma, mode)
        raise ArpackNoConvergenceError(
            f"ARPACK did not converge ({e}); the error's `eigenvalues` and `eigenvectors` "
            f"hold the {len(w)} converged pairs. Raise `maxiter`, loosen `tol`, or use "
            "shift-invert (`sigma`).", op=op, converged=len(w), eigenvalues=w,
            eigenvectors=v, iterations=maxiter, tolerance=float(tol)) from None
    if not return_eigenvectors:
        return np.asarray(out)
    w, v = out
    order = np.argsort(w, kind="stable")
    return w[order], _signed(v[:, order])


def _as_v0(v0):
    """`v0` as the node's param: a tuple of floats (or None)."""
    if v0 is None:
        return None
    v0 = np.asarray(v0, dtype=np.float64)
    if v0.ndim != 1 or not np.all(np.isfinite(v0)):
        raise ShapeError(f"`v0` must be a finite vector, got shape {v0.shape}.",
                         op="linalg.eigsh")
    return tuple(float(x) for x in v0)


# ---------------------------------------------------------------------------
# matrix-free: `linalg.eigsh_operator[graph, k, which, ...](*params)`, the
# operator a closed body `(*params, v) -> (A(params) v,)`


eigsh_operator_p = Primitive("linalg.eigsh_operator", multiple_results=True,
                             runtime_checks=True, params={
                                 "body": Body, "k": int, "which": str,
                                 "tol": Param(float, default=0.0),
                                 "maxiter": Param((int, None), default=None),
                                 "degenerate_tol": float,
                                 "v0": Param((tuple[float, ...], None), default=None),
                                 "ncv": Param((int, None), default=None)})


@eigsh_operator_p.def_abstract_eval
def _operator_shape(*params, body, k, which, tol=0.0, maxiter=None, degenerate_tol, v0=None,
                    ncv=None):
    op = "linalg.eigsh"
    if not isinstance(body, Body) or len(body.inputs) != len(params) + 1 \
            or len(body.outputs) != 1 or tuple(params) != tuple(body.in_types[:-1]):
        raise ShapeError("the matvec body must map (*params, v) to one vector, and the "
                         "operands must be its params.", op=op)
    v, out = body.inputs[-1].type, body.outputs[0].type
    if not isinstance(v, TensorType) or v.ndim != 1 or out != v or v.dtype != np.float64:
        raise ShapeError(f"the operator's matvec must map a float64 vector to one of the "
                         f"same shape, got {v.str_short()} -> {out.str_short()}.", op=op)
    return _checked_results(v.shape[0], k, which, tol, maxiter, degenerate_tol, op, v0, ncv)


def _operator_host(matvec, n, k, which, tol, maxiter, site, v0=None, ncv=None):
    """ARPACK on a matrix-free operator (`matvec` a host function), for one
    operator (matrix-free operators are not batched on the host: a batch
    runs as a `lax.map` of the primitive)."""
    import scipy.sparse.linalg as spla  # (when first used: see `_eigsh_host`)

    def mv(x):
        with x64_scope():
            y = np.asarray(matvec(np.asarray(x, np.float64).reshape(n)))
        if not np.all(np.isfinite(y)):
            site.fail(NonFiniteError, "the operator's matvec returned NaN or infinite "
                                      "values.")
        return y

    op = spla.LinearOperator((n, n), matvec=mv, dtype=np.float64)
    if k + 1 >= n - 1:  # ARPACK needs k < n - 1: the dense matrix, column by column
        dense = np.stack([mv(e) for e in np.eye(n)], axis=1)
        w, v = np.linalg.eigh((dense + dense.T) / 2)
    else:
        try:
            v0, ncv = _arpack_args(n, k, v0, ncv)
            w, v = spla.eigsh(op, k=k + 1, which=which, tol=tol, maxiter=maxiter,
                              v0=v0, ncv=ncv)
        except spla.ArpackNoConvergence as e:
            _no_convergence(site, e, k, which, None, tol, maxiter)
    _finite_pairs(site, w, v)
    # ARPACK trusts the operator to be symmetric: check it on the result
    av = np.stack([mv(v[:, j]) for j in range(v.shape[1])], axis=1)
    sym = float(np.max(np.abs(v.T @ av - (v.T @ av).T)))
    scale = float(np.max(np.abs(w), initial=0.0)) or 1.0
    if not sym <= 1e3 * np.sqrt(np.finfo(np.float64).eps) * scale:
        site.fail(StructureError,
                  f"the operator must be symmetric, but on its computed eigenvectors "
                  f"max |V^T A V - (V^T A V)^T| = {sym:.3e} (max |w| {scale:.3e}).",
                  asymmetry=sym)
    return _finish(w, v, k, which, None)


@eigsh_operator_p.def_impl
def _operator_impl(*params, body, k, which, tol=0.0, maxiter=None, degenerate_tol,
                   v0=None, ncv=None, site=None):
    # (the body runs in its own program, called from ARPACK's loop on the
    # host: it closes over no value of this one)
    site = (site or Site("linalg.eigsh")).bare
    n = body.inputs[-1].type.shape[0]
    f = jax.jit(lower(body))

    ranks = [len(t.shape) for t in body.in_types[:-1]]

    def host(*arrays):
        # under `vmap` the params arrive with leading batch axes: one
        # eigenproblem per example
        batch = np.shape(arrays[0])[:np.ndim(arrays[0]) - ranks[0]] if arrays else ()
        count = int(np.prod(batch, dtype=np.int64))
        flat = [np.broadcast_to(a, batch + np.shape(a)[np.ndim(a) - r:]).reshape(
            (count,) + np.shape(a)[np.ndim(a) - r:]) for a, r in zip(arrays, ranks)]
        outs = [_operator_host(lambda x, b=b: f(*(a[b] for a in flat), x)[0], n, k, which,
                               tol, maxiter, site, v0, ncv) for b in range(count)]
        return (np.stack([o[0] for o in outs]).reshape(batch + (k,)),
                np.stack([o[1] for o in outs]).reshape(batch + (n, k)),
                np.array([o[2] for o in outs]).reshape(batch))

    return tuple(host_call(host, (jax.ShapeDtypeStruct((k,), jnp.float64),
                                  jax.ShapeDtypeStruct((n, k), jnp.float64),
                                  jax.ShapeDtypeStruct((), jnp.float64)), *params))


def _bordered_matvec(matvec, n: int, w_i, v):
    """The product with `[[A - w_i I, V], [V^T, 0]]` (symmetric), matrix-free."""
    def mv(z):
        x, y = z[:n], z[n:]
        return ops.concatenate([matvec(x) - w_i * x + ops.matmul(v, y),
                                ops.matmul(ops.transpose(v), x)])

    return mv


@eigsh_operator_p.def_jvp
def _operator_jvp(primals, tangents, **params):
    # as `linalg.eigsh`'s (M = I), with dA v_i the tangent of the matvec at
    # v_i (dA is symmetric: A(p) is for every p) and the bordered systems
    # solved matrix-free (`solve` with GMRES, tol 1e-12)
    body, tol = params["body"], params["degenerate_tol"]
    w, v, edge = eigsh_operator_p.bind(*primals, **params)
    n, k = v.shape
    zero_v = Zero(TensorType((n,), np.dtype(np.float64)))
    cols = []
    for i in range(k):
        _, (t,) = jvp_eval(body, [*primals, v[:, i]], [*tangents, zero_v])
        cols.append(instantiate(t))
    dav = ops.stack(cols, axis=1)                              # dA V
    a_in = _gaps(w, tol) * ops.matmul(ops.transpose(v), dav)

    def matvec(x):
        return inline(body, [*primals, x])[0]

    return _pair_tangents(
        w, v, edge, dav, a_in, tol,
        lambda i, rhs: solve_operator(_bordered_matvec(matvec, n, w[i], v), n + k,
                                      np.dtype(np.float64), frozenset({"symmetric"}), rhs,
                                      "gmres", tol=1e-12))


eigsh_operator_p.def_batch(map_rule(eigsh_operator_p))


@eigsh_operator_p.def_cost
def _operator_cost(node, body):
    # as `linalg.eigsh`'s without shift-invert, the product one matvec
    p = node.params
    mv = body(p["body"])
    n, k = p["body"].inputs[-1].type.shape[0], p["k"]
    ncv = min(max(2 * k + 3, 20) if p.get("ncv") is None else p["ncv"] + 1, n)
    return Cost(float(10.0 * ncv * (mv.flops + 4.0 * n * ncv)), mv.peak)


# version-1 files: the matvec was the param `graph`, its params all consts
register_v1_migration("linalg.eigsh_operator",
                      graph_param_v1(lambda g: Body.of(g, len(g.inputs) - 1)))


def eigsh_operator(a, k: int, which: str | None, tol: float, maxiter, degenerate_tol,
                   v0=None, ncv=None):
    """`eigsh_operator_p` for a `sciad.linalg.Operator` (see `sciad.linalg.eigsh`)."""
    n = a.shape[0]
    graph, captured, _ = trace_body(lambda x: [ops.asarray(a.matvec(x))],
                                    (TensorType((n,), np.dtype(np.float64)),), name="matvec")
    tol_d = default_tol(np.float64) if degenerate_tol is None else float(degenerate_tol)
    w, v, _ = eigsh_operator_p.bind(*captured, body=Body.of(graph, len(captured)), k=int(k),
                                    which="LM" if which is None else str(which),
                                    tol=float(tol), maxiter=maxiter, degenerate_tol=tol_d,
                                    v0=_as_v0(v0), ncv=None if ncv is None else int(ncv))
    return w, v


# ---------------------------------------------------------------------------
# Sparsity: every eigenpair (and the next eigenvalue) depends on every entry
# of the matrices (the operator's params).


def _install_sparsity_rules() -> None:
    def rule(outs, *deps, **params):
        return dense_all(outs, *deps)

    eigsh_p.def_sparsity(rule)
    eigsh_operator_p.def_sparsity(rule)


_install_sparsity_rules()
