"""`linalg.svd[compute_uv, degenerate_tol](a) -> (s, u, vh)` (or `(s,)`): the
thin singular value decomposition of a dense real or complex matrix, and the
guard that keeps its derivatives honest at repeated singular values.

`a` has shape `(..., m, n)`; with `k = min(m, n)`, `s` (real, descending) has
shape `(..., k)`, `u` `(..., m, k)`, `vh` `(..., k, n)`, and
`a = u diag(s) vh` (NumPy's `svd(a, full_matrices=False)`).

Derivatives. With `V = vh^H`, `dP = U^H dA V` (k x k), its skew-Hermitian
and Hermitian parts `K = (dP - dP^H)/2`, `H = (dP + dP^H)/2`, and the
skew-Hermitian `Om_U = U^H dU`, `Om_V = V^H dV` inside the span of `U`, `V`:
differentiating `A = U S V^H` gives `dP = Om_U S + dS - S Om_V`, whose
entries (i != j) and imaginary diagonal solve to

    ds_i = Re dP_ii
    Om_U = E o K + F o H,        Om_V = -E o K + F o H,
    E_ij = 1 / (s_i + s_j),      F_ij = 1 / (s_j - s_i)   (F_ii = 0)

(the diagonal `E_ii K_ii = i Im dP_ii / (2 s_i)` splits the phase of a
complex pair between `u_i` and `v_i`; only their difference is fixed).
Outside the span, for tall (m > n) and wide (m < n) matrices,

    dU = U Om_U + (I - U U^H) dA V S^-1,   dV = V Om_V + (I - V V^H) dA^H U S^-1.

Two singular values closer than `degenerate_tol * max(s)` are one
*cluster*. Inside a cluster the pair `(u_c, v_c)` is defined up to one
common unitary `Q` (`u_c Q`, `v_c Q`): the divergent `F o H` term is that
common rotation, so `F_ij = 0` inside a cluster (the `E o K` term, the
difference of the two rotations, is finite and kept). Singular values at
most `degenerate_tol * max(s)` are the *zero cluster*: there `u_z` and `v_z`
rotate independently (and into the complement of `U` or `V`), so `E_ij = 0`
for `i, j` both in it and the complement terms use `1/s = 0` for it (no
NaN or inf), and `ds_i = Re u_i^H dA v_i` (as JAX's).

What these tangents cannot carry: inside a cluster, the Hermitian
off-diagonal part `H_cc` of `dP` (how the cluster splits) appears only
through its diagonal `ds_c`, and in the zero cluster the kink `|.|` of a
singular value. So the rule is exact for every loss whose cotangents are
gauge-invariant (below) and whose `s_bar` is constant inside each cluster
and zero on the zero cluster: sums of a cluster's singular values, `s**2`,
`u_c vh_c`, projectors `u_c u_c^H` and `v_c v_c^H`, `u f(s) vh` with
`f(0) = f'(0) = 0` at zero singular values (and `f' = 0` on clusters),
triplets of clusters of one. A smooth loss such as `u_c diag(s_c) vh_c` at
an exact cluster weights `s_c` unequally: its derivative needs `H_cc`, so
it raises (written as `A @ vh_c^H @ vh_c` it differentiates). The
reverse-mode rule is the transpose of this one (derived by sciad).

Gauge invariance. With a loss `L` and its cotangents `(s_bar, u_bar,
vh_bar)` (`dL = Re sum(x_bar * dx)`), a rotation `u_c -> u_c (I + X)`,
`v_c -> v_c (I + X)` (X skew-Hermitian) changes `L` by
`Re tr((u^T u_bar - vh_bar vh^T)^T X)`; it vanishes for every `X` iff

    G = u^T u_bar - vh_bar vh^T   is Hermitian inside each cluster

(clusters of one included: for complex matrices a real `G_ii` is the
invariance under the common phase of `u_i` and `v_i`), and `s_bar` must be
constant inside a cluster (above). In the zero cluster `u_z` and `v_z` rotate separately: `u^T u_bar` and
`vh_bar vh^T` must each be Hermitian there, and for a tall (wide) matrix
`u_bar` (`vh_bar`) must have no component outside the span of `conj(u)`
(`conj(vh)`). `linalg.svd_guard`, an identity in the tangents placed in the
JVP, checks this on the host when transposed and raises
`DegenerateEigenvalueError` otherwise. Forward mode is not checked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _ops as ops
from ..errors import DegenerateEigenvalueError, NonFiniteError, ShapeError
from ..graph import Primitive, Site, TensorType, Zero, instantiate, is_linear
from ..graph._batch import front_rule
from ..graph._cost import Cost, size
from ._checks import check as host_check, tie
from ._eigen import any_cluster, check_operand, cluster_width, default_tol, per_matrix_sparsity
from ._eigen import cluster_ids, cluster_rotation

svd_p = Primitive("linalg.svd", multiple_results=True,
                  params={"compute_uv": bool, "degenerate_tol": float})


def _real(dtype) -> np.dtype:
    return np.finfo(np.dtype(dtype)).dtype


@svd_p.def_abstract_eval
def _svd_shape(a, *, compute_uv, degenerate_tol):
    check_operand(a, degenerate_tol, op="linalg.svd", square=False)
    *batch, m, n = a.shape
    k = min(m, n)
    s = TensorType(tuple(batch) + (k,), _real(a.dtype))
    if not compute_uv:
        return (s,)
    return (s, TensorType(tuple(batch) + (m, k), a.dtype),
            TensorType(tuple(batch) + (k, n), a.dtype))


@svd_p.def_impl
def _svd_impl(a, *, compute_uv, degenerate_tol):
    if not compute_uv:
        return (jnp.linalg.svd(a, full_matrices=False, compute_uv=False),)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    u, vh = _random_cluster_bases(s, u, vh, degenerate_tol)
    return s, u, vh


def _random_cluster_bases(s, u, vh, tol: float):
    """`u`, `vh` with the pairs inside each cluster of repeated singular
    values turned by one fixed pseudo-random rotation, and the zero cluster's
    left and right vectors by two (null-space bases, each any): as
    `linalg.eigh`'s (`_eigen._random_cluster_bases`), so that a loss of one
    basis cannot pass the guard by being stationary at LAPACK's special one."""
    if s.shape[-1] < 2:
        return u, vh
    ids = cluster_ids(s, tol)
    zero = s <= cluster_width(s, tol)

    def turn(u, vh):
        q = cluster_rotation(ids, u.dtype, 0)
        both = jnp.expand_dims(zero, -1) & jnp.expand_dims(zero, -2)
        qv = jnp.where(both, cluster_rotation(ids, u.dtype, 1), q)
        return jnp.matmul(u, q), jnp.matmul(jnp.conj(jnp.swapaxes(qv, -1, -2)), vh)

    return jax.lax.cond(_clustered(s, tol), turn, lambda u, vh: (u, vh), u, vh)


