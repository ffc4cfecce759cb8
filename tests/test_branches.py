"""Branches and computed loops as nodes: `sd.cond`, `sd.while_loop` and
`sd.checkpoint` against JAX's `lax.cond`, `lax.while_loop` and
`jax.checkpoint`, in forward and reverse mode and at second order; their
errors; the passes inside them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (ConvergenceError, DTypeError, InvalidOptionError, NotSupportedError,
                          ShapeError)
from sciad.graph.passes import dce, optimize
from helpers import nodes_named


# ---------------------------------------------------------------------------
# cond


def _branchy_sd(x, a):
    y = sd.cond(snp.sum(x) > 0, lambda x: snp.sin(x) * a, lambda x: x ** 3 + x, x)
    return snp.sum(y ** 2)


def _branchy_jax(x, a):
    y = jax.lax.cond(jnp.sum(x) > 0, lambda x: jnp.sin(x) * a, lambda x: x ** 3 + x, x)
    return jnp.sum(y ** 2)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_value_grad_hvp_match_jax(rng, sign):
    x, a, v = sign * rng.uniform(0.1, 1.0, 4), 1.3, rng.normal(size=4)
    value, (gx, ga) = sd.value_and_grad(_branchy_sd, argnums=(0, 1))(x, a)
    np.testing.assert_allclose(value, _branchy_jax(x, a), rtol=1e-14)
    wx, wa = jax.grad(_branchy_jax, argnums=(0, 1))(x, a)
    np.testing.assert_allclose(gx, wx, rtol=1e-13)
    np.testing.assert_allclose(ga, wa, rtol=1e-13, atol=1e-15)  # zero in one branch
    h = sd.hvp(lambda x: _branchy_sd(x, a), x, v)
    hj = jax.jvp(jax.grad(lambda x: _branchy_jax(x, a)), (x,), (v,))[1]
    np.testing.assert_allclose(h, hj, rtol=1e-12)
    t = sd.jvp(lambda x: _branchy_sd(x, a), (x,), (v,))[1]
    np.testing.assert_allclose(t, np.dot(wx, v), rtol=1e-12)


def test_cond_pytrees_closures_and_integer_predicates(rng):
    w, u = rng.normal(size=3), rng.normal(size=3)

    def f(w, u, k):
        s = snp.sum(w)  # closed over by one branch only
        out = sd.cond(k, lambda p: {"a": p[0] * s, "b": p[1]},
                      lambda p: {"a": p[0] + p[1], "b": p[1] * 2.0}, (u, w))
        return snp.sum(out["a"] ** 2) + snp.sum(out["b"])

    def fj(w, u, k):
        s = jnp.sum(w)
        out = jax.lax.cond(k != 0, lambda p: {"a": p[0] * s, "b": p[1]},
                           lambda p: {"a": p[0] + p[1], "b": p[1] * 2.0}, (u, w))
        return jnp.sum(out["a"] ** 2) + jnp.sum(out["b"])

    for k in (np.int64(0), np.int64(3)):
        g = sd.grad(f, argnums=(0, 1))(w, u, k)
        gj = jax.grad(fj, argnums=(0, 1))(w, u, k)
        for a, b in zip(g, gj):
            np.testing.assert_allclose(a, b, rtol=1e-13)
    # a Python predicate picks the branch at trace time: no cond node
    graph = sd.trace(lambda u: sd.cond(True, snp.sin, snp.cos, u), u)
    assert [n.primitive.name for n in graph.nodes] == ["sin"]


def test_cond_in_a_scan_body_reverse_mode_matches_jax(rng):
    u0, k = rng.normal(size=5), rng.uniform(0.5, 1.0, 5)

    def run(u0, k, checkpoints=None):
        def step(u, _):
            u = sd.cond(snp.max(u) > 1.0, lambda u: u * 0.5, lambda u: u + 0.3 * k * u, u)
            return u, None
        return snp.sum(sd.scan(step, u0, length=15, checkpoints=checkpoints)[0] ** 2)

    def run_jax(u0, k):
        def step(u, _):
            u = jax.lax.cond(jnp.max(u) > 1.0, lambda u: u * 0.5,
                             lambda u: u + 0.3 * k * u, u)
            return u, None
        return jnp.sum(jax.lax.scan(step, u0, length=15)[0] ** 2)

    want = jax.grad(run_jax, argnums=(0, 1))(u0, k)
    for ckpt in (None, 3):
        got = sd.grad(lambda u0, k, c=ckpt: run(u0, k, c), argnums=(0, 1))(u0, k)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12)


def test_cond_errors_name_the_problem(rng):
    x = rng.normal(size=3)
    with pytest.raises(ShapeError, match="different types.*f64\\[3\\].*f64\\[2\\]"):
        sd.trace(lambda x: sd.cond(x[0] > 0, lambda x: x, lambda x: x[:2], x), x)
    with pytest.raises(ShapeError, match="different structures"):
        sd.trace(lambda x: sd.cond(x[0] > 0, lambda x: (x, x), lambda x: x, x), x)
    with pytest.raises(DTypeError, match="bool scalar, got f64\\[\\].*compare it"):
        sd.trace(lambda x: sd.cond(x[0], snp.sin, snp.cos, x), x)
    with pytest.raises(DTypeError, match="bool scalar, got bool\\[3\\]"):
        sd.trace(lambda x: sd.cond(x > 0, snp.sin, snp.cos, x), x)


def test_cond_dce_drops_unused_outputs_and_operands(rng):
    x, y = rng.normal(size=3), rng.normal(size=3)

    def f(x, y):
        a, _ = sd.cond(x[0] > 0, lambda x, y: (snp.sin(x), y * 2.0),
                       lambda x, y: (x, y), x, y)
        return a

    graph = dce(sd.trace(f, x, y))
    (node,) = nodes_named(graph, "cond")
    assert len(node.outputs) == 1 and len(node.inputs) == 2  # pred, x
    np.testing.assert_allclose(sd.graph.evaluate(graph, x, y)[0], f(x, y))


def test_checkpoint_dce_drops_unused_outputs_and_operands(rng):
    x, y = rng.normal(size=3), rng.normal(size=3)

    def f(x, y):
        return sd.checkpoint(lambda a, b: (snp.sin(a), b * 2.0))(x, y)[0]

    graph = dce(sd.trace(f, x, y))
    (node,) = nodes_named(graph, "checkpoint")
    assert len(node.outputs) == len(node.inputs) == 1
    assert node.params["body"].layout == (1, 0, 0)
    np.testing.assert_allclose(sd.graph.evaluate(graph, x, y)[0], np.sin(x))


def test_while_dce_keeps_the_carries_the_predicate_and_the_result_read():
    # k: read by the predicate; u: the result, reading w (a const) and k;
    # v: dead (neither the predicate nor u reads it)
    x, w = np.linspace(0.1, 0.3, 3), np.linspace(1.0, 2.0, 3)

    def f(x, w):
        def body(s):
            u, v, k = s
            return u + w * k, v * 2.0 + w, k + 1.0
        u, _, _ = sd.while_loop(lambda s: s[2] < 5.0, body, (x, x, 0.0), max_steps=10)
        return u

    graph = dce(sd.trace(f, x, w))
    (node,) = nodes_named(graph, "while")
    body = node.params["body"]
    assert len(node.outputs) == body.num_carry == 2  # u, k
    assert node.params["cond_body"].layout == body.layout
    np.testing.assert_allclose(sd.graph.evaluate(graph, x, w)[0], f(x, w))


# ---------------------------------------------------------------------------
# while_loop


def _grow_sd(x, a, max_steps=30, checkpoints=None):
    def body(s):
        u, k = s
        return u * (1.2 + 0.1 * snp.sin(a)) + 0.05 * snp.roll(u, 1), k + 1
    u, k = sd.while_loop(lambda s: snp.sum(s[0] ** 2) < 50.0, body, (x, 0),
                         max_steps=max_steps, checkpoints=checkpoints)
    return snp.sum(u * snp.cos(x)), k


def _grow_jax(x, a):
    def body(s):
        u, k = s
        return u * (1.2 + 0.1 * jnp.sin(a)) + 0.05 * jnp.roll(u, 1), k + 1
    u, k = jax.lax.while_loop(lambda s: jnp.sum(s[0] ** 2) < 50.0, body, (x, 0))
    return jnp.sum(u * jnp.cos(x)), k


def _grow_jax_bounded(x, a, steps):
    # the same loop with its (known) step count: what reverse mode differentiates
    def body(u, _):
        return u * (1.2 + 0.1 * jnp.sin(a)) + 0.05 * jnp.roll(u, 1), None
    u = jax.lax.scan(body, x, length=steps)[0]
    return jnp.sum(u * jnp.cos(x))


@pytest.mark.parametrize("checkpoints", [None, pytest.param(1, marks=pytest.mark.slow),
                                         pytest.param(40, marks=pytest.mark.slow), sd.Segments(2)])
def test_while_value_jvp_grad_hvp_match_jax(rng, checkpoints):
    x, a, v = rng.uniform(0.5, 1.0, 4), 0.4, rng.normal(size=4)
    (value, k), (want, kj) = _grow_sd(x, a), _grow_jax(x, a)
    np.testing.assert_allclose(value, want, rtol=1e-14)
    assert int(k) == int(kj) > 3
    t = sd.jvp(lambda x: _grow_sd(x, a)[0], (x,), (v,))[1]
    tj = jax.jvp(lambda x: _grow_jax(x, a)[0], (x,), (v,))[1]
    np.testing.assert_allclose(t, tj, rtol=1e-13)
    f = lambda x, a: _grow_sd(x, a, checkpoints=checkpoints)[0]  # noqa: E731
    g = sd.grad(f, argnums=(0, 1))(x, a)
    gj = jax.grad(_grow_jax_bounded, argnums=(0, 1))(x, a, int(kj))
    for p, q in zip(g, gj):
        np.testing.assert_allclose(p, q, rtol=1e-12)
    h = sd.hvp(lambda x: f(x, a), x, v)
    hj = jax.jvp(jax.grad(lambda x: _grow_jax_bounded(x, a, int(kj))), (x,), (v,))[1]
    np.testing.assert_allclose(h, hj, rtol=1e-11)


def test_while_bound_reached_is_an_error_not_a_truncated_value(rng):
    x = rng.uniform(0.5, 1.0, 4)
    f = sd.function(lambda x: _grow_sd(x, 0.4, max_steps=3)[0])
    with pytest.raises(ConvergenceError, match="max_steps=3.*after 3 steps") as e:
        f(x)
    assert "test_branches.py" in str(e.value)
    with pytest.raises(ConvergenceError, match="max_steps=3"):
        _grow_sd(x, 0.4, max_steps=3)  # eagerly too
    # a loop that ends exactly at the bound is fine
    k = int(_grow_jax(x, 0.4)[1])
    np.testing.assert_allclose(sd.function(lambda x: _grow_sd(x, 0.4, max_steps=k)[0])(x),
                               _grow_jax(x, 0.4)[0], rtol=1e-14)


def test_while_errors_name_the_problem(rng):
    x = rng.uniform(0.5, 1.0, 4)
    with pytest.raises(NotSupportedError, match="max_steps=N.*fori_loop"):
        sd.grad(lambda x: _grow_sd(x, 0.4, max_steps=None)[0])(x)
    with pytest.raises(InvalidOptionError, match="`checkpoints` needs `max_steps`"):
        sd.trace(lambda x: _grow_sd(x, 0.4, max_steps=None, checkpoints=3), x)
    with pytest.raises(DTypeError, match="cond_fun.*bool scalar, got f64\\[\\]"):
        sd.trace(lambda x: sd.while_loop(lambda u: snp.sum(u), lambda u: u, x), x)
    with pytest.raises(ShapeError, match="enters `body_fun` as f64\\[4\\] and leaves it "
                                         "as f32\\[4\\]"):
        sd.trace(lambda x: sd.while_loop(lambda u: u[0] < 1, lambda u: u.astype(
            np.float32), x), x)
    with pytest.raises(InvalidOptionError, match="`max_steps` must be None or a Python int"):
        sd.trace(lambda x: sd.while_loop(lambda u: u[0] < 1, lambda u: u, x,
                                         max_steps=2.5), x)


def test_while_hoists_its_invariant_factorization_and_drops_dead_carries(rng):
    n = 5
    a = np.eye(n) * 3.0 + rng.normal(size=(n, n)) * 0.1
    b = rng.normal(size=n)

    def f(a, b):
        def body(s):
            x, junk, k = s
            return x + sd.linalg.solve(a, b - a @ x), junk * 2.0, k + 1
        x, _, _ = sd.while_loop(lambda s: s[2] < 4, body, (snp.zeros(n), b, 0))
        return x

    graph = optimize(sd.trace(f, a, b))
    (node,) = nodes_named(graph, "while")
    assert not nodes_named(node.params["body"], "linalg.factor")
    assert nodes_named(graph, "linalg.factor")  # hoisted out: once per loop
    assert len(node.outputs) == 2  # the junk carry is gone
    np.testing.assert_allclose(sd.graph.evaluate(graph, a, b)[0], np.linalg.solve(a, b),
                               rtol=1e-12)


# ---------------------------------------------------------------------------
# checkpoint


def test_checkpoint_gradients_equal_plain_and_recompute(rng):
    x, v = rng.normal(size=4), rng.normal(size=4)

    def inner(x, w):
        return snp.tanh(snp.sin(x) * w + x ** 2)

    def f(x, remat):
        w = snp.sum(x)  # closed over
        g = sd.checkpoint(lambda x: inner(x, w)) if remat else (lambda x: inner(x, w))
        return snp.sum(g(x) ** 2)

    np.testing.assert_allclose(sd.grad(lambda x: f(x, True))(x),
                               sd.grad(lambda x: f(x, False))(x), rtol=1e-15)
    np.testing.assert_allclose(sd.hvp(lambda x: f(x, True), x, v),
                               sd.hvp(lambda x: f(x, False), x, v), rtol=1e-13)
    graph = sd.trace(sd.grad(lambda x: f(x, True)), x)
    # the backward pass recomputes `inner` behind a barrier
    assert nodes_named(graph, "optimization_barrier")
    (node,) = nodes_named(graph, "checkpoint")
    assert nodes_named(node.params["body"], "tanh")
    assert any(n.primitive.name == "tanh" for n in graph.nodes)


def test_checkpointed_scan_body_stacks_only_carries(rng):
    u0 = rng.normal(size=6)

    def run(u0, remat):
        def step(u, _):
            v = snp.sin(u) * snp.cos(u) + snp.exp(-u ** 2)
            return u + 0.1 * snp.tanh(v), None
        body = sd.checkpoint(step) if remat else step
        return snp.sum(sd.scan(body, u0, length=10)[0] ** 2)

    g1 = sd.trace(sd.grad(lambda u: run(u, True)), u0)
    g0 = sd.trace(sd.grad(lambda u: run(u, False)), u0)
    fwd1, fwd0 = (nodes_named(g, "scan")[0] for g in (g1, g0))
    # the forward scan's stacked outputs: one carry per step with checkpoint
    assert len(fwd1.outputs) == 2 < len(fwd0.outputs)
    np.testing.assert_allclose(sd.graph.evaluate(g1, u0)[0], sd.graph.evaluate(g0, u0)[0],
                               rtol=1e-14)


def test_while_reverse_pass_runs_over_the_steps_taken_not_max_steps(rng):
    """The default reverse pass is one `while_adjoint` node over the steps
    the loop ran: a bound 10,000 times the steps costs nothing, and the
    gradient and hvp are those of the loop run for its known step count."""
    x, a, v = rng.uniform(0.5, 1.0, 4), 0.4, rng.normal(size=4)
    k = int(_grow_jax(x, a)[1])
    f = lambda x, a: _grow_sd(x, a, max_steps=10_000 * k)[0]  # noqa: E731
    graph = sd.trace(sd.grad(f, argnums=(0, 1)), x, a)
    adj = [n for n in graph.nodes if n.primitive.name == "while_adjoint"]
    assert len(adj) == 1 and adj[0].params["snapshots"] == int(np.ceil(np.sqrt(10_000 * k)))
    g = sd.grad(f, argnums=(0, 1))(x, a)
    gj = jax.grad(_grow_jax_bounded, argnums=(0, 1))(x, a, k)
    for p, q in zip(g, gj):
        np.testing.assert_allclose(p, q, rtol=1e-12)
    h = sd.hvp(lambda x: f(x, a), x, v)
    hj = jax.jvp(jax.grad(lambda x: _grow_jax_bounded(x, a, k)), (x,), (v,))[1]
    np.testing.assert_allclose(h, hj, rtol=1e-11)
