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
gauge-invariant, that is, inside each cluster `w_bar` is constant and
`G = v^T v_bar` is Hermitian (and, for complex `v`, `Im G_ii = 0`: an
eigenvector's phase is a gauge too), and raises `DegenerateEigenvalueError`
naming the node, the cluster and its gap otherwise. Forward mode cannot
know the loss and is not checked.

`degenerate_tol` defaults to `sqrt(eps)` of the dtype (1.5e-8 for float64):
closer eigenvalues have eigenvectors whose derivatives would be larger than
`1/sqrt(eps)` times the perturbation, i.e. no correct digits in a gradient.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..errors import DTypeError, DegenerateEigenvalueError, ShapeError
from ..graph import Primitive, TensorType, instantiate, is_linear
from ..graph._batch import front_rule
from ._checks import check as host_check, tie

eigh_p = Primitive("linalg.eigh", multiple_results=True,
                   params={"degenerate_tol": float})


def default_tol(dtype) -> float:
    return float(np.sqrt(np.finfo(np.dtype(dtype)).eps))


def _real(dtype) -> np.dtype:
    return np.finfo(np.dtype(dtype)).dtype


@eigh_p.def_abstract_eval
def _eigh_shape(a, *, degenerate_tol):
    op = "linalg.eigh"
    if not isinstance(a, TensorType) or len(a.shape) < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"`a` must be a square matrix (or a stack of them, (..., n, n)), "
                         f"got {a.str_short()}.", op=op)
    if a.dtype.kind not in "fc":
        raise DTypeError(f"`a` must be float or complex, got {a.str_short()}; convert it "
                         "first (`.astype(np.float64)`).", op=op)
    if not degenerate_tol >= 0:
        raise ShapeError(f"`degenerate_tol` must be >= 0, got {degenerate_tol!r}.", op=op)
    n = a.shape[-1]
    return (TensorType(tuple(a.shape[:-1]), _real(a.dtype)),
            TensorType(tuple(a.shape[:-2]) + (n, n), a.dtype))


@eigh_p.def_impl
def _eigh_impl(a, *, degenerate_tol):
    h = (a + jnp.conj(jnp.swapaxes(a, -1, -2))) / 2
    w, v = jnp.linalg.eigh(h, symmetrize_input=False)
    return w, v


def _swap(x):
    from .. import numpy as snp

    return snp.swapaxes(x, -1, -2)


def _gaps(w, tol: float):
    """`F`: `1 / (w_j - w_i)` for eigenvalues of different clusters, 0 inside
    a cluster (and on the diagonal)."""
    from .. import numpy as snp

    d = snp.expand_dims(w, -2) - snp.expand_dims(w, -1)  # d_ij = w_j - w_i
    scale = snp.max(snp.abs(w), axis=-1, keepdims=True)
    apart = snp.abs(d) > tol * snp.expand_dims(scale, -1)
    return snp.where(apart, 1.0 / snp.where(apart, d, 1.0), 0.0)


@eigh_p.def_jvp
def _eigh_jvp(primals, tangents, *, degenerate_tol):
    # A v = v diag(w): with C = v^H dA v, dw = diag(C), v^H dv = F o C (above)
    from .. import numpy as snp

    (a,), (da,) = primals, tangents
    w, v = eigh_p.bind(a, degenerate_tol=degenerate_tol)
    da = instantiate(da)
    dh = (da + snp.conj(_swap(da))) / 2
    dhv = snp.matmul(dh, v)
    dw = snp.real(snp.sum(snp.conj(v) * dhv, axis=-2))
    c = snp.matmul(snp.conj(_swap(v)), dhv)
    dv = snp.matmul(v, _gaps(w, degenerate_tol) * c)
    guard = dict(degenerate_tol=degenerate_tol, check=False)
    return (w, v), (eigh_guard_p.bind(dw, w, v, part="values", **guard),
                    eigh_guard_p.bind(dv, w, v, part="vectors", **guard))


eigh_p.def_batch(front_rule(eigh_p))


# ---------------------------------------------------------------------------
# the guard: an identity in its first operand; checked when transposed


eigh_guard_p = Primitive("linalg.eigh_guard", runtime_checks=True, params={
    "part": str, "degenerate_tol": float, "check": bool})


@eigh_guard_p.def_abstract_eval
def _guard_shape(t, w, v, *, part, degenerate_tol, check):
    if part not in ("values", "vectors"):
        raise ShapeError(f"`part` must be 'values' or 'vectors', got {part!r}.",
                         op="linalg.eigh_guard")
    want = w if part == "values" else v
    if t.shape != want.shape:
        raise ShapeError(f"the {part}' tangent must have their shape {want.str_short()}, got "
                         f"{t.str_short()}.", op="linalg.eigh_guard")
    return t


@eigh_guard_p.def_impl
def _guard_impl(t, w, v, *, part, degenerate_tol, check, site=None):
    if not check:
        return t
    spread = t if part == "values" else jnp.matmul(jnp.swapaxes(v, -1, -2), t)  # v^T v_bar
    token = host_check(_judge_gauge, site, part=part, tol=degenerate_tol,
                  complex_=bool(jnp.iscomplexobj(v)), spread=spread, w=w)
    return tie(t, token)