def _clustered(s, tol: float):
    """Whether any singular values (any stack) are repeated or zero (or NaN:
    whether they are is unknown)."""
    return any_cluster(s, tol) | ~jnp.all(s > cluster_width(s, tol))


def _swap(x):
    return ops.swapaxes(x, -1, -2)


def _h(x):
    return ops.conj(_swap(x))


def _coefficients(s, tol: float):
    """`(E, F, s_inv)` of the module docstring, with the cluster policy:
    `F_ij = 0` inside a cluster, `E_ij = 0` and `1/s_i = 0` in the zero
    cluster."""
    scale = ops.expand_dims(ops.max(s, axis=-1, keepdims=True), -1)   # (..., 1, 1)
    si, sj = ops.expand_dims(s, -1), ops.expand_dims(s, -2)
    d = sj - si
    apart = ops.abs(d) > tol * scale
    f = ops.where(apart, 1.0 / ops.where(apart, d, 1.0), 0.0)
    total = si + sj
    big = total > tol * scale  # not both in the zero cluster
    e = ops.where(big, 1.0 / ops.where(big, total, 1.0), 0.0)
    nonzero = s > tol * ops.max(s, axis=-1, keepdims=True)
    s_inv = ops.where(nonzero, 1.0 / ops.where(nonzero, s, 1.0), 0.0)
    return e, f, s_inv


