"""`linalg.eigsh[pattern, k, which, sigma, tol, maxiter, degenerate_tol](a) -> (w, v)`:
`k` eigenpairs of a real symmetric sparse matrix, by ARPACK on the host.

`a` is a square sparse matrix (at run time its data vector on `pattern`);
`w` (`f64[k]`, ascending) and `v` (`f64[n, k]`, unit columns, `a v = v
diag(w)`) are what `scipy.sparse.linalg.eigsh(a, k, which=..., sigma=...)`
returns, sorted. With `sigma`, ARPACK runs in shift-invert mode and SciPy
factors `a - sigma I` itself (SuperLU, on the host, each call): `which`
then refers to `1 / (w - sigma)`, as in SciPy. The start vector is fixed
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
(`ConvergenceError`, with the number of pairs that did converge), NaN or
infinity in `a` (`NonFiniteError`), an `a` that is not symmetric
(`StructureError`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import (ConvergenceError, DTypeError, NonFiniteError, ShapeError,
                      StructureError)
from ..graph import Param, Primitive, SparseType, instantiate
from ..graph._types import Pattern, TensorType
from ..solvers._host import host_call
from ._checks import symmetry_tolerance
from ._eigen import _gaps, default_tol, eigh_guard_p
from ._map import map_rule

WHICH = ("LM", "SM", "LA", "SA")

eigsh_p = Primitive("linalg.eigsh", multiple_results=True, runtime_checks=True, params={
    "pattern": Pattern,
    "k": int,
    "which": str,
    "sigma": Param((float, None), default=None),
    "tol": Param(float, default=0.0),
    "maxiter": Param((int, None), default=None),
    "degenerate_tol": float,
})


@eigsh_p.def_abstract_eval
def _eigsh_shape(a, *, pattern, k, which, sigma=None, tol=0.0, maxiter=None,
                 degenerate_tol):
    op = "linalg.eigsh"
    if not isinstance(a, SparseType):
        raise DTypeError(f"`A` must be a sparse matrix (`sd.sparse.coo_matrix`, "
                         f"`csr_matrix`), got {a.str_short()}; use `sd.linalg.eigh` for "
                         "a dense one.", op=op)
    n, m = a.shape
    if n != m:
        raise ShapeError(f"`A` must be square, got {a.str_short()}.", op=op)
    if a.pattern != pattern:
        raise ShapeError(f"the operand's pattern {a.pattern} differs from the node's "
                         f"`pattern` param {pattern}.", op=op)
    if a.dtype != np.float64:
        raise DTypeError(f"`A` must be real float64, got {a.str_short()} (complex "
                         "Hermitian and float32 matrices are not supported yet).", op=op)
    if not 1 <= k < n:
        raise ShapeError(f"`k` must satisfy 1 <= k < n = {n} (ARPACK computes fewer "
                         f"than n eigenpairs), got k={k}. For all of them use "
                         "`sd.linalg.eigh(sd.sparse.todense(A))`.", op=op)
    if which not in WHICH:
        raise ShapeError(f"`which` must be one of {WHICH}, got {which!r} ('BE' is not "
                         "supported).", op=op)
    if not tol >= 0:
        raise ShapeError(f"`tol` must be >= 0, got {tol!r}.", op=op)
    if maxiter is not None and maxiter < 1:
        raise ShapeError(f"`maxiter` must be a positive integer or None, got {maxiter!r}.",
                         op=op)
    if not degenerate_tol >= 0:
        raise ShapeError(f"`degenerate_tol` must be >= 0, got {degenerate_tol!r}.", op=op)
    return TensorType((k,), np.dtype(np.float64)), TensorType((n, k), np.dtype(np.float64))


def _start_vector(n: int) -> np.ndarray:
    # a fixed start vector: reproducible runs (ARPACK's default is random),
    # and, being random, not orthogonal to any eigenvector in practice
    return np.random.default_rng(0).standard_normal(n)


def _eigsh_host(data, *, pattern, k, which, sigma, tol, maxiter, site):
    """ARPACK on each matrix of a batch (leading axes of `data`)."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    n = pattern.shape[0]
    data = np.asarray(data)
    batch = data.shape[:-1]
    flat = data.reshape((-1, pattern.nnz))
    ws = np.empty((len(flat), k))
    vs = np.empty((len(flat), n, k))
    v0 = _start_vector(n)
    for b, d in enumerate(flat):
        if not np.all(np.isfinite(d)):
            site.fail(NonFiniteError, "the matrix holds NaN or infinite values.")
        m = sp.csr_matrix((d, pattern.indices, pattern.indptr), shape=pattern.shape)
        scale = float(np.max(np.abs(d), initial=0.0))
        asym = float(abs(m - m.T).max()) / scale if scale > 0 else 0.0
        if not asym <= symmetry_tolerance(np.float64):
            site.fail(StructureError,
                      f"`A` must be symmetric, but max |A - A.T| / max |A| = {asym:.3e}. "
                      "Symmetrize it (`(A + A.T) / 2`).", asymmetry=asym)
        try:
            w, v = spla.eigsh(m, k=k, which=which, sigma=sigma, tol=tol, maxiter=maxiter,
                              v0=v0)
        except spla.ArpackNoConvergence as e:
            got = len(e.eigenvalues)
            site.fail(ConvergenceError,
                      f"ARPACK did not converge: {got} of the k={k} eigenpairs converged "
                      f"(which={which!r}, sigma={sigma}, tol={tol:g}, maxiter={maxiter}). "
                      "Raise `maxiter`, loosen `tol`, or for eigenvalues in the interior "
                      "or near a value use shift-invert (`sigma`).",
                      converged=got, iterations=maxiter, tolerance=float(tol))
        order = np.argsort(w)
        w, v = w[order], v[:, order]
        big = np.argmax(np.abs(v), axis=0)
        v = v * np.where(v[big, np.arange(k)] < 0, -1.0, 1.0)
        ws[b], vs[b] = w, v
    return ws.reshape(batch + (k,)), vs.reshape(batch + (n, k))