@eigh_guard_p.def_jvp
def _guard_jvp(primals, tangents, *, part, degenerate_tol, check):
    # An identity in `t`. The tangent of a checked cotangent is not itself a
    # cotangent of a gauge-invariant loss (only `d(v^T v_bar)` as a whole is
    # Hermitian), so it passes unguarded: the check stays on the primal.
    t, w, v = primals
    params = dict(part=part, degenerate_tol=degenerate_tol, check=check)
    dt = instantiate(tangents[0])
    return (eigh_guard_p.bind(t, w, v, **params),
            dt if check else eigh_guard_p.bind(dt, w, v, **params))


@eigh_guard_p.def_transpose
def _guard_transpose(ct, t, w, v, *, part, degenerate_tol, check):
    assert is_linear(t) and not is_linear(w) and not is_linear(v)
    return (eigh_guard_p.bind(instantiate(ct), w, v, part=part,
                              degenerate_tol=degenerate_tol, check=not check), None, None)


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


def _judge_gauge(site, *, part, tol, complex_, spread, w):
    """Host side: the cotangents of `w` (part "values") or `G = v^T v_bar`
    ("vectors") must not depend on the basis inside a cluster (for each
    matrix of a stack)."""
    from ..graph import Site

    site = Site("linalg.eigh", site.source, site.text)  # (the user's op, not the guard)
    w, g = np.asarray(w), np.asarray(spread)
    n = w.shape[-1]
    ws = w.reshape((-1, n))
    gs = g.reshape((len(ws),) + g.shape[w.ndim - 1:])
    # Inside a cluster of width `gap`, a spectral function's cotangents differ
    # by about f'' gap: allow 1e3 degenerate_tol relative to their size (a
    # basis-dependent loss is off by O(1)).
    for wk, gk in zip(ws, gs):
        _judge_one(site, part, tol, complex_, gk, wk)


def _judge_one(site, part, tol, complex_, g, w):
    size = float(np.max(np.abs(g), initial=0.0))
    if size == 0.0:
        return
    limit = 1e3 * max(float(np.finfo(w.dtype).eps) * max(len(w), 1), tol) * size
    bad = None
    for i, j in _clusters(w, tol):
        if part == "values":
            off = float(np.ptp(g[i:j]))
        else:
            block = g[i:j, i:j]
            off = float(np.max(np.abs(block - np.conj(block.T)), initial=0.0))
        if off > limit:
            bad = (i, j, off)
            break
    if bad is None and part == "vectors" and complex_:
        off = float(np.max(np.abs(np.imag(np.diagonal(g))), initial=0.0))
        if off > limit:
            k = int(np.argmax(np.abs(np.imag(np.diagonal(g)))))
            site.fail(DegenerateEigenvalueError,
                      f"the derivative depends on the phase of eigenvector {k} (complex "
                      "eigenvectors are defined up to a phase): differentiate a function "
                      "that does not change when an eigenvector is multiplied by "
                      "exp(i phi), such as |v|^2 or v v^H.", eigenvector=k)
        return
    if bad is None:
        return
    i, j, off = bad
    gap = float(w[j - 1] - w[i])
    outside = [float(w[i] - w[i - 1])] if i > 0 else []
    outside += [float(w[j] - w[j - 1])] if j < len(w) else []
    what = ("one eigenvalue of the cluster apart from the others" if part == "values"
            else "the choice of eigenvectors inside the cluster")
    site.fail(DegenerateEigenvalueError,
              f"eigenvalues {i}..{j - 1} ({w[i]:.10g} to {w[j - 1]:.10g}) are one cluster of "
              f"repeated eigenvalues (spread {gap:.1e} <= degenerate_tol {tol:.1e} times "
              f"max|w| {np.max(np.abs(w)):.3g}; the nearest other eigenvalue is "
              f"{min(outside) if outside else float('nan'):.3g} away), and the derivative "
              f"depends on {what}, where it is not defined. Differentiate a function of the "
              f"whole cluster (the sum of its eigenvalues, its projector v_c v_c^H), or "
              f"lower `degenerate_tol` if the eigenvalues are truly distinct.",
              cluster=[i, j - 1], gap=gap, asymmetry=off)


def eigh(a, degenerate_tol: float | None = None):
    tol = default_tol(np.result_type(getattr(a, "dtype", np.float64), np.float32)) \
        if degenerate_tol is None else float(degenerate_tol)
    return eigh_p.bind(a, degenerate_tol=tol)


@eigh_p.def_cost
def _eigh_cost(node, body):
    # LAPACK's divide-and-conquer syevd/heevd with vectors: about 9 n^3 real
    # FLOPs per matrix (4/3 n^3 for the tridiagonal reduction, the rest for
    # the vectors), 4x that for complex
    from ..graph._cost import Cost, size

    t = node.inputs[0].type
    n = t.shape[-1]
    per = 9.0 * n ** 3 * (4.0 if t.dtype.kind == "c" else 1.0)
    return Cost(per * size(t) / max(n * n, 1))


@eigh_guard_p.def_cost
def _guard_cost(node, body):
    # an identity; checked: v^T v_bar, one n x n product per matrix
    from ..graph._cost import Cost, size

    if not node.params["check"] or node.params["part"] == "values":
        return Cost(0.0)
    n = node.inputs[2].type.shape[-1]
    return Cost(2.0 * n * size(node.inputs[2].type))