@svd_p.def_jvp
def _svd_jvp(primals, tangents, *, compute_uv, degenerate_tol):
    # A = U S V^H; dP = U^H dA V = Om_U S + dS - S Om_V (module docstring)

    (a,), (da,) = primals, tangents
    s, u, vh = svd_p.bind(a, compute_uv=True, degenerate_tol=degenerate_tol)
    da = instantiate(da)
    v = _h(vh)
    dav = ops.matmul(da, v)                                   # (..., m, k)
    ds = ops.real(ops.sum(ops.conj(u) * dav, axis=-2))
    guard = dict(degenerate_tol=degenerate_tol, check=False)
    if not compute_uv:
        (ds,) = svd_guard_p.bind(ds, s, **guard)
        return (s,), (ds,)
    m, n = a.shape[-2:]
    dp = ops.matmul(_h(u), dav)                               # (..., k, k)
    skew, herm = (dp - _h(dp)) / 2, (dp + _h(dp)) / 2
    e, f, s_inv = _coefficients(s, degenerate_tol)
    du = ops.matmul(u, e * skew + f * herm)
    dv = ops.matmul(v, f * herm - e * skew)
    s_inv = ops.expand_dims(s_inv, -2)
    if m > n:  # (I - U U^H) dA V S^-1
        du = du + (dav - ops.matmul(u, ops.matmul(_h(u), dav))) * s_inv
    if n > m:  # (I - V V^H) dA^H U S^-1
        dahu = ops.matmul(_h(da), u)
        dv = dv + (dahu - ops.matmul(v, ops.matmul(vh, dahu))) * s_inv
    ds, du, dvh = svd_guard_p.bind(ds, du, _h(dv), s, u, vh, **guard)
    return (s, u, vh), (ds, du, dvh)


svd_p.def_batch(front_rule(svd_p))


@svd_p.def_cost
def _svd_cost(node, body):
    # LAPACK's gesdd, thin, per matrix with l = max(m, n), k = min(m, n):
    # about 4 l k^2 + 8 k^3 real FLOPs with the vectors (4 l k^2 - 4/3 k^3
    # without), 4x that for complex

    t = node.inputs[0].type
    m, n = t.shape[-2:]
    k, l = min(m, n), max(m, n)
    per = 4.0 * l * k * k + (8.0 if node.params["compute_uv"] else -4.0 / 3.0) * k ** 3
    per *= 4.0 if t.dtype.kind == "c" else 1.0
    return Cost(per * size(t) / max(m * n, 1))


# ---------------------------------------------------------------------------
# the guard: an identity in its tangents; checked when transposed
#
# svd_guard(ds, s) (compute_uv=False) or svd_guard(ds, du, dvh, s, u, vh)


svd_guard_p = Primitive("linalg.svd_guard", multiple_results=True, runtime_checks=True,
                        checks_cotangents=True,
                        params={"degenerate_tol": float, "check": bool})


def _split(args):
    n = len(args) // 2
    return args[:n], args[n:]


@svd_guard_p.def_abstract_eval
def _guard_shape(*args, degenerate_tol, check):
    op = "linalg.svd_guard"
    if len(args) not in (2, 6):
        raise ShapeError(f"takes (ds, s) or (ds, du, dvh, s, u, vh), got {len(args)} "
                         "operands.", op=op)
    ts, primals = _split(args)
    for name, t, p in zip(("ds", "du", "dvh"), ts, primals):
        if t.shape != p.shape:
            raise ShapeError(f"`{name}` must have the shape {p.str_short()}, got "
                             f"{t.str_short()}.", op=op)
    return tuple(ts)


