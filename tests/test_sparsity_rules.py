"""Sparsity rules over the whole primitive registry: every rule is sound (the
pattern it gives holds every nonzero of the Jacobian, computed by JAX on the
registry example at random points), and the primitives without a rule are
exactly those listed."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from registry_examples import EXAMPLES, builtin_primitives
from sciad.graph._sparsity import input_deps, sparsity_eval

BUILTINS = sorted(builtin_primitives())
WITH_RULE = [n for n in BUILTINS if sd.graph.lookup_primitive(n).sparsity_rule is not None]


# rules that pass operands through or are dense, whose examples are costly to
# differentiate: slow
SLOW = {"linalg.svd_guard", "linalg.eigh_guard", "linalg.backsolve", "linalg.solve_operator",
        "ode.odeint", "optimize.root_guard", "map", "ode.radau_adjoint", "ode.radau_tangent",
        "ode.bdf_adjoint"}
# (odeint's and Radau's derivative nodes' rules are `dense_all`; the guard's
# example is a root solve; map's rule is its body's, checked with every
# primitive)


def _one_per_rule(names):
    """The first primitive of each distinct rule (the elementwise ops share one,
    made per primitive from the same code) and example; the others run in the
    slow set."""
    seen, out = set(), []
    for n in names:
        # (several primitives share an example: it is checked once)
        keys = {sd.graph.lookup_primitive(n).sparsity_rule.__code__, id(EXAMPLES[n])}
        slow = n in SLOW or keys & seen
        out.append(pytest.param(n, marks=pytest.mark.slow) if slow else n)
        seen |= keys
    return out

# Built-in primitives without a sparsity rule: a graph holding one gets a
# dense pattern for its outputs, with a warning. The list must match the
# registry exactly: a rule added removes its name here.
PENDING: set[str] = set()
# no operands, or no float output: the interpretation never asks for a rule
NEVER_ASKED = {"arange", "eye", "full", "linspace", "zeros", "argsort", "searchsorted",
               "index_bounds"}


def test_sparsity_rule_coverage_is_as_listed():
    missing = {n for n in BUILTINS
               if sd.graph.lookup_primitive(n).sparsity_rule is None} - NEVER_ASKED
    assert missing == PENDING, (
        f"with no sparsity rule but not listed: {sorted(missing - PENDING)}; listed but "
        f"with a rule now: {sorted(PENDING - missing)}")


def _inexact(a) -> bool:
    return np.asarray(a).dtype.kind in "fc"


def _jacobian_fn(graph, lowered, args, outs, i, direction):
    """`x -> ` the derivative of the float outputs' real and imaginary parts
    along real perturbations `direction * t` of argument `i` at `x`, compiled
    once: by JAX's forward mode of the lowered graph, or (where the lowering
    calls the host, which JAX cannot differentiate) by sciad's."""
    def f(t, x, call, xp):
        full = list(args)
        full[i] = x + direction * t
        res = call(*full)
        flat = xp.concatenate([xp.ravel(res[o]) for o in outs])
        return xp.stack([flat.real, flat.imag])

    by_jax = jax.jit(jax.jacfwd(lambda t, x: f(t, x, lambda *a: lowered(*a), jax.numpy)))
    by_sciad = sd.jacfwd(lambda t, x: f(t, x, lambda *a: sd.call(graph, *a), sd.numpy))

    def jac(x):
        t = np.zeros(np.shape(x))
        try:
            with sd.config.x64_scope():
                return np.asarray(by_jax(t, x))
        except sd.errors.LoweringError:
            return np.asarray(by_sciad(t, x))

    return jac


@pytest.mark.parametrize("name", _one_per_rule(WITH_RULE))
def test_sparsity_rule_is_sound(name, rng):
    fn, args = EXAMPLES[name]
    graph = sd.trace(fn, *args)
    lowered = sd.graph.lower(graph)
    outs = [i for i, a in enumerate(graph.outputs)
            if np.dtype(sd.graph.runtime_type(a.type).dtype).kind in "fc"]
    wrt = [i for i, a in enumerate(args) if _inexact(a)]
    if not (outs and wrt):
        pytest.skip("the example has no float or complex input and output")
    for i in wrt:
        with warnings.catch_warnings():
            warnings.simplefilter("error", sd.errors.SparsityWarning)
            deps = sparsity_eval(graph, input_deps(graph.in_types,
                                                   [k == i for k in range(len(args))]))
        pattern = np.vstack([deps[o].matrix.toarray() for o in outs])
        x0 = np.asarray(args[i])
        nonzero = np.zeros(pattern.shape, bool)
        # real perturbations (and imaginary ones of a complex argument), at two
        # random points so that no entry is zero by chance; the derivative of
        # an output's real and imaginary parts
        for direction in ([1.0, 1j] if x0.dtype.kind == "c" else [1.0]):
            jac_at = _jacobian_fn(graph, lowered, args, outs, i, direction)
            for _ in range(2):
                x = x0 * (1 + 0.05 * rng.standard_normal(x0.shape))
                try:
                    jac = jac_at(x)
                except sd.errors.NotSupportedError as e:  # a condition number
                    pytest.skip(f"no reference Jacobian: {e}")
                assert np.isfinite(jac).all(), f"{name}: a non-finite Jacobian"
                nonzero |= (jac != 0).any(axis=0).reshape(pattern.shape)
        missed = np.argwhere(nonzero & ~pattern)
        assert not missed.size, (f"{name}: the pattern misses Jacobian entries (output "
                                 f"element, input element) {missed[:5].tolist()} of "
                                 f"argument {i}")


