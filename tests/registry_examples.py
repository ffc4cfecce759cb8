"""One small example per built-in primitive: a function and its arguments.

Tests walk the primitive registry and require an example for every built-in
primitive, so a primitive added without one fails CI.
"""

import numpy as np

import sciad as sd
import sciad.numpy as snp
from sciad.primitives._elementwise import BINARY, UNARY
from sciad.primitives._sparse_sharded import sharded_sddmm_p

_R = np.random.default_rng(1234)


def _f64(*shape):
    return _R.standard_normal(shape)


def _c128(*shape):
    return _R.standard_normal(shape) + 1j * _R.standard_normal(shape)


def _pos(*shape):
    return _R.uniform(0.2, 0.9, shape)


def _unary_example(name):
    prim = sd.primitives.unary_primitives[name]
    arg = {"arcsin": _pos(3, 2), "arccos": _pos(3, 2), "log": _pos(3, 2),
           "log1p": _pos(3, 2), "sqrt": _pos(3, 2),
           "logical_not": _f64(3, 2) > 0,
           "invert": _R.integers(-9, 9, (3, 2))}.get(name, _f64(3, 2))
    if name in ("real", "imag", "conj", "angle"):
        arg = _c128(3, 2)
    return (lambda x: prim.bind(x)), (arg,)


def _binary_example(name):
    prim = sd.primitives.binary_primitives[name]
    a, b = _f64(3, 1), _f64(4)
    if name == "pow":
        a = _pos(3, 1)
    if name in ("logical_and", "logical_or"):
        a, b = a > 0, b > 0
    if name.startswith("bitwise_"):
        a, b = _R.integers(-9, 9, (3, 1)), _R.integers(-9, 9, (4,))
    return (lambda x, y: prim.bind(x, y)), (a, b)


# a 5 x 4 sparse pattern given in COO form with a duplicate entry (summed)
_ROW = np.array([0, 0, 1, 2, 2, 3, 4, 4, 0])
_COL = np.array([0, 3, 1, 0, 2, 3, 1, 3, 3])
_PATTERN, _ = sd.graph.Pattern.from_coo((5, 4), _ROW, _COL)


def _coo(d):
    return sd.sparse.coo_matrix((d, (_ROW, _COL)), shape=(5, 4))


def _csr(d):
    return sd.sparse.csr_matrix((d, _PATTERN.indices, _PATTERN.indptr), shape=(5, 4))


_A33 = _R.standard_normal((3, 3)) + 3 * np.eye(3)


_SQUARE_PATTERN = sd.graph.Pattern.from_coo(
    (4, 4), np.array([0, 1, 2, 3, 3, 0, 0, 1, 2, 3]), np.array([2, 3, 0, 1, 0, 1, 0, 1, 2, 3]))[0]


def _partition():
    """`_square`'s rows over 2 devices of mesh axis "rows" (no mesh in the
    sweeps: the product runs on one device)."""
    return sd.sparse.row_partition(_SQUARE_PATTERN, 2, "rows")


def _square(d):
    """A 4 x 4 sparse matrix, off-diagonal entries from `d`, 4 on the diagonal."""
    off = sd.sparse.coo_matrix((d, ([0, 1, 2, 3, 3, 0], [2, 3, 0, 1, 0, 1])), shape=(4, 4))
    return off + sd.sparse.coo_matrix((np.full(4, 4.0), (np.arange(4), np.arange(4))))


def _factor_example(a, b, d, c, transpose):
    """A dense and a sparse factorization, each used by a plain and (if
    `transpose`) a transposed solve; the matrices are traced, so the
    backsolves' derivatives reach them."""
    from sciad.primitives._linalg import linalg_backsolve_p, linalg_factor_p

    a = a + 4.0 * snp.eye(3)
    f = linalg_factor_p.bind(a, solver="lu")
    x = linalg_backsolve_p.bind(f, a, b, solver="lu")
    S = _square(d)
    p = S.type.pattern
    fs = linalg_factor_p.bind(S, solver="splu", pattern=p, uses=2 if transpose else 1)
    y = linalg_backsolve_p.bind(fs, S, c, solver="splu", pattern=p)
    if transpose:
        x = linalg_backsolve_p.bind(f, a, x, solver="lu", transpose=True)
        y = linalg_backsolve_p.bind(fs, S, y, solver="splu", pattern=p, transpose=True)
    return x, y