@svd_guard_p.def_impl
def _guard_impl(*args, degenerate_tol, check, site=None):
    ts, primals = _split(args)
    if not check:
        return tuple(ts)
    measures = dict(s=primals[0], s_bar=ts[0])
    if len(ts) == 3:
        (_, u_bar, vh_bar), (_, u, vh) = ts, primals
        measures.update(u=u, vh=vh, u_bar=u_bar, vh_bar=vh_bar)
    # The host judges only where a cluster of repeated singular values or a
    # zero one is (or for complex vectors, whose phases it checks); it
    # computes u^T u_bar and vh_bar vh^T itself, so that otherwise the check
    # costs O(k) here.
    when = _clustered(primals[0], degenerate_tol)
    complex_ = bool(jnp.iscomplexobj(primals[-1]))
    token = host_check(_judge_gauge, site, when=None if complex_ and len(ts) == 3 else when,
                       tol=degenerate_tol, complex_=complex_, **measures)
    return tuple(tie(t, token) for t in ts)


@svd_guard_p.def_jvp
def _guard_jvp(primals, tangents, *, degenerate_tol, check):
    # An identity in the tangents. As for `eigh_guard`, the tangent of a
    # checked cotangent passes unguarded: the check stays on the primal.
    ts, rest = _split(primals)
    dts = [instantiate(t) for t in tangents[:len(ts)]]
    params = dict(degenerate_tol=degenerate_tol, check=check)
    out = svd_guard_p.bind(*ts, *rest, **params)
    dout = dts if check else svd_guard_p.bind(*dts, *rest, **params)
    return tuple(out), tuple(dout)


@svd_guard_p.def_transpose
def _guard_transpose(cts, *args, degenerate_tol, check):
    ts, rest = _split(args)
    assert all(is_linear(t) for t in ts) and not any(is_linear(p) for p in rest)
    if len(cts) == 3 and all(isinstance(c, Zero) for c in cts[1:]):
        # a loss of the singular values alone: check s_bar, skip the vectors
        (s_bar,) = svd_guard_p.bind(instantiate(cts[0]), rest[0],
                                    degenerate_tol=degenerate_tol, check=not check)
        return (s_bar,) + (None,) * 5
    out = svd_guard_p.bind(*(instantiate(c) for c in cts), *rest,
                           degenerate_tol=degenerate_tol, check=not check)
    return tuple(out) + (None,) * len(rest)


svd_guard_p.def_batch(front_rule(svd_guard_p))


