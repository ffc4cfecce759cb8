"""Forward mode through every family of primitives nested in every loop node.

`sd.jvp` of a function whose tangent map holds a gauge guard (eigh,
eigvalsh, svd, eigsh) transposes that map once to run the guards' checks,
so every tangent map sciad builds must transpose, loops and all: `scan`,
`fori_loop`, `while_loop`, the `map` of `sd.vmap`'s fallback, and `cond`
inside a loop. For each loop and family: `sd.jvp` against central
differences, the tangent map transposed node by node against `sd.jvp` (the
dot-product test), and `sd.hvp` against differences of `sd.grad`. A
representative subset runs by default, the whole matrix with `-m slow`.
"""

from __future__ import annotations

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from registry_examples import builtin_primitives
from sciad.errors import DegenerateEigenvalueError
from sciad.graph import Graph, Var, instantiate, transpose_eval
from sciad.graph._autodiff import jvp_primal, known_zero, linear_outputs, vjp_transpose

N = 4
_R = np.random.default_rng(1)
K = _R.standard_normal((N, N))
K = (K + K.T) / 4
B = _R.standard_normal((N, N)) / 4
ROWS = np.array([0, 1, 2, 3, 0, 1, 2, 3, 1, 2])
COLS = np.array([0, 1, 2, 3, 1, 0, 3, 2, 2, 1])
A0 = np.array([0.3, -0.2, 0.5, 0.1])
DA = np.array([0.7, 0.1, -0.4, 0.9])


# ---------------------------------------------------------------------------
# the families: `(a, c) -> scalar`, nonlinear in the parameters `a` and in a
# loop's carry `c`, with distinct eigenvalues and singular values (so that
# the gauge checks pass) and well-conditioned systems


def _sym(a, c):
    return snp.diag(a * 2.0 + snp.arange(N) * 1.5) + c * K


def eigh(a, c):
    w, v = sd.linalg.eigh(_sym(a, c))
    return snp.sum(w * snp.sin(w)) + snp.sum(v[:, 0] ** 4)


def eigvalsh(a, c):
    return snp.sum(snp.cos(sd.linalg.eigvalsh(_sym(a, c))))


def svd(a, c):
    u, s, _ = sd.linalg.svd(snp.diag(a + 3.0 + snp.arange(N)) + c * B)
    return snp.sum(s) / 8 + snp.sum(u[:, 0] ** 2 * snp.arange(N))


def solve(a, c):
    x = sd.linalg.solve(snp.diag(a + 3.0) + c * B, snp.sin(a))
    return snp.sum(x * x)


def sparse_solve(a, c):
    data = snp.concatenate([a + 4.0, a * c, a[:2] * 0.1])
    x = sd.linalg.solve(sd.sparse.coo_matrix((data, (ROWS, COLS)), shape=(N, N)), snp.cos(a))
    return snp.sum(x * x)


def fft(a, c):
    return snp.sum(snp.abs(sd.fft.fft(a * (1.0 + c) + snp.arange(N)))) / 4


def root(a, c):
    r = sd.optimize.root(lambda x, p: x ** 3 + x - p, snp.zeros(N), args=(a * (1.0 + c),))
    return snp.sum(r.x ** 2)


def odeint(a, c):
    ys = sd.ode.odeint(lambda t, y, p: -p * y + snp.sin(y), snp.ones(N),
                       snp.asarray([0.0, 0.5]), args=a * a + c, rtol=1e-10, atol=1e-12)
    return snp.sum(ys[-1] ** 2)


def eigsh(a, c):
    n = 6
    i = np.arange(n)
    d = snp.concatenate([a, a[:2]]) * 2.0 + snp.arange(n) * 1.5
    off = c * snp.ones(n - 1) * 0.3
    A = sd.sparse.coo_matrix((snp.concatenate([d, off, off]),
                              (np.concatenate([i, i[:-1], i[1:]]),
                               np.concatenate([i, i[1:], i[:-1]]))), shape=(n, n))
    w, v = sd.linalg.eigsh(A, k=2)
    return snp.sum(w ** 3) + snp.sum(v[:, 0] ** 4)


FAMILIES = {f.__name__: f for f in (eigh, eigvalsh, svd, solve, sparse_solve, fft, root,
                                    odeint, eigsh)}


# ---------------------------------------------------------------------------
# the loops: `family -> (a -> scalar)`