def _release_example(d, c):
    """A compiled factorization its program makes (`uses` counted), read by
    two solves, and the release that ends it after them (what
    `place_releases` places)."""
    from sciad.primitives._linalg import (linalg_backsolve_p, linalg_factor_p,
                                          linalg_release_p)

    S = _square(d)
    p = S.type.pattern
    f = linalg_factor_p.bind(S, solver="klu", pattern=p, uses=2)
    y = linalg_backsolve_p.bind(f, S, c, solver="klu", pattern=p)
    z = linalg_backsolve_p.bind(f, S, y, solver="klu", pattern=p, transpose=True)
    linalg_release_p.bind(f, y, z, solver="klu")
    return z


def _rcond_example(a, d, shared):
    """Condition estimates of a dense and a sparse matrix, from a
    factorization of their own or (`shared`) from a given one."""
    from sciad.primitives._linalg import linalg_factor_p, linalg_factor_rcond_p

    a = a + 4.0 * snp.eye(3)
    S = _square(d)
    if not shared:
        return sd.linalg.cond(a), sd.linalg.cond(S), sd.linalg.cond(a, np.inf)
    p = S.type.pattern
    return (linalg_factor_rcond_p.bind(linalg_factor_p.bind(a, solver="lu"), a, solver="lu"),
            linalg_factor_rcond_p.bind(linalg_factor_p.bind(S, solver="splu", pattern=p), S,
                                       solver="splu", pattern=p))


def _factor_slogdet_example(a):
    """Log-determinants read from a given LU and Cholesky factorization (what
    `share_factors` makes of `linalg.slogdet` next to solves)."""
    from sciad.primitives._linalg import linalg_factor_p
    from sciad.primitives._logdet import linalg_factor_slogdet_p

    s = a @ snp.transpose(a) + 3.0 * snp.eye(3)
    return (linalg_factor_slogdet_p.bind(linalg_factor_p.bind(s, solver="lu"), s, solver="lu"),
            linalg_factor_slogdet_p.bind(linalg_factor_p.bind(s, solver="cholesky"), s,
                                         solver="cholesky"))


def _fill_cholesky_example(d, z):
    """Every primitive of the sparse Cholesky factor (`_square`'s symmetric
    part, factored), bound directly: the factor, both triangular solves, the
    tangent and adjoint maps and the two products their derivatives make."""
    from sciad.primitives import _sparse_cholesky as ch

    S = _square(d)
    p = S.type.pattern
    e = ch.lower(sd.sparse.data(S), p)
    l = ch.factor(S, p)
    t, a = ch.tangent(l, e, p), ch.adjoint(l, e, p)
    return (ch.trisolve(l, z, p, transpose=True), ch.trisolve(l, z, p), t, a,
            ch.symprod(t, l, p), ch.symmul(a, l, p))


def _fft_example(x, z):
    """Every kind of the `fft` primitive; the adjoint kinds bound directly."""
    from sciad.primitives import fft_p

    adj = dict(axes=(0, 1), lengths=(4, 6), norm="ortho")
    return (sd.fft.fft(z), sd.fft.ifft2(z, norm="ortho"), sd.fft.rfft(x, n=5),
            sd.fft.irfft(z, n=7, axis=0, norm="forward"),
            fft_p.bind(z[:, :4], kind="rfft_adjoint", **adj),
            fft_p.bind(x, kind="irfft_adjoint", **adj))


def _logsumexp(x):
    """`stop_gradient` as it is used: the shift `m` does not change the value,
    so finite differences agree with the derivative that holds `m` fixed."""
    m = sd.stop_gradient(snp.max(x))
    return m + snp.log(snp.sum(snp.exp(x - m)))