@eigsh_p.def_impl
def _eigsh_impl(data, *, pattern, k, which, sigma=None, tol=0.0, maxiter=None,
                degenerate_tol, site=None):
    from ..graph import Site

    site = site or Site("linalg.eigsh")
    n = pattern.shape[0]

    def host(d):
        return _eigsh_host(d, pattern=pattern, k=k, which=which, sigma=sigma, tol=tol,
                           maxiter=maxiter, site=site)

    w, v = host_call(host, (jax.ShapeDtypeStruct((k,), jnp.float64),
                            jax.ShapeDtypeStruct((n, k), jnp.float64)), data)
    return w, v


def _bordered(a, w_i, v):
    """`[[a - w_i I, V], [V^T, 0]]` as a sparse matrix (its data built from
    `a`'s, `w_i` and `V`: differentiable in all three)."""
    from .. import numpy as snp
    from .. import sparse

    t = a.type
    n, k = t.shape[0], v.shape[1]
    p = t.pattern
    ar = np.arange(n)
    border_r = np.repeat(ar, k)                 # V[r, j] at (r, n + j), row-major
    border_c = n + np.tile(np.arange(k), n)
    row = np.concatenate([p.rows, ar, border_r, border_c])
    col = np.concatenate([p.indices, ar, border_c, border_r])
    flat_v = snp.reshape(v, (n * k,))
    data = snp.concatenate([sparse.data(a), -w_i * snp.ones((n,), np.float64), flat_v,
                            flat_v])
    return sparse.coo_matrix((data, (row, col)), shape=(n + k, n + k))