def _next(c, y):
    return 0.5 * c + 0.1 * snp.tanh(0.2 * y)


def in_scan(fam):
    def f(a):
        c, ys = sd.scan(lambda c, _: (_next(c, fam(a, c)), fam(a, c)), snp.asarray(0.3),
                        length=2)
        return c + snp.sum(ys)
    return f


def in_fori_loop(fam):
    return lambda a: sd.fori_loop(0, 2, lambda i, c: _next(c, fam(a, c) * (i + 1)),
                                  snp.asarray(0.3))


def in_while_loop(fam):
    def f(a):
        c, _ = sd.while_loop(lambda s: s[1] < 2, lambda s: (_next(s[0], fam(a, s[0])), s[1] + 1),
                             (snp.asarray(0.3), 0), max_steps=4)
        return c
    return f


def in_vmap(fam):
    # (the solves, root, ODE and eigsh nodes of a batch are `map` nodes)
    return lambda a: snp.sum(sd.vmap(lambda s: fam(a * s, 0.2 * s))(snp.asarray([1.0, 1.1])))


def cond_in_scan(fam):
    def f(a):
        def step(c, _):
            return sd.cond(c > 0, lambda c: _next(c, fam(a, c)), lambda c: c - 1.0, c), None
        return sd.scan(step, snp.asarray(0.3), length=2)[0]
    return f


LOOPS = {f.__name__: f for f in (in_scan, in_fori_loop, in_while_loop, in_vmap, cond_in_scan)}


# ---------------------------------------------------------------------------
# the checks


def _fd(f, a, d, h=1e-5):
    return (np.asarray(f(a + h * d)) - np.asarray(f(a - h * d))) / (2 * h)


def transposed(f, a, w):
    """`J^T w` for `f`'s Jacobian at `a`, by transposing the tangent map that
    `sd.jvp` builds (a graph of its tangent input), node by node."""
    g = sd.trace(lambda t: sd.jvp(f, (a,), (t,))[1], a)
    return np.asarray(sd.function(
        lambda w: instantiate(transpose_eval(g, [True], [], [w])[0]))(w))


def check_jvp(f):
    _, t = sd.jvp(f, (A0,), (DA,))
    np.testing.assert_allclose(t, _fd(f, A0, DA), rtol=1e-6, atol=1e-9)


def check_transpose(f):
    _, t = sd.jvp(f, (A0,), (DA,))
    jt = transposed(f, A0, np.asarray(1.3))
    np.testing.assert_allclose(np.sum(jt * DA), 1.3 * float(t), rtol=1e-10, atol=1e-12)


def check_hvp(f):
    np.testing.assert_allclose(sd.hvp(f, A0, DA), _fd(sd.grad(f), A0, DA), rtol=1e-6,
                               atol=1e-8)


CHECKS = {"jvp": check_jvp, "transpose": check_transpose, "hvp": check_hvp}

# the default run: each loop node's transpose rule once, on families that
# compile fast (the eigen families cost seconds each: `-m slow`, and
# `test_jvp_through_eigh_in_scan` below)
DEFAULT = {("in_fori_loop", "fft", "jvp"), ("in_while_loop", "fft", "transpose"),
           ("in_vmap", "sparse_solve", "transpose"), ("cond_in_scan", "fft", "transpose")}

CASES = [pytest.param(loop, fam, check, id=f"{loop}-{fam}-{check}",
                      marks=() if (loop, fam, check) in DEFAULT else pytest.mark.slow)
         for loop in LOOPS for fam in FAMILIES for check in CHECKS]


@pytest.mark.parametrize("loop, family, check", CASES)
def test_forward_mode_through_family_in_loop(loop, family, check):
    CHECKS[check](LOOPS[loop](FAMILIES[family]))


def test_jvp_through_eigh_in_scan():
    # the case (before: `scan has no transpose rule`), against the
    # same loop in NumPy, differenced
    def reference(a):
        c, total = 0.3, 0.0
        for _ in range(2):
            w, v = np.linalg.eigh(np.diag(a * 2.0 + np.arange(N) * 1.5) + c * K)
            y = np.sum(w * np.sin(w)) + np.sum(v[:, 0] ** 4)
            c, total = 0.5 * c + 0.1 * np.tanh(0.2 * y), total + y
        return c + total

    _, t = sd.jvp(in_scan(eigh), (A0,), (DA,))
    np.testing.assert_allclose(t, _fd(reference, A0, DA), rtol=1e-6)