def _scan_example(k, u0, xs, checkpoints=None):
    # an explicit diffusion step with a source: carry, per-step input, closure
    def step(u, x):
        u = u + 0.2 * k * (snp.roll(u, 1) - u) + 0.1 * snp.sin(x)
        return u, snp.sum(u * x)
    u, ys = sd.scan(step, u0, xs, checkpoints=checkpoints)
    return snp.sum(u ** 2) + snp.sum(ys)


def _while_example(x, a):
    # a data-dependent step count (doubling until the sum passes 10, far from
    # the threshold for these inputs), the carry scaled by a closed-over value
    def body(s):
        u, k = s
        return u * (1.5 + 0.1 * snp.sin(a)), k + 1
    u, k = sd.while_loop(lambda s: snp.sum(s[0]) < 10.0, body, (x, 0), max_steps=20)
    return u * a


def _map_example(d, c, a, b):
    """Batches of matrices: sparse ones on one pattern with their own
    right-hand sides, dense ones against a shared right-hand side."""
    xs = sd.vmap(lambda d, c: sd.linalg.solve(_square(d), c, solver="splu"))(d, c)
    xd = sd.vmap(lambda a: sd.linalg.solve(a + 4.0 * snp.eye(3), b))(a)
    return xs, xd


def _eigsh_example(c):
    """The two smallest eigenvalues of a 1-D Laplacian with coefficients `c`
    (`len(c) - 1` unknowns), from a sparse matrix."""
    n = len(c) - 1
    i = np.arange(n)
    off = -c[1:-1]
    a = sd.sparse.coo_matrix((snp.concatenate([c[:-1] + c[1:], off, off]),
                              (np.concatenate([i, i[:-1], i[1:]]),
                               np.concatenate([i, i[1:], i[:-1]]))), shape=(n, n))
    w, _ = sd.linalg.eigsh(a, k=2, which="SA")
    return w ** 2


def _eigsh_operator_example(c):
    """The two smallest eigenvalues of the 1-D Laplacian of `_eigsh_example`,
    matrix-free (its matvec closes over `c`). (Its eigenvectors' derivatives,
    matrix-free bordered solves, are checked in tests/test_eigsh.py.)"""
    n = len(c) - 1

    def matvec(x):
        left = snp.concatenate([snp.zeros((1,)), x[:-1]])
        right = snp.concatenate([x[1:], snp.zeros((1,))])
        return (c[:-1] + c[1:]) * x - c[:-1] * left * (snp.arange(n) > 0) \
            - c[1:] * right * (snp.arange(n) < n - 1)

    w, _ = sd.linalg.eigsh(sd.linalg.operator(matvec, (n, n)), k=2, which="SA")
    return w ** 2


def _eigh_example(a):
    """Functions of an eigendecomposition that do not depend on the sign of
    an eigenvector: the eigenvalues and a spectral function."""
    w, v = sd.linalg.eigh(a)
    return w ** 2, v @ snp.diag(snp.sin(w)) @ v.T


def _svd_example(a):
    """Functions of a thin SVD that do not depend on the signs of the
    singular vectors: the squared singular values and u sin(s) vh."""
    u, s, vh = sd.linalg.svd(a)
    return s ** 2, u @ snp.diag(snp.sin(s)) @ vh


_SVD_ARG = np.random.default_rng(99).standard_normal((4, 3))  # (not from _R: keeps its stream)


def _diffusion(u, c, f):
    """A 1-D nonlinear reaction-diffusion residual with coefficients `c`."""
    up = snp.pad(u, 1)
    return c * (2.0 * up[1:-1] - up[:-2] - up[2:]) + u ** 3 - f


def _root_example(c, f):
    """The root of `_diffusion` with the sparse Jacobian (its detected
    tridiagonal pattern)."""
    r = sd.optimize.root(_diffusion, snp.zeros(4), (c, f), jac="sparse")
    return r.x, r.residual