# ---------------------------------------------------------------------------
# sharp patterns: exact where the rule can be


def _circular_band(n: int, width: int) -> np.ndarray:
    i = np.arange(n)
    d = np.abs(i[:, None] - i[None, :])
    return np.minimum(d, n - d) <= width


def test_scan_of_a_stencil_is_banded():
    # three explicit steps of a periodic 3-point stencil: the final state's
    # band is 3 wide, each stacked step's as wide as its step (not dense)
    n, k = 12, 3

    def step(u, _):
        u = u + 0.1 * (snp.roll(u, 1) - 2.0 * u + snp.roll(u, -1))
        return u, u

    def f(u0):
        u, ys = sd.scan(step, u0, length=k)
        return snp.concatenate([u, snp.ravel(ys)])

    got = sd.sparse.jacobian_sparsity(f, np.ones(n)).toarray()
    want = np.vstack([_circular_band(n, k)] + [_circular_band(n, t + 1) for t in range(k)])
    np.testing.assert_array_equal(got, want)


def test_scan_outputs_read_their_own_step():
    # a long scan (past the steps followed one by one): each output reads its
    # own slice of xs and the carry grows by nothing, so block diagonal
    def f(xs):
        _, ys = sd.scan(lambda c, x: (c * 2.0, snp.sin(x) * c), np.ones(2), xs)
        return snp.ravel(ys)

    got = sd.sparse.jacobian_sparsity(f, np.ones((150, 2))).toarray()
    np.testing.assert_array_equal(got, np.eye(300, dtype=bool))


def test_fft_along_one_axis_is_block_structured():
    got = sd.sparse.jacobian_sparsity(lambda x: sd.fft.fft(x, axis=0).real,
                                      np.ones((4, 3))).toarray()
    # output (i, j) reads the column j: every x[:, j]
    np.testing.assert_array_equal(got, np.kron(np.ones((4, 4), bool), np.eye(3, dtype=bool)))


def test_dynamic_slice_with_constant_start_selects():
    from sciad.primitives._indexing import dynamic_slice_p

    # the start on axis 1 is clamped to 1 (XLA's rule), as the op clamps it
    got = sd.sparse.jacobian_sparsity(
        lambda x: dynamic_slice_p.bind(x, np.int64(1), np.int64(5), sizes=(2, 2)),
        np.ones((4, 3))).toarray()
    want = np.zeros((4, 12), bool)
    want[np.arange(4), [4, 5, 7, 8]] = True
    np.testing.assert_array_equal(got, want)


def test_dynamic_slice_with_traced_start_reads_its_reach():
    from sciad.primitives._indexing import dynamic_slice_p

    def f(x):
        i = snp.astype(snp.sum(x) > 0, np.int64)  # traced: any start in [0, 4]
        return dynamic_slice_p.bind(x, i, sizes=(2,))

    got = sd.sparse.jacobian_sparsity(f, np.ones(6)).toarray()
    np.testing.assert_array_equal(got, np.eye(2, 6, dtype=bool) | np.eye(2, 6, 1, dtype=bool)
                                  | np.eye(2, 6, 2, dtype=bool) | np.eye(2, 6, 3, dtype=bool)
                                  | np.eye(2, 6, 4, dtype=bool))


def test_take_with_constant_indices_selects():
    got = sd.sparse.jacobian_sparsity(lambda x: snp.take(x, np.array([3, 0, 3]), axis=1),
                                      np.ones((2, 4))).toarray()
    want = np.zeros((6, 8), bool)
    want[np.arange(6), [3, 0, 3, 7, 4, 7]] = True
    np.testing.assert_array_equal(got, want)


def _true_pattern(f, x, rng) -> np.ndarray:
    """The nonzeros of `f`'s Jacobian (`sd.jacfwd`) at two random points near
    `x`: what a sound pattern holds and an exact one equals."""
    nonzero, jacobian = False, sd.jacfwd(f)
    for _ in range(2):
        jac = np.asarray(jacobian(x + 0.1 * rng.standard_normal(x.shape)))
        nonzero = nonzero | (jac.reshape(-1, x.size) != 0)
    return nonzero