# ---------------------------------------------------------------------------
# loops that take other paths through transposition


@pytest.mark.slow
def test_unbounded_while_loop_transposes_by_recomputing():
    # without max_steps no storage can be sized: each step's primal carry is
    # recomputed from the start
    def f(a):
        c, _ = sd.while_loop(lambda s: s[1] < 3, lambda s: (_next(s[0], eigh(a, s[0])), s[1] + 1),
                             (snp.asarray(0.3), 0))
        return c
    check_jvp(f)


@pytest.mark.slow
@pytest.mark.parametrize("check", ["jvp", "hvp"])
def test_checkpointed_scan(check):
    # jvp: the transpose is a `scan_adjoint` on the schedule; hvp: the
    # `scan_adjoint` of the gradient is transposed through its expansion
    def f(a):
        c, _ = sd.scan(lambda c, _: (_next(c, eigh(a, c)), None), snp.asarray(0.3), length=4,
                       checkpoints=2)
        return c
    CHECKS[check](f)


@pytest.mark.slow
def test_reverse_scan_and_checkpoint_in_scan():
    def f(a):
        step = sd.checkpoint(lambda c, x: _next(c, eigh(a * x, c)))
        c, _ = sd.scan(lambda c, x: (step(c, x), None), snp.asarray(0.3),
                       snp.asarray([1.0, 0.9, 1.2]), reverse=True)
        return c
    check_jvp(f)
    check_transpose(f)


@pytest.mark.slow
def test_while_loop_hvp_transposes_its_adjoint():
    # the gradient's `while_adjoint`, differentiated forward, is transposed
    # through its expansion
    check_hvp(in_while_loop(eigvalsh))


def _degenerate():
    q, _ = np.linalg.qr(np.random.default_rng(3).standard_normal((3, 3)))
    return q @ np.diag([1.0, 1.0, 3.0]) @ q.T


def _gauge_dependent(a):
    _, v = sd.linalg.eigh(a)
    return snp.sum(v[:, 0] * snp.arange(3.0))


def test_gauge_check_judges_forward_mode_inside_a_scan():
    # before: `scan has no transpose rule`; a loss that depends on the basis
    # chosen in a cluster of repeated eigenvalues must raise, not return a
    # tangent that depends on that choice
    def f(a):
        return sd.scan(lambda c, _: (c + _gauge_dependent(a), None), snp.asarray(0.0),
                       length=2)[0]
    with pytest.raises(DegenerateEigenvalueError, match="repeated eigenvalues"):
        sd.jvp(f, (_degenerate(),), (np.eye(3),))


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["scan", "while"])
def test_gauge_invariant_loss_passes_the_check_in_loops(loop):
    def invariant(a):
        return snp.sum(sd.linalg.eigvalsh(a) ** 2)

    def f(a):
        if loop == "scan":
            return sd.scan(lambda c, _: (c + invariant(a), None), snp.asarray(0.0), length=2)[0]
        return sd.while_loop(lambda s: s[1] < 2, lambda s: (s[0] + invariant(a), s[1] + 1),
                             (snp.asarray(0.0), 0), max_steps=3)[0]
    a, d = _degenerate(), np.random.default_rng(4).standard_normal((3, 3))
    d = d + d.T
    _, t = sd.jvp(f, (a,), (d,))
    np.testing.assert_allclose(t, _fd(f, a, d), rtol=1e-6)
    with pytest.raises(DegenerateEigenvalueError):
        sd.jvp(lambda a: f(a) + _gauge_dependent(a), (a,), (d,))


# a primitive whose JVP computes its primal and tangent results in one node
# (as an ODE solved with its sensitivities does) and marks the primal part:
# `joint(x, t) = [sin x, cos(x) t]`, linear in `t` where `x` is fixed and
# transposed through its VJP there


joint_p = sd.primitive("test_forward_in_loops.joint", params={})
sin_p = sd.primitive("test_forward_in_loops.sin", params={})


@joint_p.def_abstract_eval
def _joint_shape(x, t):
    return sd.TensorType((2 * x.shape[0],), x.dtype)


@joint_p.def_impl
def _joint_impl(x, t):
    import jax.numpy as jnp

    return jnp.concatenate([jnp.sin(x), jnp.cos(x) * t])