@svd_guard_p.def_cost
def _guard_cost(node, body):
    # an identity; checked: the singular values' gaps (u^T u_bar and vh_bar
    # vh^T on the host, only where a cluster or a zero singular value is)

    if not node.params["check"]:
        return Cost(0.0)
    return Cost(3.0 * size(node.inputs[len(node.inputs) // 2].type))


def _clusters(s: np.ndarray, tol: float) -> tuple[list[tuple[int, int]], int]:
    """The runs `[i, j)` of descending nonzero singular values whose
    neighbours are within `tol * max(s)` (of any length, singletons
    included), and the start `z` of the zero cluster `[z, k)`."""
    scale = float(np.max(s, initial=0.0))
    z = len(s)
    while z > 0 and not s[z - 1] > tol * scale:
        z -= 1
    out, start = [], 0
    for i in range(1, z + 1):
        if i == z or not abs(s[i] - s[i - 1]) <= tol * scale:
            out.append((start, i))
            start = i
    return out, z


def _judge_gauge(site, *, tol, complex_, s, s_bar, u=None, vh=None, u_bar=None,
                 vh_bar=None):
    """Host side: the cotangents must not depend on the basis inside a
    cluster (module docstring), for each matrix of a stack."""
    site = Site("linalg.svd", site.source, site.text)  # (the user's op, not the guard)
    s, s_bar = np.asarray(s), np.asarray(s_bar)
    k = s.shape[-1]
    count = int(np.prod(s.shape[:-1], dtype=np.int64))
    ss, sb = s.reshape((count, k)), s_bar.reshape((count, k))
    if u is None:
        for b in range(count):
            _judge_one(site, tol, complex_, ss[b], sb[b], None, None, None)
        return
    us, vhs = np.asarray(u), np.asarray(vh)
    us, vhs = us.reshape((count,) + us.shape[-2:]), vhs.reshape((count,) + vhs.shape[-2:])
    ubs = np.asarray(u_bar).reshape(us.shape)
    vbs = np.asarray(vh_bar).reshape(vhs.shape)
    m, n = us.shape[-2], vhs.shape[-1]
    for b in range(count):
        u, vh, u_bar, vh_bar = us[b], vhs[b], ubs[b], vbs[b]
        gu, gv = u.T @ u_bar, vh_bar @ vh.T  # u^T u_bar, vh_bar vh^T
        # the parts of u_bar (vh_bar) outside span(conj u) (span(conj vh)), per vector
        rest_u = np.max(np.abs(u_bar - np.conj(u) @ gu), axis=0) if m > k else None
        rest_v = np.max(np.abs(vh_bar - gv @ np.conj(vh)), axis=1) if n > k else None
        vectors = (gu, gv, float(np.max(np.abs(u_bar), initial=0.0)),
                   float(np.max(np.abs(vh_bar), initial=0.0)))
        _judge_one(site, tol, complex_, ss[b], sb[b], vectors, rest_u, rest_v)


_CLUSTER_ADVICE = ("Differentiate a function of the whole cluster (the sum of its singular "
                   "values, s**2, u_c vh_c, or u_c diag(s_c) vh_c written as "
                   "A @ vh_c^H @ vh_c), or lower `degenerate_tol` if the singular values "
                   "are truly distinct.")
_ZERO_ADVICE = ("Differentiate s**2, or u diag(f(s)) vh with f(0) = f'(0) = 0; for the "
                "nuclear norm, use its subgradient u @ vh yourself; or lower "
                "`degenerate_tol` if the singular values are truly nonzero.")


def _fail(site, s, i, j, what, off, tol, zero=False):
    gap = float(s[i] - s[j - 1])
    kind = ("zero (at most degenerate_tol" if zero
            else f"one cluster of repeated singular values (spread {gap:.1e} <= degenerate_tol")
    site.fail(DegenerateEigenvalueError,
              f"singular values {i}..{j - 1} ({s[i]:.10g} to {s[j - 1]:.10g}) are {kind} "
              f"{tol:.1e} times max(s) {np.max(s):.3g}), and the derivative depends on "
              f"{what}, where it is not defined. "
              f"{_ZERO_ADVICE if zero else _CLUSTER_ADVICE}",
              cluster=[i, j - 1], gap=gap, asymmetry=off)


def _judge_one(site, tol, complex_, s, s_bar, vectors, rest_u, rest_v):
    if not np.all(np.isfinite(s)):
        site.fail(NonFiniteError, "the singular values are NaN or infinite (the matrix holds "
                  "NaN or infinite values), where the derivative is not defined.")
    eps = float(np.finfo(s.dtype).eps) * max(len(s), 1)
    slack = 1e3 * max(eps, tol)  # as eigh_guard's: f'' gap is allowed, O(1) is not
    clusters, z = _clusters(s, tol)
    if not (any(j - i > 1 for i, j in clusters) or z < len(s)
            or (complex_ and vectors is not None)):
        return  # nothing to judge (a batch's matrix without a cluster)
    if not (np.all(np.isfinite(s_bar)) and (vectors is None or all(
            np.all(np.isfinite(x)) for x in vectors))):
        site.fail(NonFiniteError, "the cotangent of the singular values and vectors (the "
                  "derivative of the loss with respect to them) holds NaN or infinite values, "
                  "so whether the derivative depends on the basis chosen inside a cluster of "
                  "repeated (or zero) singular values cannot be judged. Check the loss where "
                  "it reads them.")
    size = float(np.max(np.abs(s_bar), initial=0.0))
    for i, j in clusters:
        off = float(np.ptp(s_bar[i:j])) if j - i > 1 else 0.0
        if not off <= slack * size:
            _fail(site, s, i, j, "one singular value of the cluster apart from the "
                  "others (s_bar varies across it)", off, tol)
    if z < len(s):
        off = float(np.max(np.abs(s_bar[z:])))
        if not off <= slack * size:
            _fail(site, s, z, len(s), "the zero singular values themselves, which are "
                  "not smooth there (|x|)", off, tol, zero=True)
    if vectors is None:
        return
    # as in eigh_guard: first-order cotangents cannot tell a cluster's
    # singular values used with singular vectors in a basis-invariant way
    # from `u diag(g(s)) vh` (whose derivative needs the off-diagonal of the
    # cluster's block of u^H dA v): refused together
    for i, j in clusters:
        big = float(np.max(np.abs(s_bar[i:j]), initial=0.0))
        if j - i > 1 and not big <= slack * size:
            _fail(site, s, i, j, "singular values of the cluster together with singular "
                  "vectors (such as u diag(f(s)) vh; for a sum of a singular-value term "
                  "and a singular-vector term, each invariant, take the singular values "
                  "from `svd(A, compute_uv=False)`, which is checked on its own: repeated "
                  "calls of `svd(A)` on one matrix are one decomposition)", big, tol)
    gu, gv, ub, vb = vectors
    size = max(float(ub), float(vb), float(np.max(np.abs(gu), initial=0.0)),
               float(np.max(np.abs(gv), initial=0.0)))
    if size == 0.0:
        return
    limit = slack * size
    g = gu - gv
    for i, j in clusters:
        block = g[i:j, i:j]
        off = float(np.max(np.abs(block - np.conj(block.T)), initial=0.0))
        if not off <= limit:
            if j - i == 1:
                if complex_:
                    site.fail(DegenerateEigenvalueError,
                              f"the derivative depends on the phase of singular vectors {i} "
                              "(u_i and v_i are defined up to one common phase "
                              "exp(i phi)): differentiate a function that does not "
                              "change when both are multiplied by it, such as "
                              "u_i v_i^H or |u_i|^2.", singular_vector=i)
                continue
            _fail(site, s, i, j, "the choice of singular vectors inside the cluster",
                  off, tol)
    if z < len(s):
        k = len(s)
        for name, gz in (("left", gu[z:, z:]), ("right", gv[z:, z:])):
            off = float(np.max(np.abs(gz - np.conj(gz.T)), initial=0.0))
            if not off <= limit:
                _fail(site, s, z, k, f"the choice of {name} singular vectors for the "
                      "zero singular values (a basis of a null space)", off, tol, zero=True)
        for name, rest in (("left", rest_u), ("right", rest_v)):
            if rest is not None and not float(np.max(rest[z:], initial=0.0)) <= limit:
                _fail(site, s, z, k, f"the choice of {name} singular vectors for the "
                      "zero singular values (a basis of a null space)",
                      float(np.max(rest[z:])), tol, zero=True)


def svd(a, compute_uv: bool = True, degenerate_tol: float | None = None):
    """`(s, u, vh)` (or `(s,)`) of the thin SVD; see the module docstring."""
    dtype = np.result_type(getattr(a, "dtype", np.float64), np.float32)
    tol = default_tol(dtype) if degenerate_tol is None else float(degenerate_tol)
    return svd_p.bind(a, compute_uv=bool(compute_uv), degenerate_tol=tol)


# ---------------------------------------------------------------------------
# Sparsity: `s`, `u` and `vh` of each matrix of a stack depend on every entry
# of that matrix; the guard is the identity in the tangents it passes.


def _install_sparsity_rules() -> None:
    svd_p.def_sparsity(per_matrix_sparsity)

    @svd_guard_p.def_sparsity
    def _guard_sparsity(outs, *deps, **params):
        return [d.matrix for d in _split(deps)[0]]


_install_sparsity_rules()