def _event_guard_example(t):
    """The guard an event time passes through (`sd.ode.odeint_event`), on a
    function of its input (the events themselves: tests/test_ode_event.py)."""
    from sciad.primitives._ode_events import event_guard_p

    return event_guard_p.bind(snp.all(t > 0.0), snp.stack([0.0, 10.0]), t * snp.sin(t),
                              direction=-1)


def _root_guard_example(c, f):
    """A root solved with `throw=False`, its value passed through the guard
    that a derivative of it goes through."""
    from sciad.primitives._root import root_guard_p

    r = sd.optimize.root(_diffusion, snp.zeros(4), (c, f), jac="dense", throw=False)
    return root_guard_p.bind(r.status, r.x)


def _odeint_example(k, y0):
    """A forced linear system on constant steps (a smooth function of its
    inputs): the states at three times."""
    def field(t, y, k):
        return -k * y + snp.sin(t) * y[::-1]

    return sd.ode.odeint(field, y0, np.array([0.0, 0.3, 0.6]), k, adaptive=False, dt0=0.15)


def _radau_adjoint_example(k, y0):
    """The gradient of a Radau solve (its discrete adjoint: one
    `ode.radau_adjoint` node over the steps the solve recorded)."""
    def field(t, y, k):
        return -k * y + 0.1 * y[::-1] ** 2

    return sd.grad(lambda k, y0: snp.sum(sd.ode.odeint(
        field, y0, np.array([0.0, 0.3, 0.6]), k, solver="radau") ** 2), argnums=(0, 1))(k, y0)


def _bdf_adjoint_example(k, y0):
    """The gradient of a BDF solve (its discrete adjoint: one
    `ode.bdf_adjoint` node over the steps the solve recorded), at a
    tolerance where the step sizes' own dependence on the inputs, which the
    derivatives hold fixed and finite differences see, is below the checks'
    (at the default rtol, 1e-3, it was 2e-2 of the second derivative; at
    1e-10, 3e-6 of the third)."""
    def field(t, y, k):
        return -k * y + 0.1 * y[::-1] ** 2

    return sd.grad(lambda k, y0: snp.sum(sd.ode.odeint(
        field, y0, np.array([0.0, 0.3, 0.6]), k, solver="bdf", rtol=1e-12, atol=1e-14) ** 2),
        argnums=(0, 1))(k, y0)


def _radau_tangent_example(k, y0):
    """Forward mode through a Radau solve (its discrete forward sensitivity:
    one `ode.radau_tangent` node over the recorded steps)."""
    def field(t, y, k):
        return -k * y + 0.1 * y[::-1] ** 2

    return sd.jvp(lambda k, y0: sd.ode.odeint(field, y0, np.array([0.0, 0.3, 0.6]), k,
                                              solver="radau"), (k, y0), (k, y0))[1]


