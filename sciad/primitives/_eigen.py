"""`linalg.eigh[degenerate_tol](a) -> (w, v)`: the eigendecomposition of a
Hermitian (real symmetric) matrix, and the guard that keeps its derivatives
honest at repeated eigenvalues.

`a` has shape `(..., n, n)`; the decomposition is that of its Hermitian part
`(a + a^H) / 2` (as `jax.numpy.linalg.eigh` by default; SciPy reads one
triangle), so a derivative in any direction `da` is that of `(da + da^H)/2`.
`w` (real, ascending) has shape `(..., n)`, `v` (unit columns) `(..., n, n)`:
`a v = v diag(w)`.

Derivatives. With `C = v^H dA v` (`dA` the Hermitian part of the tangent):

    dw_i = Re C_ii,        dv = v (F o C),   F_ij = 1 / (w_j - w_i)   (i != j)

and `F_ii = 0` (the gauge in which `v^H dv` has a zero diagonal). Two
eigenvalues closer than `degenerate_tol * max|w|` are one *cluster*: the
eigenvectors inside a cluster are any orthonormal basis of its subspace,
so `F_ij = 0` for `i, j` in one cluster rather than `1/(w_j - w_i)` (the
NaN or 1e12 of a naive rule). That is exact for every function that does
not depend on the basis chosen inside a cluster: sums of a cluster's
eigenvalues, its spectral projector `v_c v_c^H`, spectral functions
`v f(w) v^H`. The reverse-mode rule is the transpose of this one (derived).

A function that does depend on that choice (one eigenvector of a cluster,
or one eigenvalue of it apart from the others) has no derivative there.
It is caught in reverse mode, where the loss's cotangents arrive: `w` and
`v` pass through `linalg.eigh_guard` in the JVP, an identity whose transpose
(`eigh_guard` with `check=True`) tests on the host that the cotangents are
gauge-invariant, that is, inside each cluster `w_bar` is constant, the
block of `G = v^H v_bar` is Hermitian, and `w_bar` is zero if any
eigenvector is used (first-order cotangents cannot tell `sum(w_c) + <X,
P_c>` from `<X, v diag(g(w)) v^H>`, whose derivative needs all of `v_c^H dA
v_c`); for complex `v`, `Im G_ii = 0` (an eigenvector's phase is a gauge
too). Otherwise it raises `DegenerateEigenvalueError` naming the node, the
cluster and its gap. Forward mode has no cotangents: `sd.jvp` transposes
its tangent map once on a random cotangent (`Primitive(checks_cotangents=
True)`), which the same checks judge.

`degenerate_tol` defaults to `sqrt(eps)` of the dtype (1.5e-8 for float64):
closer eigenvalues have eigenvectors whose derivatives would be larger than
`1/sqrt(eps)` times the perturbation, i.e. no correct digits in a gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _ops as ops
from ..errors import (DTypeError, DegenerateEigenvalueError, InvalidOptionError,
                      NonFiniteError, ShapeError, plain)
from ..errors import NotPositiveDefiniteError, SingularMatrixError
from ..graph import Param, Primitive, Site, TensorType, instantiate, is_linear, is_zero
from ..graph._batch import front_rule
from ..graph._cost import Cost, size
from ..graph._sparsity import along
from ._checks import check as host_check, tie

eigh_p = Primitive("linalg.eigh", multiple_results=True,
                   params={"degenerate_tol": float})


def default_tol(dtype) -> float:
    return float(np.sqrt(np.finfo(np.dtype(dtype)).eps))


def _real(dtype) -> np.dtype:
    return np.finfo(np.dtype(dtype)).dtype


def check_operand(a, degenerate_tol, *, op: str, square: bool) -> None:
    """The trace-time checks of a decomposition's matrix operand (`linalg.eigh`,
    `linalg.svd`): a (square) float or complex matrix or stack of them, and a
    cluster tolerance >= 0."""
    if not isinstance(a, TensorType) or len(a.shape) < 2 or (
            square and a.shape[-1] != a.shape[-2]):
        what = "square matrix (or a stack of them, (..., n, n))" if square else \
            "matrix (or a stack of them, (..., m, n))"
        raise ShapeError(f"`a` must be a {what}, got {a.str_short()}.", op=op)
    if a.dtype.kind not in "fc":
        raise DTypeError(f"`a` must be float or complex, got {a.str_short()}; convert it "
                         "first (`.astype(np.float64)`).", op=op)
    if not degenerate_tol >= 0:
        raise InvalidOptionError(f"`degenerate_tol` must be >= 0, got {plain(degenerate_tol)}.",
                                 op=op)


@eigh_p.def_abstract_eval
def _eigh_shape(a, *, degenerate_tol):
    check_operand(a, degenerate_tol, op="linalg.eigh", square=True)
    n = a.shape[-1]
    return (TensorType(tuple(a.shape[:-1]), _real(a.dtype)),
            TensorType(tuple(a.shape[:-2]) + (n, n), a.dtype))


@eigh_p.def_impl
def _eigh_impl(a, *, degenerate_tol):
    h = (a + jnp.conj(jnp.swapaxes(a, -1, -2))) / 2
    w, v = jnp.linalg.eigh(h, symmetrize_input=False)
    return w, _random_cluster_bases(w, v, degenerate_tol)


def cluster_width(w, tol: float):
    """`tol * max|w|` per matrix (keeping the last axis): how close two
    eigenvalues (singular values) must be to be one cluster."""
    return tol * jnp.max(jnp.abs(w), axis=-1, keepdims=True)


def any_cluster(w, tol: float):
    """Whether any two neighbours of the sorted `w` (any stack) are one
    cluster: a scalar bool."""
    return jnp.any(jnp.abs(jnp.diff(w, axis=-1)) <= cluster_width(w, tol))


def cluster_ids(w, tol: float):
    """Each ascending eigenvalue's cluster number (neighbours within `tol *
    max|w|` chain into one cluster, as `_clusters` on the host)."""
    apart = jnp.abs(jnp.diff(w, axis=-1)) > cluster_width(w, tol)
    return jnp.concatenate([jnp.zeros(w.shape[:-1] + (1,), jnp.int32),
                            jnp.cumsum(apart, axis=-1, dtype=jnp.int32)], axis=-1)


def cluster_rotation(ids, dtype, seed: int = 0):
    """A block-diagonal orthogonal matrix, one fixed pseudo-random reflection
    `I - 2 u_c u_c^T / |u_c|^2` per cluster of two or more (`ids` from
    `cluster_ids`: the cluster of each index, ascending), the identity on the
    others; shape `(..., n, n)`. `u` is a fixed irregular sequence (`seed`
    picks another): a reflection in a generic direction turns a special
    basis (unit vectors) into a generic one, and it costs a few elementwise
    operations to build and to compile."""
    n = ids.shape[-1]
    i = jnp.arange(n, dtype=jnp.float64)
    u = jnp.cos(2.399963 * i + 0.7 + 1.3 * seed) + 1.5  # in [0.5, 2.5]: never zero
    same = jnp.expand_dims(ids, -1) == jnp.expand_dims(ids, -2)
    size = jnp.sum(same, axis=-1)
    u = jnp.where(size > 1, u, 0.0)                      # singletons stay
    norm2 = jnp.sum(jnp.where(same, jnp.expand_dims(u * u, -2), 0.0), axis=-1)
    h = jnp.where(same, jnp.expand_dims(u, -1) * jnp.expand_dims(u, -2), 0.0)
    h = jnp.eye(n) - 2.0 * h / jnp.expand_dims(jnp.where(norm2 > 0, norm2, 1.0), -1)
    return h.astype(dtype)


def _random_cluster_bases(w, v, tol: float):
    """`v` with the basis inside each cluster of repeated eigenvalues turned
    by a fixed pseudo-random rotation (the eigenvectors of a cluster are any
    basis of its subspace).

    LAPACK's basis of a cluster is often a special one (the unit vectors, for
    a diagonal matrix), and at a special basis a loss that depends on it can
    be stationary under rotations inside the cluster and pass the guard's
    first-order test (`(v_1)_1^2` at `diag(1, 2, 2, 3)` has the cotangent of
    the invariant `P_11`). At a generic basis it is not. The turn
    (`cluster_rotation`, a reflection per cluster) runs only where some
    cluster exists (`lax.cond`). A
    cluster's vectors then satisfy `A v = v w` to its spread (at most
    `degenerate_tol * max|w|`) rather than to rounding: vectors of a cluster
    are that ill-determined anyway (only their span is not)."""
    n = w.shape[-1]
    if n < 2:
        return v
    return jax.lax.cond(any_cluster(w, tol),
                        lambda v: jnp.matmul(v, cluster_rotation(cluster_ids(w, tol), v.dtype)),
                        lambda v: v, v)


def _swap(x):
    return ops.swapaxes(x, -1, -2)


def _gaps(w, tol: float):
    """`F`: `1 / (w_j - w_i)` for eigenvalues of different clusters, 0 inside
    a cluster (and on the diagonal)."""
    d = ops.expand_dims(w, -2) - ops.expand_dims(w, -1)  # d_ij = w_j - w_i
    scale = ops.max(ops.abs(w), axis=-1, keepdims=True)
    apart = ops.abs(d) > tol * ops.expand_dims(scale, -1)
    return ops.where(apart, 1.0 / ops.where(apart, d, 1.0), 0.0)


@eigh_p.def_jvp
def _eigh_jvp(primals, tangents, *, degenerate_tol):
    # A v = v diag(w): with C = v^H dA v, dw = diag(C), v^H dv = F o C (above)

    (a,), (da,) = primals, tangents
    w, v = eigh_p.bind(a, degenerate_tol=degenerate_tol)
    da = instantiate(da)
    dh = (da + ops.conj(_swap(da))) / 2
    dhv = ops.matmul(dh, v)
    dw = ops.real(ops.sum(ops.conj(v) * dhv, axis=-2))
    c = ops.matmul(ops.conj(_swap(v)), dhv)
    dv = ops.matmul(v, _gaps(w, degenerate_tol) * c)
    dw, dv = eigh_guard_p.bind(dw, dv, w, v, degenerate_tol=degenerate_tol, check=False)
    return (w, v), (dw, dv)


eigh_p.def_batch(front_rule(eigh_p))


# ---------------------------------------------------------------------------
# the guard: an identity in its first two operands; checked when transposed


eigh_guard_p = Primitive("linalg.eigh_guard", multiple_results=True, runtime_checks=True,
                         checks_cotangents=True,
                         params={"degenerate_tol": float, "check": bool,
                                 "op": Param(str, default="linalg.eigh"),
                                 "values_used": Param(bool, default=True),
                                 "vectors_used": Param(bool, default=True)})


@eigh_guard_p.def_abstract_eval
def _guard_shape(tw, tv, w, v, *edge, degenerate_tol, check, op="linalg.eigh",
                 values_used=True, vectors_used=True):
    if tw.shape != w.shape or tv.shape != v.shape:
        raise ShapeError(f"the tangents must have the shapes of w {w.str_short()} and v "
                         f"{v.str_short()}, got {tw.str_short()} and {tv.str_short()}.",
                         op="linalg.eigh_guard")
    if len(edge) > 1 or (edge and tuple(edge[0].shape) != tuple(w.shape[:-1])):
        raise ShapeError("the optional fifth operand, the next eigenvalue beyond a partial "
                         f"set, must have the shape {tuple(w.shape[:-1])}.",
                         op="linalg.eigh_guard")
    return tw, tv


@eigh_guard_p.def_impl
def _guard_impl(tw, tv, w, v, *edge, degenerate_tol, check, op="linalg.eigh",
                values_used=True, vectors_used=True, site=None):
    if not check:
        return tw, tv
    # The host judges only where there is something to judge: a cluster of
    # repeated eigenvalues (or one cut by a partial solver's `k`), or complex
    # eigenvectors (their phases). Otherwise the check costs O(n) here, not
    # the n^3 of `v^T v_bar`, which the host computes when it is called.
    # (and where an eigenvalue is NaN: whether it is in a cluster is unknown)
    when = any_cluster(w, degenerate_tol) | ~jnp.all(jnp.isfinite(w))
    extra = {}
    if edge:
        extra["edge"] = edge[0]
        when = when | ~jnp.all(jnp.abs(w - jnp.expand_dims(edge[0], -1))
                               > cluster_width(w, degenerate_tol))
    complex_ = bool(jnp.iscomplexobj(v))
    token = host_check(_judge_gauge, site, when=None if complex_ and vectors_used else when,
                       op=op, tol=degenerate_tol, complex_=complex_, values_used=values_used,
                       vectors_used=vectors_used, w_bar=tw, v=v, v_bar=tv, w=w, **extra)
    return tie(tw, token), tv


@eigh_guard_p.def_jvp
def _guard_jvp(primals, tangents, **params):
    # An identity in (tw, tv). The tangent of a checked cotangent is not
    # itself a cotangent of the loss, so it passes unguarded: the check stays
    # on the primal.
    tw, tv, *rest = primals
    dw, dv = instantiate(tangents[0]), instantiate(tangents[1])
    out = eigh_guard_p.bind(tw, tv, *rest, **params)
    if params["check"]:
        return out, (dw, dv)
    return out, eigh_guard_p.bind(dw, dv, *rest, **params)


@eigh_guard_p.def_transpose
def _guard_transpose(cts, tw, tv, *rest, degenerate_tol, check, op="linalg.eigh",
                     values_used=True, vectors_used=True):
    # Which cotangents are symbolic zeros says which outputs the loss uses at
    # all: a loss of the eigenvalues alone, of the eigenvectors alone, or of both.
    assert is_linear(tw) and is_linear(tv) and not any(map(is_linear, rest))
    cw, cv = cts
    used = dict(values_used=not is_zero(cw), vectors_used=not is_zero(cv))
    out = eigh_guard_p.bind(instantiate(cw), instantiate(cv), *rest,
                            degenerate_tol=degenerate_tol, check=not check, op=op, **used)
    return (out[0], out[1]) + (None,) * len(rest)


eigh_guard_p.def_batch(front_rule(eigh_guard_p))


def _clusters(w: np.ndarray, tol: float) -> list[tuple[int, int]]:
    """The runs `[i, j)` of ascending eigenvalues whose neighbours are within
    `tol * max|w|` of each other, of length 2 or more."""
    scale = float(np.max(np.abs(w), initial=0.0))
    out, start = [], 0
    for k in range(1, len(w) + 1):
        if k == len(w) or not abs(w[k] - w[k - 1]) <= tol * scale:
            if k - start > 1:
                out.append((start, k))
            start = k
    return out


def _judge_gauge(site, *, op, tol, complex_, values_used, vectors_used, w_bar, v, v_bar, w,
                 edge=None):
    """Host side, for each matrix of a stack (see the module docstring)."""
    site = Site(op, site.source, site.text)  # (the user's op, not the guard)
    w, w_bar = np.asarray(w), np.asarray(w_bar)
    g = np.matmul(np.swapaxes(np.asarray(v), -1, -2), np.asarray(v_bar))  # v^T v_bar
    n = w.shape[-1]
    ws = w.reshape((-1, n))
    edges = [None] * len(ws) if edge is None else np.asarray(edge).reshape(-1)
    for wk, bk, gk, ek in zip(ws, w_bar.reshape((-1, n)), g.reshape((-1, n, n)), edges):
        _judge_one(site, tol, complex_, values_used, vectors_used, bk, gk, wk, ek)


def _judge_one(site, tol, complex_, values_used, vectors_used, w_bar, g, w, edge=None):
    if not np.all(np.isfinite(w)) or (edge is not None and np.isnan(edge)):
        site.fail(NonFiniteError, "the eigenvalues are NaN or infinite (the matrix holds NaN "
                  "or infinite values), where the derivative is not defined.")
    clusters = _clusters(w, tol)
    cut = edge is not None and np.isfinite(edge)
    if not (clusters or cut or (complex_ and vectors_used)):
        return  # nothing to judge (a batch's matrix without a cluster)
    if not (np.all(np.isfinite(w_bar)) and np.all(np.isfinite(g))):
        site.fail(NonFiniteError, "the cotangent of the eigenvalues and eigenvectors (the "
                  "derivative of the loss with respect to them) holds NaN or infinite "
                  "values, so whether the derivative depends on the basis chosen inside a "
                  "cluster of repeated eigenvalues cannot be judged. Check the loss where it "
                  "reads them.")
    eps = float(np.finfo(w.dtype).eps)
    # cotangents below this (relative to the largest) count as zero; inside a
    # cluster of width `gap` the eigenvalue cotangents of a symmetric function
    # of the eigenvalues differ by about its second derivative times `gap`
    small_w = 1e3 * max(eps * len(w), tol) * float(np.max(np.abs(w_bar), initial=0.0))
    small_g = 1e3 * eps * len(w) * float(np.max(np.abs(g), initial=0.0))
    if cut:
        _judge_cut(site, tol, w, float(edge), w_bar, g, small_w, small_g)
    for i, j in clusters:
        bw, block = w_bar[i:j], g[i:j, i:j]
        # the cluster's basis is a gauge: its cotangent block must be Hermitian
        # (a function of the projector v_c v_c^H passes, one eigenvector does not)
        if vectors_used and not float(np.max(np.abs(block - np.conj(block.T)),
                                             initial=0.0)) <= small_g:
            _fail_cluster(site, w, i, j, tol, "eigenvectors of the cluster (the basis "
                                              "chosen inside it)")
        # first-order cotangents cannot tell `sum(w_c) + <X, P_c>` from the
        # basis-dependent `<X, v diag(g(w)) v^H>` (whose derivative needs the
        # off-diagonal of v_c^H dA v_c; at g(w_c) = 0 its cluster vectors get
        # no cotangent at all): a cluster's eigenvalues are not differentiated
        # together with eigenvectors
        if vectors_used and not float(np.max(np.abs(bw), initial=0.0)) <= small_w:
            _fail_cluster(site, w, i, j, tol, "eigenvalues of the cluster together with "
                                              "eigenvectors (for v f(w) v^H use "
                                              "`funm_hermitian`; for a sum of the "
                                              "cluster's eigenvalues plus an invariant "
                                              "eigenvector term, write the sum as "
                                              "trace(v_c^H A v_c): repeated calls on one "
                                              "matrix are one decomposition)")
        if not float(np.ptp(bw)) <= small_w:
            _fail_cluster(site, w, i, j, tol, "one eigenvalue of the cluster apart from "
                                              "the others")
    if complex_ and vectors_used:
        im = np.abs(np.imag(np.diagonal(g)))
        if not float(np.max(im, initial=0.0)) <= small_g:
            k = int(np.argmax(im))
            site.fail(DegenerateEigenvalueError,
                      f"the derivative depends on the phase of eigenvector {k} (complex "
                      "eigenvectors are defined up to a phase): differentiate a function "
                      "that does not change when an eigenvector is multiplied by "
                      "exp(i phi), such as |v|^2 or v v^H.", eigenvector=k)


def _judge_cut(site, tol, w, edge, w_bar, g, small_w, small_g):
    """A partial eigensolver (`linalg.eigsh`) computed `w`; `edge` is the next
    eigenvalue it would have computed. Computed eigenvalues repeated with it
    belong to a cluster that `k` cuts: nothing about them is differentiable
    (their sum is not that of the whole cluster)."""
    scale = max(float(np.max(np.abs(w), initial=0.0)), abs(edge))
    cut = np.flatnonzero(np.abs(w - edge) <= tol * scale)
    if not cut.size:
        return
    for i, j in _clusters(w, tol):  # the whole computed part of the cluster
        if i <= cut[0] < j or i <= cut[-1] < j:
            cut = np.arange(min(i, cut[0]), max(j, cut[-1] + 1))
    if not (float(np.max(np.abs(w_bar[cut]), initial=0.0)) <= small_w
            and float(np.max(np.abs(g[:, cut]), initial=0.0)) <= small_g):
        i, j = int(cut[0]), int(cut[-1]) + 1
        site.fail(DegenerateEigenvalueError,
                  f"eigenvalues {i}..{j - 1} ({w[i]:.10g} to {w[j - 1]:.10g}) are repeated "
                  f"with the next eigenvalue beyond the {len(w)} computed ({edge:.10g}, "
                  f"within degenerate_tol {tol:.1e}): `k` cuts a cluster of repeated "
                  "eigenvalues in two, and the derivative depends on its computed part, "
                  "which is not differentiable (the split is arbitrary). Raise `k` to "
                  "include the whole cluster, and differentiate a function that treats it "
                  "alike (the sum of its eigenvalues).", cluster=[i, j - 1], edge=edge)


def _fail_cluster(site, w, i, j, tol, what):
    gap = float(w[j - 1] - w[i])
    outside = [float(w[i] - w[i - 1])] if i > 0 else []
    outside += [float(w[j] - w[j - 1])] if j < len(w) else []
    near = f"{min(outside):.3g}" if outside else "none"
    site.fail(DegenerateEigenvalueError,
              f"eigenvalues {i}..{j - 1} ({w[i]:.10g} to {w[j - 1]:.10g}) are one cluster of "
              f"repeated eigenvalues (spread {gap:.1e} <= degenerate_tol {tol:.1e} times "
              f"max|w| {np.max(np.abs(w)):.3g}; distance to the nearest other eigenvalue: "
              f"{near}), and the derivative depends on the {what}, which is not "
              f"differentiable there (the eigenvectors of a cluster are any basis of its "
              f"subspace). Differentiate a function of the eigenvalues that treats the "
              f"cluster's alike (their sum), or lower `degenerate_tol` if the eigenvalues "
              f"are truly distinct.", cluster=[i, j - 1], gap=gap)


# ---------------------------------------------------------------------------
# spectral functions: F = v diag(f(w)) v^H as one node, whose derivative is
# the divided-difference (Daleckii-Krein) rule, smooth at repeated eigenvalues


# f, f' (in sciad ops or jnp: both work on either), and the domain of f
FUNCTIONS = {
    "exp": (lambda x, m: m.exp(x), lambda x, m: m.exp(x), None),
    "log": (lambda x, m: m.log(x), lambda x, m: 1.0 / x, "positive definite"),
    "sqrt": (lambda x, m: m.sqrt(x), lambda x, m: 0.5 / m.sqrt(x), "positive definite"),
    "inv_sqrt": (lambda x, m: 1.0 / m.sqrt(x), lambda x, m: -0.5 / (x * m.sqrt(x)),
                 "positive definite"),
    "inv": (lambda x, m: 1.0 / x, lambda x, m: -1.0 / (x * x), "nonsingular"),
}

eigh_apply_p = Primitive("linalg.eigh_apply", runtime_checks=True,
                         params={"fn": str, "degenerate_tol": float})


@eigh_apply_p.def_abstract_eval
def _apply_shape(a, *, fn, degenerate_tol):
    if fn not in FUNCTIONS:
        raise InvalidOptionError(f"`fn` must be one of {sorted(FUNCTIONS)}, got {fn!r}.",
                                 op="linalg.eigh_apply")
    _eigh_shape(a, degenerate_tol=degenerate_tol)
    return a


@eigh_apply_p.def_impl
def _apply_impl(a, *, fn, degenerate_tol, site=None):
    w, v = _eigh_impl(a, degenerate_tol=degenerate_tol)
    f, _, domain = FUNCTIONS[fn]
    if domain is not None:  # the host is called only where the domain check fails
        smallest = jnp.min(w if domain == "positive definite" else jnp.abs(w), axis=-1)
        token = host_check(_judge_domain, site, fn=fn, domain=domain,
                           when=jnp.any(~(smallest > 0)), smallest=smallest)
        w = tie(w, token)
    fw = f(w, jnp).astype(v.dtype)
    return jnp.matmul(v * jnp.expand_dims(fw, -2), jnp.conj(jnp.swapaxes(v, -1, -2)))


def _judge_domain(site, *, fn, domain, smallest):
    low = float(np.min(smallest))
    if np.isnan(low):
        site.fail(NonFiniteError, f"`{fn}` of a matrix (`funm_hermitian`'s `A`, or the `B` of "
                  "a generalized eigenproblem) needs its eigenvalues, but they are NaN: the "
                  "matrix holds NaN or infinite values.")
    cls = NotPositiveDefiniteError if domain == "positive definite" else SingularMatrixError
    site.fail(cls, f"`{fn}` of a matrix (`funm_hermitian`'s `A`, or the `B` of a "
                   f"generalized eigenproblem) needs it {domain}, but its smallest eigenvalue "
                   f"{'' if domain == 'positive definite' else 'in absolute value '}is "
                   f"{low:.3e}.", smallest=low)


def _divided_differences(w, fn: str, tol: float):
    """`D_ij = (f(w_i) - f(w_j)) / (w_i - w_j)`, and `f'` at the mean where
    the two are within `tol * max|w|` (the limit; exact at repeated ones)."""
    f, df, _ = FUNCTIONS[fn]
    fw = f(w, ops)
    d = ops.expand_dims(w, -1) - ops.expand_dims(w, -2)
    scale = ops.max(ops.abs(w), axis=-1, keepdims=True)
    apart = ops.abs(d) > tol * ops.expand_dims(scale, -1)
    diff = (ops.expand_dims(fw, -1) - ops.expand_dims(fw, -2)) / ops.where(apart, d, 1.0)
    mean = (ops.expand_dims(w, -1) + ops.expand_dims(w, -2)) / 2
    return ops.where(apart, diff, df(mean, ops))


@eigh_apply_p.def_jvp
def _apply_jvp(primals, tangents, *, fn, degenerate_tol):
    # F = v f(w) v^H: dF = v (D o C) v^H, C = v^H dA v (Daleckii-Krein)
    (a,), (da,) = primals, tangents
    out = eigh_apply_p.bind(a, fn=fn, degenerate_tol=degenerate_tol)
    w, v = eigh_p.bind(a, degenerate_tol=degenerate_tol)
    da = instantiate(da)
    dh = (da + ops.conj(_swap(da))) / 2
    vh = ops.conj(_swap(v))
    c = ops.matmul(ops.matmul(vh, dh), v)
    dd = _divided_differences(w, fn, degenerate_tol)
    return out, ops.matmul(ops.matmul(v, dd * c), vh)


eigh_apply_p.def_batch(front_rule(eigh_apply_p))


@eigh_apply_p.def_cost
def _apply_cost(node, body):
    t = node.inputs[0].type
    n = t.shape[-1]
    per = (9.0 * n ** 3 + 2.0 * n ** 3) * (4.0 if t.dtype.kind == "c" else 1.0)
    return Cost(per * size(t) / max(n * n, 1))


def eigh_apply(a, fn: str, degenerate_tol: float | None = None):
    dtype = np.result_type(getattr(a, "dtype", np.float64), np.float32)
    tol = default_tol(dtype) if degenerate_tol is None else float(degenerate_tol)
    return eigh_apply_p.bind(a, fn=fn, degenerate_tol=tol)


def eigh(a, b=None, degenerate_tol: float | None = None):
    """`(w, v)` of `a` (Hermitian part), or of the generalized problem
    `a v = w b v` with `b` positive definite, normalized `v^H b v = I` (as
    SciPy's): with `S = b^(-1/2)` (a spectral function of `b`, one
    `eigh_apply` node, smooth at repeated eigenvalues of `b`), the eigenpairs
    `(w, y)` of `S a S` give `v = S y`."""
    dtype = np.result_type(getattr(a, "dtype", np.float64), np.float32)
    tol = default_tol(dtype) if degenerate_tol is None else float(degenerate_tol)
    if b is None:
        return eigh_p.bind(a, degenerate_tol=tol)
    half = eigh_apply_p.bind(b, fn="inv_sqrt", degenerate_tol=default_tol(dtype))
    w, y = eigh_p.bind(ops.matmul(ops.matmul(half, a), half), degenerate_tol=tol)
    return w, ops.matmul(half, y)


@eigh_p.def_cost
def _eigh_cost(node, body):
    # LAPACK's divide-and-conquer syevd/heevd with vectors: about 9 n^3 real
    # FLOPs per matrix (4/3 n^3 for the tridiagonal reduction, the rest for
    # the vectors), 4x that for complex

    t = node.inputs[0].type
    n = t.shape[-1]
    per = 9.0 * n ** 3 * (4.0 if t.dtype.kind == "c" else 1.0)
    return Cost(per * size(t) / max(n * n, 1))


@eigh_guard_p.def_cost
def _guard_cost(node, body):
    # an identity; checked: the eigenvalues' gaps (v^T v_bar on the host,
    # only where a cluster is)

    if not node.params["check"]:
        return Cost(0.0)
    return Cost(3.0 * size(node.inputs[2].type))


# ---------------------------------------------------------------------------
# Sparsity: each output of a decomposition (or a spectral function) of a
# stack of matrices depends on every entry of its own matrix; the guard is
# the identity in the tangents it passes.


def per_matrix_sparsity(outs, a, **params):
    """The sparsity rule of a decomposition of a stack of matrices `a`: each
    output (a stack of vectors or of matrices) depends on every entry of its
    own matrix."""
    return [along(t, a, (-2, -1), (-1,) if t.ndim == len(a.shape) - 1 else (-2, -1))
            for t in outs]


def _install_sparsity_rules() -> None:
    eigh_p.def_sparsity(per_matrix_sparsity)
    eigh_apply_p.def_sparsity(lambda outs, a, **params: per_matrix_sparsity(outs, a)[0])
    eigh_guard_p.def_sparsity(lambda outs, tw, tv, *rest, **params: [tw.matrix, tv.matrix])


_install_sparsity_rules()