@pytest.mark.parametrize("axis, reverse", [(0, False), (1, False), (1, True)])
def test_cumsum_is_triangular(axis, reverse, rng):
    # before: each element depended on its whole line
    from sciad.primitives import cumsum_p

    def f(x):
        return snp.ravel(cumsum_p.bind(snp.sin(x), axis=axis, reverse=reverse))

    x = rng.standard_normal((3, 4))
    got = sd.sparse.jacobian_sparsity(f, x).toarray()
    np.testing.assert_array_equal(got, _true_pattern(f, x, rng))
    lines, line = (4, 3) if axis == 0 else (3, 4)
    assert got.sum() == lines * line * (line + 1) // 2


def test_fori_loop_reading_its_index_selects(rng):
    # the index is a constant at every step followed, so `x[i]` is that
    # element (before: any of them, a dense pattern)
    def f(x):
        return sd.fori_loop(0, 5, lambda i, c: c.at[i].set(snp.sin(x[i]) + c[i - 1]),
                            snp.zeros(5))

    x = rng.standard_normal(5)
    got = sd.sparse.jacobian_sparsity(f, x).toarray()
    np.testing.assert_array_equal(got, _true_pattern(f, x, rng))
    np.testing.assert_array_equal(got, np.tri(5, dtype=bool))


def test_loop_past_the_followed_steps_stays_sound(rng):
    # past SPARSITY_STEPS the union over steps is iterated: the index's value
    # differs between steps and is dropped, and step 0 (which adds nothing)
    # must not pass for a fixed point
    from sciad.primitives._loop_sparsity import SPARSITY_STEPS

    n = SPARSITY_STEPS + 20

    def f(x):
        return sd.fori_loop(0, n, lambda i, c: c + snp.where(i > 0, x[i % 3], 0.0),
                            snp.zeros(()))[None]

    x = rng.standard_normal(3)
    got = sd.sparse.jacobian_sparsity(f, x).toarray()
    want = _true_pattern(f, x, rng)
    assert want.all() and np.all(got >= want)


def test_while_loop_counting_its_steps_is_followed(rng):
    # the predicate reads only the counter: two steps exactly (before: the
    # union over any number of steps, dense)
    def f(x):
        return sd.while_loop(lambda s: s[1] < 2,
                             lambda s: (s[0] * snp.roll(s[0], 1), s[1] + 1), (x, 0))[0]

    x = rng.standard_normal(5)
    got = sd.sparse.jacobian_sparsity(f, x).toarray()
    np.testing.assert_array_equal(got, _true_pattern(f, x, rng))
    assert got.sum() == 15


def test_while_loop_stopping_on_its_data_is_sound(rng):
    # the steps depend on the data: the union over every number of steps
    def f(x):
        return sd.while_loop(lambda s: snp.sum(s[0] ** 2) > 1e-2,
                             lambda s: (0.5 * s[0] + 0.1 * snp.roll(s[0], 1), s[1] + 1),
                             (x, 0), max_steps=50)[0]

    x = rng.standard_normal(4)
    got = sd.sparse.jacobian_sparsity(f, x).toarray()
    assert np.all(got >= _true_pattern(f, x, rng))


def _root_of(coupled: bool):
    # x_i solves x_i^3 + x_i = sin(y_i) (+ 0.1 x_{i-1} within each half, if
    # coupled): dx/dy = J^-1 diag(cos y), J = 3 x^2 + 1 (+ the lag) is
    # diagonal, or lower bidiagonal per half, whose inverse is full lower
    # triangular there
    def residual(z, p):
        lag = snp.concatenate([snp.zeros(1), z[:2], snp.zeros(1), z[3:5]])
        return z ** 3 + z - p + (0.1 * lag if coupled else 0.0)

    def f(y):
        return sd.optimize.root(residual, snp.zeros(6), args=(snp.sin(y),)).x

    block = np.tri(3, dtype=bool) if coupled else np.eye(3, dtype=bool)
    return f, np.kron(np.eye(2, dtype=bool), block)


@pytest.mark.parametrize("coupled", [False, True])
def test_root_depends_through_the_residuals_closure(coupled, rng):
    # independent equations give independent roots, a chain its triangle
    # (before: every root depended on every parameter)
    f, want = _root_of(coupled)
    got = sd.sparse.jacobian_sparsity(f, rng.standard_normal(6)).toarray()
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("coupled", [False, True])
def test_root_pattern_is_the_jacobians(coupled, rng):
    f, want = _root_of(coupled)
    np.testing.assert_array_equal(want, _true_pattern(f, rng.standard_normal(6), rng))


def test_loop_whose_pattern_holds_still_stops_early(monkeypatch):
    # the index's value moves at every step, but a step with it unknown
    # grows nothing: the interpretation stops there, not after 100 steps
    import sciad.graph._sparsity as sparsity

    calls = []
    real = sparsity.sparsity_eval
    monkeypatch.setattr(sparsity, "sparsity_eval", lambda *a: calls.append(1) or real(*a))
    got = sd.sparse.jacobian_sparsity(
        lambda u: sd.fori_loop(0, 100, lambda i, u: snp.sin(u) * 0.5, u), np.ones(4))
    np.testing.assert_array_equal(got.toarray(), np.eye(4, dtype=bool))
    assert len(calls) < 10