EXAMPLES = {name: _unary_example(name) for name in UNARY}
EXAMPLES.update({name: _binary_example(name) for name in BINARY})
EXAMPLES.update({
    "select": (lambda c, x, y: snp.where(c, x, y), (_f64(3, 1) > 0, _f64(3, 4), _f64(4))),
    "convert": (lambda x: snp.astype(x, np.float32), (_f64(5),)),
    "reduce_sum": (lambda x: snp.sum(x, axis=(0, 2)), (_f64(2, 3, 4),)),
    "reduce_prod": (lambda x: snp.prod(x, axis=1), (_f64(2, 3),)),
    "reduce_max": (lambda x: snp.max(x, axis=0), (_f64(2, 3),)),
    "reduce_min": (lambda x: snp.min(x), (_f64(2, 3),)),
    "reshape": (lambda x: snp.reshape(x, (3, -1)), (_f64(2, 3, 2),)),
    "transpose": (lambda x: snp.transpose(x, (1, 2, 0)), (_f64(2, 3, 4),)),
    "broadcast_to": (lambda x: snp.broadcast_to(x, (2, 3, 4)), (_f64(3, 1),)),
    "concatenate": (lambda x, y: snp.concatenate([x, y, x], axis=1), (_f64(2, 3), _f64(2, 1))),
    "pad": (lambda x: snp.pad(x, ((1, 0), (2, 3)), constant_values=1.5), (_f64(2, 3),)),
    "roll": (lambda x: snp.roll(x, (1, -2), axis=(0, 1)), (_f64(3, 4),)),
    "getitem": (lambda x: x[1:, None, ::-2], (_f64(3, 5),)),
    "index_set": (lambda x, v: x.at[1, 1:3].set(v), (_f64(3, 4), _f64(2))),
    "index_add": (lambda x, v: x.at[:, -1].add(v), (_f64(3, 4), _f64(3))),
    "matmul": (lambda a, b: a @ b, (_f64(2, 3, 4), _f64(4, 5))),
    "einsum": (lambda a, b: snp.einsum("ij,jk->ki", a, b), (_f64(3, 4), _f64(4, 2))),
    "full": (lambda x: x + snp.full((2, 3), 2.5), (_f64(2, 3),)),
    "arange": (lambda x: x * snp.arange(1.0, 4.0), (_f64(3),)),
    "linspace": (lambda x: x + snp.linspace(0.0, 1.0, 4), (_f64(4),)),
    "eye": (lambda x: x @ snp.eye(3, 3, 1), (_f64(2, 3),)),
    "add_any": (lambda x, y: sd.graph.add_any_p.bind(x, y), (_f64(2, 3), _f64(2, 3))),
    "zeros": (lambda x: x + sd.graph.zeros(sd.TensorType((3,), np.float64)), (_f64(3),)),
    "jvp_primal": (lambda x: sd.graph.jvp_primal(x) * x, (_f64(3),)),
    "sparse.assemble": (lambda d: _coo(d).todense(), (_f64(9),)),
    "sparse.gather": (lambda d: _csr(d).diagonal() * 2.0, (_f64(8),)),
    "sparse.matmul": (lambda d, x, y: (_csr(d) @ x, y @ _csr(d)), (_f64(8), _f64(4, 3), _f64(5))),
    "sparse.sddmm": (lambda u, v: sd.sparse.data(sd.sparse.sddmm(u, v, _PATTERN)),
                     (_f64(5, 2), _f64(4, 2))),
    "sparse.sharded_matmul": (lambda d, x: (
        sd.sparse.sharded_matmul(_square(d), x, _partition()),
        sd.sparse.sharded_matmul(_square(d), x, _partition(), transpose=True)),
        (_f64(6), _f64(4))),
    "sparse.sharded_sddmm": (lambda u, v: sd.sparse.data(
        sharded_sddmm_p.bind(
            u, v, pattern=_SQUARE_PATTERN, partition=_partition())), (_f64(4), _f64(4))),
    "sparse.transpose": (lambda d, y: _csr(d).T @ y, (_f64(8), _f64(5))),
    "sparse.todense": (lambda d: _csr(d).todense(), (_f64(8),)),
    "sparse.sample": (lambda m: sd.sparse.data(sd.sparse.sample(m, _PATTERN)), (_f64(5, 4),)),
    "linalg.solve": (lambda a, b, d, c: (sd.linalg.solve(a + 4.0 * snp.eye(3), b),
                                         sd.linalg.solve(_square(d), c, solver="splu")),
                     (_f64(3, 3), _f64(3, 2), _f64(6), _f64(4))),
    # (one example for the factorization and its solves: the registry walks
    # run an example shared by several primitives once)
    "linalg.factor": (lambda a, b, d, c: _factor_example(a, b, d, c, transpose=True),
                      (_f64(3, 3), _f64(3), _f64(6), _f64(4, 2))),
    "linalg.release": (_release_example, (_f64(6), _f64(4, 2))),
    "linalg.solve_operator": (
        lambda th, b: sd.linalg.solve(
            sd.linalg.operator(lambda v: snp.exp(th) * v + 0.3 * (_A33 @ v), (3, 3)), b,
            solver="bicgstab", tol=1e-13),
        (_f64(3), _f64(3))),
    "linalg.rcond": (lambda a, d: _rcond_example(a, d, shared=False), (_f64(3, 3), _f64(6))),
    "linalg.factor_rcond": (lambda a, d: _rcond_example(a, d, shared=True),
                            (_f64(3, 3), _f64(6))),
    "linalg.slogdet": (lambda a, d: (sd.linalg.slogdet(a + 4.0 * snp.eye(3)),
                                     sd.linalg.slogdet(_square(d))), (_f64(3, 3), _f64(6))),
    "linalg.factor_slogdet": (lambda a: _factor_slogdet_example(a), (_f64(3, 3),)),
    "linalg.selected_inverse": (lambda d: sd.sparse.data(sd.linalg.selected_inverse(_square(d))),
                                (_f64(6),)),
    "linalg.sparse_cholesky": (_fill_cholesky_example, (_f64(6), _f64(4, 2))),
    # (a diagonal matrix: the estimate and its derivatives are exact, see test_slq)
    "linalg.slq_logdet": (lambda d: sd.linalg.slogdet(sd.sparse.coo_matrix(
        (d * d + 1.0, (np.arange(4), np.arange(4))), shape=(4, 4), tags={"spd"}),
        solver="slq", probes=3, steps=4)[1], (_f64(4),)),
    "fft": (_fft_example, (_f64(4, 6), _c128(4, 6))),
    "call": (lambda x, y: sd.call(sd.trace(lambda a, b: (a * b, a - b), x, y), x, y),
             (_f64(3), _f64(3))),
    "stop_gradient": (lambda x: _logsumexp(x), (_f64(5),)),
    "dynamic_slice": (lambda x, i: x[i, 1:] * 2.0, (_f64(4, 3), np.int64(2))),
    "dynamic_update_slice": (lambda x, v, i: x.at[i].set(v) + x.at[:, i - 1].add(v[0]),
                             (_f64(3, 3), _f64(3), np.int64(1))),
    "scan": (lambda k, u0, xs: _scan_example(k, u0, xs), (_pos(4), _f64(4), _f64(5, 4))),
    "scan_adjoint": (lambda k, u0: sd.grad(_scan_example, argnums=(0, 1))(
        k, u0, np.linspace(0.0, 1.0, 6).reshape(3, 2), checkpoints=2), (_pos(2), _f64(2))),
    "cond": (lambda x, a: sd.cond(snp.sum(x) > 0, lambda x: snp.sin(x) * a,
                                  lambda x: x ** 3 + x, x), (_f64(3), _f64())),
    "while": (lambda x, a: _while_example(x, a), (_pos(2), _pos())),
    "while_adjoint": (lambda x, a: sd.grad(lambda x, a: snp.sum(_while_example(x, a) ** 2),
                                           argnums=(0, 1))(x, a), (_pos(2), _pos())),
    "checkpoint": (lambda x, a: sd.checkpoint(lambda x: snp.sin(x * a) ** 2)(x), (_f64(3), _f64())),
    "index_bounds": (lambda x, i: x[i] * 2.0, (_f64(5, 2), np.array([[4, -1], [0, 2]]))),
    "weights_check": (lambda a, w: snp.average(a, axis=1, weights=w),
                      (_f64(3, 2), np.array([0.25, 0.75]))),
    "take": (lambda x, i: snp.take(x, i, axis=1, mode="wrap"),
             (_f64(3, 4), np.array([[0, 5], [3, 3]]))),
    "scatter_add": (lambda x, v, i: x.at[:, i].add(v), (_f64(2, 4), _f64(2, 3),
                                                        np.array([1, 3, 1]))),
    "scatter_set": (lambda x, v, i: x.at[i].set(v * 3.0), (_f64(4, 2), _f64(2, 2),
                                                           np.array([3, 0]))),
    "cumsum": (lambda x: snp.cumsum(x, axis=1) + snp.flip(snp.cumsum(snp.flip(x), 0)),
               (_f64(3, 4),)),
    "sort": (lambda x: snp.sort(x, axis=0) * x, (_f64(4, 3),)),
    "argsort": (lambda x: snp.take_along_axis(x, snp.argsort(x ** 2, axis=1), 1),
                (_f64(3, 4),)),
    "searchsorted": (lambda xp, fp, x: snp.interp(x, xp, fp),
                     (np.array([0.0, 0.3, 0.5, 1.0]), _f64(4), np.array([0.1, 0.45, 0.7]))),
    "linalg.eigh": (_eigh_example, (_f64(3, 3),)),
    "linalg.eigsh": (_eigsh_example, (np.random.default_rng(7).uniform(1.0, 2.0, 9),)),
    "linalg.eigsh_operator": (_eigsh_operator_example,
                              (np.random.default_rng(8).uniform(1.0, 2.0, 9),)),
    "linalg.eigh_apply": (lambda a, m: (sd.linalg.eigvalsh(a, m @ m.T + 3.0 * snp.eye(3)) ** 2,
                                        sd.linalg.funm_hermitian(a, "exp")),
                          (_f64(3, 3), _f64(3, 3))),
    "linalg.eigh_guard": (lambda a: sd.grad(lambda a: snp.sum(_eigh_example(a)[1] ** 2)
                                            + snp.sum(sd.linalg.eigvalsh(a) ** 3))(a),
                          (_f64(3, 3),)),
    "linalg.svd": (_svd_example, (_SVD_ARG,)),
    "linalg.svd_guard": (lambda a: sd.grad(lambda a: snp.sum(_svd_example(a)[1] ** 2) + snp.sum(
        sd.linalg.svd(a, compute_uv=False) ** 3))(a), (_SVD_ARG,)),
    "map": (lambda d, c, a, b: _map_example(d, c, a, b),
            (_f64(2, 6), _f64(2, 4), _f64(2, 3, 3), _f64(3))),
    "optimize.root": (_root_example, (_pos(4), _f64(4))),
    "optimize.root_guard": (_root_guard_example, (_pos(4), _f64(4))),
    "ode.event_guard": (_event_guard_example, (_pos(3),)),
    "ode.odeint": (_odeint_example, (_pos(2), _f64(2))),
    "ode.radau_adjoint": (_radau_adjoint_example, (_pos(2), _pos(2))),
    "ode.bdf_adjoint": (_bdf_adjoint_example, (_pos(2), _pos(2))),
    "ode.radau_tangent": (_radau_tangent_example, (_pos(2), _pos(2))),
    "optimization_barrier": (lambda x, y: sd.primitives.barrier_p.bind(x, y)[0] * y,
                             (_f64(3), _f64(3))),
})