@joint_p.def_vjp
def _joint_vjp(primals, out, ct):
    (x, t), n = primals, primals[0].shape[0]
    return (snp.cos(x) * ct[:n] - snp.sin(x) * t * ct[n:], snp.cos(x) * ct[n:])


joint_p.def_transpose(vjp_transpose(joint_p))


@sin_p.def_abstract_eval
def _sin_shape(x):
    return x


@sin_p.def_impl
def _sin_impl(x):
    import jax.numpy as jnp

    return jnp.sin(x)


@sin_p.def_jvp
def _sin_jvp(primals, tangents):
    (x,), (t,), n = primals, tangents, primals[0].shape[0]
    both = joint_p.bind(x, instantiate(t))
    return jvp_primal(both[:n]), both[n:]


def joint(a, c):
    return snp.sum(sin_p.bind(a * (1.0 + c)) ** 2)


def test_node_computing_primal_and_tangent_in_a_branch_of_a_loop():
    # the branch's primal result is marked, so the cond's primal output and
    # the loop's primal carry are no tangents (a dce-based guess took the
    # carry for one, started from zero: a silently wrong transpose)
    f = cond_in_scan(joint)
    check_jvp(f)
    check_transpose(f)


def test_known_zero():
    assert known_zero(np.zeros(3)) and not known_zero(np.ones(3))
    seen = []

    def f(x):
        seen.extend([known_zero(snp.zeros(3)), known_zero(instantiate(sd.graph.Zero(
            sd.TensorType((3,), np.float64)))), known_zero(snp.ones(3)), known_zero(x * 0)])
        return x

    sd.trace(f, np.ones(3))
    assert seen == [True, True, False, False]

    # a batch's broadcast (and reshape, transpose, cast) of a zero is zero;
    # of anything else, not (the ODE's zero tangent start under `sd.vmap`)
    seen.clear()

    def g(x):
        z = snp.broadcast_to(snp.zeros(3), (2, 3))
        seen.extend([known_zero(z), known_zero(snp.reshape(z.T, (6,)).astype(np.float32)),
                     known_zero(snp.broadcast_to(snp.ones(3), (2, 3))),
                     known_zero(snp.broadcast_to(x * 0, (2, 3)))])
        return x

    sd.trace(g, np.ones(3))
    assert seen == [True, True, False, False]


# ---------------------------------------------------------------------------
# every higher-order node transposes, or is never linear


#: bound by their JVPs on primals only (the tangent is a linear solve, or
#: eigenvector corrections, beside them): never in a tangent map's linear part
NEVER_LINEAR = {"optimize.root", "linalg.eigsh_operator"}


def _higher_order():
    def holds_graph(t):
        return (isinstance(t, type) and issubclass(t, Graph)
                or isinstance(t, tuple) and any(holds_graph(x) for x in t))

    return sorted(n for n, p in builtin_primitives().items()
                  if p.params and any(holds_graph(d.type) for d in p.params.values()))


def test_every_higher_order_primitive_transposes_or_is_never_linear():
    names = _higher_order()
    assert {"scan", "while", "cond", "map", "checkpoint", "ode.odeint"} <= set(names)
    for name in names:
        p = sd.graph.lookup_primitive(name)
        assert (p.transpose_rule is None) == (name in NEVER_LINEAR), name


def _operator_eigsh(a, c):
    n = 6
    d = snp.concatenate([a, a[:2]]) * 2.0 + snp.arange(n) * 1.5
    op = sd.linalg.operator(lambda x: d * x + c * 0.3 * (snp.roll(x, 1) + snp.roll(x, -1)),
                            (n, n))
    w, _ = sd.linalg.eigsh(op, k=2)
    return snp.sum(w ** 3)


@pytest.mark.parametrize("family", [root, _operator_eigsh], ids=["root", "eigsh_operator"])
def test_never_linear_primitives_read_no_tangent(family):
    g = sd.trace(lambda t: sd.jvp(lambda a: family(a, 0.3), (A0,), (t,))[1], A0)
    linear: set = set(g.inputs)
    seen = []
    for node in g.nodes:
        flags = [isinstance(x, Var) and x in linear for x in node.inputs]
        if node.primitive.name in NEVER_LINEAR:
            seen.append(node.primitive.name)
            assert not any(flags), f"{node.primitive.name} reads a tangent"
        linear.update(v for v, f in zip(node.outputs, linear_outputs(node, flags)) if f)
    assert seen