@eigsh_p.def_jvp
def _eigsh_jvp(primals, tangents, **params):
    # a v_i = w_i v_i, |v_i| = 1: dw_i = v_i^T dA v_i, and dv_i = V (F o C)_i + x_i
    # (the computed subspace, as `linalg.eigh`, plus the bordered solve for the
    # rest; see the module docstring)
    from .. import numpy as snp
    from .. import sparse
    from ..linalg import solve

    (a,), (da,) = primals, tangents
    w, v = eigsh_p.bind(a, **params)
    tol = params["degenerate_tol"]
    n, k = v.shape
    da = instantiate(da)
    dav = sparse.matmul(da, v)                                 # dA V: sddmm when transposed
    dsv = (dav + snp.transpose(sparse.matmul(snp.transpose(v), da))) / 2  # dS V
    dw = snp.sum(v * dav, axis=0)
    c = snp.matmul(snp.transpose(v), dsv)
    inside = snp.matmul(v, _gaps(w, tol) * c)
    outside = []
    for i in range(k):
        rhs = snp.concatenate([-dsv[:, i], snp.zeros((k,), np.float64)])
        outside.append(solve(_bordered(a, w[i], v), rhs)[:n])
    # The guard judges `V^T vbar`, which only the computed-subspace part sees;
    # the solves stay outside it, so that a loss of `w` alone (a zero `vbar`)
    # transposes to no solve at all.
    dw, inside = eigh_guard_p.bind(dw, inside, w, v, degenerate_tol=tol, check=False,
                                   op="linalg.eigsh")
    return (w, v), (dw, inside + snp.stack(outside, axis=1))


eigsh_p.def_batch(map_rule(eigsh_p))


@eigsh_p.def_cost
def _eigsh_cost(node, body):
    # ARPACK (implicitly restarted Lanczos) with ncv = max(2k + 1, 20) basis
    # vectors: per restart about ncv matrix-vector products (2 nnz each) and
    # the reorthogonalization, 4 n ncv^2; a few restarts for well-separated
    # eigenvalues (counted as 10). Shift-invert adds a sparse LU of
    # `a - sigma I` (counted as 20 nnz n^0.5) and replaces each product with
    # a pair of triangular solves.
    from ..graph._cost import Cost

    p = node.params
    n, k, nnz = p["pattern"].shape[0], p["k"], p["pattern"].nnz
    ncv = min(max(2 * k + 1, 20), n)
    per_product = 2.0 * nnz if p.get("sigma") is None else 8.0 * nnz
    flops = 10.0 * ncv * (per_product + 4.0 * n * ncv)
    if p.get("sigma") is not None:
        flops += 20.0 * nnz * np.sqrt(n)
    return Cost(float(flops))


def eigsh(a, k: int = 6, *, which: str | None = None, sigma=None, tol: float = 0.0,
          maxiter: int | None = None, degenerate_tol: float | None = None):
    """`eigsh_p` with SciPy's defaults resolved (see `sciad.linalg.eigsh`)."""
    op = "linalg.eigsh"
    t = getattr(a, "type", None)
    if not isinstance(t, SparseType):
        shown = t.str_short() if t is not None else type(a).__name__
        raise DTypeError(f"`A` must be a sparse matrix (`sd.sparse.coo_matrix`, "
                         f"`csr_matrix`), got {shown}; use `sd.linalg.eigh` for a dense "
                         "one.", op=op)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ShapeError(f"`k` must be an int, got {k!r}.", op=op)
    if which is None:
        which = "SA" if sigma is None else "LM"
    if sigma is not None:
        sigma = float(sigma)
    if maxiter is not None:
        maxiter = int(maxiter)
    tol_d = default_tol(np.float64) if degenerate_tol is None else float(degenerate_tol)
    return tuple(eigsh_p.bind(a, pattern=t.pattern, k=int(k), which=str(which),
                              sigma=sigma, tol=float(tol), maxiter=maxiter,
                              degenerate_tol=tol_d))