EXAMPLES["linalg.backsolve"] = EXAMPLES["linalg.factor"]
EXAMPLES["linalg.rademacher"] = EXAMPLES["linalg.slq_logdet"]
for _name in ("cholesky_tangent", "cholesky_adjoint", "fill_symprod", "fill_symmul",
              "fill_trisolve"):
    EXAMPLES[f"linalg.{_name}"] = EXAMPLES["linalg.sparse_cholesky"]


def distinct_examples(names):
    """`{name: example}` with one name per distinct example object (several
    primitives may share one), for the walks that run each example once."""
    seen, out = set(), {}
    for name in names:
        ex = EXAMPLES[name]
        if id(ex) not in seen:
            seen.add(id(ex))
            out[name] = ex
    return out


def builtin_primitives():
    """The registered primitives defined by sciad itself (not by tests/users)."""
    import os

    root = os.path.dirname(sd.__file__)
    return {name: p for name, p in sd.graph.registered_primitives().items()
            if p.defined_at is not None and p.defined_at.file.startswith(root)}


def marked_slow(names, slow):
    """`names` as pytest params, those in `slow` marked `slow`: a sweep over the
    registry leaves out of the default run the primitives whose rules their own
    family's tests check (the default suite has a time budget)."""
    import pytest

    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in names]


def elementwise_representatives(names, keep=("add", "sin", "select", "convert")):
    """The elementwise primitives share their batch rule and their graph form:
    a sweep checking those runs a few of them by default, the rest slow."""
    import pytest

    shared = set(UNARY) | set(BINARY)
    return [pytest.param(n, marks=pytest.mark.slow) if n in shared and n not in keep else n
            for n in names]
