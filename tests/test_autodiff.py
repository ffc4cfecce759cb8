"""Automatic differentiation: every primitive's rules checked, the transforms
against JAX's on composite functions, composition, errors, rule checking."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from registry_examples import EXAMPLES, builtin_primitives, distinct_examples, marked_slow
from sciad.errors import DTypeError, ShapeError

BUILTINS = sorted(builtin_primitives())

# diagnostics that are not differentiated: differentiating them raises
NOT_DIFFERENTIATED = {"linalg.rcond", "linalg.factor_rcond"}


# checked by their families' own rule tests (test_eigen, test_svd, test_eigsh,
# test_linalg, test_root; odeint's derivatives in test_ode against finite
# differences and each other; scan_adjoint and while_adjoint as the loops'
# second order in test_loops and test_branches; map by test_batching's
# sweep; Radau's derivative nodes against each other in test_radau_adjoint
# and against exact derivatives in test_stiff_methods), with their gauges
# and solvers: slow here
FAMILY_CHECKED = {"linalg.svd_guard", "linalg.eigh_guard", "linalg.eigh", "linalg.eigh_apply",
                  "linalg.svd", "linalg.solve_operator", "linalg.backsolve",
                  "linalg.eigsh_operator", "optimize.root_guard", "ode.odeint", "scan_adjoint",
                  "while_adjoint", "map", "ode.radau_adjoint", "ode.radau_tangent",
                  "ode.bdf_adjoint"}


@pytest.mark.parametrize("name", marked_slow(sorted(distinct_examples(BUILTINS)),
                                             FAMILY_CHECKED))
def test_every_primitive_passes_check_rules(name, rng):
    fn, args = EXAMPLES[name]
    args = [np.asarray(a) for a in args]
    # (batching of these examples: tests/test_batching.py, against a loop, with
    # every argument mapped and with only the first)
    report = sd.testing.check_rules(fn, *args, seed=int(rng.integers(2**31)), batch=False)
    graph = sd.trace(fn, *args)
    assert any(n.primitive.name == name for n in graph.nodes)
    if name in NOT_DIFFERENTIATED:
        assert report.skipped["all"].startswith("not differentiable"), report
        return
    if any(sd.graph.is_differentiable(a.type) for a in graph.inputs) and any(
            sd.graph.is_differentiable(a.type) for a in graph.outputs):
        assert report.jvp_error is not None and report.vjp_error is not None
        assert "second_order" not in report.skipped


def _c(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


COMPLEX_UNARY = ["neg", "exp", "log", "log1p", "expm1", "sin", "cos", "tan", "sinh", "cosh",
                 "tanh", "sqrt", "abs", "sign", "square", "conj", "real", "imag", "angle"]


@pytest.mark.parametrize("name", COMPLEX_UNARY)
def test_complex_unary_rules(name, rng):
    prim = sd.primitives.unary_primitives[name]
    sd.testing.check_rules(prim, _c(rng, 3, 2) + 2.0, seed=int(rng.integers(2**31)))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow"])
def test_complex_binary_rules(name, rng):
    prim = sd.primitives.binary_primitives[name]
    sd.testing.check_rules(prim, _c(rng, 3, 1) + 2.0, _c(rng, 4) * 0.5 + 2.0,
                           seed=int(rng.integers(2**31)))


def test_convert_rules_between_real_and_complex(rng):
    sd.testing.check_rules(
        lambda x, z: (snp.astype(x, np.complex128), snp.astype(z, np.float64)),
        rng.standard_normal(4), _c(rng, 3), seed=int(rng.integers(2**31)))


@pytest.mark.parametrize("fn", [
    lambda a, b: a @ b,
    lambda a, b: snp.einsum("ij,jk->ki", a, b),
    lambda a, b: snp.sum(a, axis=1) * snp.prod(b, axis=0)[:3],
    lambda a, b: snp.where(snp.real(a) > 0, a, 2.0 * snp.conj(a)),
])
def test_complex_structural_rules(fn, rng):
    sd.testing.check_rules(fn, _c(rng, 3, 4), _c(rng, 4, 5), seed=int(rng.integers(2**31)))


# ---------------------------------------------------------------------------
# agreement with JAX

def _pair(s, j):
    def f_sd(x, y):
        return s(x, y)

    def f_jax(x, y):
        return j(x, y)
    return f_sd, f_jax


COMPOSITES = {
    "mlp": _pair(
        lambda x, w: snp.sum(snp.tanh(snp.tanh(x @ w) @ w.T) ** 2) + snp.mean(snp.exp(-x)),
        lambda x, w: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w.T) ** 2) + jnp.mean(jnp.exp(-x))),
    "stencil": _pair(
        lambda u, k: snp.sum((snp.roll(u, 1, axis=0) - 2 * u + snp.roll(u, -1, axis=0)) ** 2
                             * snp.exp(k[:3, :4])) + snp.max(u) * snp.min(k),
        lambda u, k: jnp.sum((jnp.roll(u, 1, axis=0) - 2 * u + jnp.roll(u, -1, axis=0)) ** 2
                             * jnp.exp(k[:3, :4])) + jnp.max(u) * jnp.min(k)),
    "indexing": _pair(
        lambda x, y: snp.sum(snp.concatenate([x[1:, ::2], y[:2, :2] ** 3], axis=1) ** 2)
        + snp.sum(snp.pad(x, 1) * 0.5) + snp.sum(x.at[0, 1:3].set(y[0, :2]) ** 2),
        lambda x, y: jnp.sum(jnp.concatenate([x[1:, ::2], y[:2, :2] ** 3], axis=1) ** 2)
        + jnp.sum(jnp.pad(x, 1) * 0.5) + jnp.sum(x.at[0, 1:3].set(y[0, :2]) ** 2)),
    "divpow": _pair(
        lambda x, y: snp.sum(snp.sqrt(x * x + 1.0) / (y * y + 2.0)) + snp.sum(
            snp.power(x * x + 0.5, snp.sin(y[:3, :4]))),
        lambda x, y: jnp.sum(jnp.sqrt(x * x + 1.0) / (y * y + 2.0)) + jnp.sum(
            jnp.power(x * x + 0.5, jnp.sin(y[:3, :4])))),
}


def _args(rng):
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 4))[:3, :4] * 0 + \
        rng.standard_normal((3, 4))


def _close(a, b, rtol):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol,
                                   atol=rtol * max(1.0, float(np.max(np.abs(y)))))


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("case", marked_slow(sorted(COMPOSITES),
                                             {"divpow", "indexing", "stencil"}))
def test_transforms_agree_with_jax(case, rng, x64):
    f_sd, f_jax = COMPOSITES[case]
    x = rng.standard_normal((3, 4))
    w = rng.standard_normal((4, 4)) if case == "mlp" else rng.standard_normal((3, 4))
    tx, tw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    _close(sd.grad(f_sd, argnums=(0, 1))(x, w), jax.grad(f_jax, argnums=(0, 1))(x, w), 1e-10)
    _close(sd.value_and_grad(f_sd)(x, w), jax.value_and_grad(f_jax)(x, w), 1e-10)
    _close(sd.jvp(f_sd, (x, w), (tx, tw)), jax.jvp(f_jax, (x, w), (tx, tw)), 1e-10)
    out, vjp_fn = sd.vjp(f_sd, x, w)
    out_j, vjp_j = jax.vjp(f_jax, x, w)
    _close((out, vjp_fn(np.float64(1.5))), (out_j, vjp_j(1.5)), 1e-10)
    _close(sd.hvp(lambda a: f_sd(a, w), x, tx),
           jax.jvp(jax.grad(lambda a: f_jax(a, w)), (x,), (tx,))[1], 1e-8)
    _close(sd.jacfwd(sd.grad(f_sd))(x, w), jax.jacfwd(jax.grad(f_jax))(x, w), 1e-8)
    _close(sd.jacrev(sd.grad(f_sd))(x, w), jax.jacrev(jax.grad(f_jax))(x, w), 1e-8)


def test_vector_jacobians_agree_with_jax(rng, x64):
    a = rng.standard_normal((4, 3))

    def f(x):
        return snp.sin(a @ x) * x[0]

    x = rng.standard_normal(3)
    ref = jax.jacfwd(lambda x: jnp.sin(a @ x) * x[0])(x)
    _close(sd.jacfwd(f)(x), ref, 1e-10)
    _close(sd.jacrev(f)(x), ref, 1e-10)
    assert sd.jacrev(f)(x).shape == (4, 3)


def test_grad_of_grad_and_jacfwd_of_jacrev(x64):
    f = lambda x: snp.sin(x) * snp.exp(x)  # noqa: E731
    fj = lambda x: jnp.sin(x) * jnp.exp(x)  # noqa: E731
    _close(sd.grad(sd.grad(sd.grad(f)))(0.3), jax.grad(jax.grad(jax.grad(fj)))(0.3), 1e-10)
    g = lambda x: snp.sum(snp.tanh(x) ** 3)  # noqa: E731
    gj = lambda x: jnp.sum(jnp.tanh(x) ** 3)  # noqa: E731
    x = np.linspace(-1, 1, 4)
    _close(sd.jacfwd(sd.jacrev(g))(x), jax.hessian(gj)(x), 1e-10)


def test_complex_gradient_follows_jax():
    g = sd.grad(lambda z: snp.abs(z) ** 2)(np.complex128(1 + 2j))
    assert complex(g) == 2 - 4j
    g2 = sd.grad(lambda z: snp.real(z * snp.conj(z)))(np.complex128(1 + 2j))
    assert complex(g2) == 2 - 4j


# ---------------------------------------------------------------------------
# subgradient choices, documented in sciad/primitives/_elementwise.py and _reduce.py

def test_subgradients_at_kinks():
    assert float(sd.grad(lambda x: snp.abs(x))(0.0)) == 0.0
    np.testing.assert_array_equal(
        sd.grad(lambda x: snp.max(x))(np.array([1.0, 3.0, 3.0])), [0.0, 0.5, 0.5])
    np.testing.assert_array_equal(
        sd.grad(lambda x: snp.sum(snp.maximum(x, 1.0)))(np.array([0.0, 1.0, 2.0])),
        [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(
        sd.grad(lambda x: snp.sum(snp.where(x > 0, x * x, -x)))(np.array([-1.0, 2.0])),
        [-1.0, 4.0])
    assert float(sd.grad(lambda x: snp.sqrt(x))(1e-12)) == pytest.approx(0.5e6)
    assert np.isinf(float(sd.grad(lambda x: snp.sqrt(x))(0.0)))
    assert float(sd.grad(lambda x: snp.power(x, 2.0))(0.0)) == 0.0
    # d/dy x^y at x = 0 is taken as 0 (not nan)
    assert float(sd.grad(lambda y: snp.power(0.0, y))(2.0)) == 0.0


def test_prod_gradient_with_zeros_is_exact():
    x = np.array([2.0, 0.0, 3.0, 0.5])
    np.testing.assert_allclose(sd.grad(lambda x: snp.prod(x))(x), [0.0, 3.0, 0.0, 0.0])
    x = np.array([2.0, 0.0, 3.0])
    np.testing.assert_allclose(sd.grad(lambda x: snp.prod(x))(x), [0.0, 6.0, 0.0])


# ---------------------------------------------------------------------------
# graphs, closures, errors

def test_derivative_graph_is_traceable_and_verified():
    def f(x):
        return snp.sum(snp.exp(x) * x)

    x = np.ones(3)
    g = sd.trace(sd.grad(f), x)
    text = g.pretty(source=False)
    assert text.startswith("graph grad_f(%x: f64[3]) {")
    assert "add_any" in text or "mul" in text
    sd.graph.verify(g)
    np.testing.assert_allclose(sd.graph.evaluate(g, x)[0], np.exp(x) * (x + 1), rtol=1e-14)


def test_vjp_graph_lists_saved_values():
    def f(x):
        return snp.sum(snp.sin(x) ** 2)

    g = sd.trace(f, np.ones(4))
    vg = sd.graph.vjp_graph(g)
    assert vg.saved_types, "the backward part needs saved values"
    assert vg.forward.out_types[0] == sd.TensorType((), np.float64)
    assert [str(t) for t in vg.backward.in_types[len(vg.saved_types):]] == ["f64[]"]
    x = np.linspace(0, 1, 4)
    fwd = sd.graph.evaluate(vg.forward, x)
    (gx,) = sd.graph.evaluate(vg.backward, *fwd[1:], np.float64(1.0))
    np.testing.assert_allclose(gx, 2 * np.sin(x) * np.cos(x), rtol=1e-14)


def test_jvp_graph_has_tangent_inputs_for_floats_only():
    g = sd.trace(lambda x, n: x * snp.astype(n, np.float64), np.ones(3), np.arange(3))
    jg = sd.graph.jvp_graph(g)
    assert [str(t) for t in jg.in_types] == ["f64[3]", "i64[3]", "f64[3]"]
    assert [str(t) for t in jg.out_types] == ["f64[3]", "f64[3]"]


def test_grad_closing_over_a_traced_value():
    def outer(theta, x):
        inner = sd.grad(lambda x: snp.sum(snp.sin(theta * x)))
        return snp.sum(inner(x) ** 2)

    theta, x = 0.7, np.linspace(0, 1, 5)

    def outer_j(theta, x):
        inner = jax.grad(lambda x: jnp.sum(jnp.sin(theta * x)))
        return jnp.sum(inner(x) ** 2)

    with jax.enable_x64(True):
        ref = jax.grad(outer_j)(theta, x)
    np.testing.assert_allclose(sd.grad(outer)(theta, x), ref, rtol=1e-12)


def test_integer_inputs_get_no_tangent():
    def f(x, n):
        return snp.sum(x * n)

    gx = sd.grad(f)(np.ones(3), np.arange(3))
    np.testing.assert_array_equal(gx, [0.0, 1.0, 2.0])
    with pytest.raises(DTypeError, match="grad: .*float or complex.*got i64\\[3\\]"):
        sd.grad(f, argnums=1)(np.ones(3), np.arange(3))


def test_grad_needs_a_real_scalar():
    with pytest.raises(ShapeError, match="grad: needs `f` to return a real scalar, got f64\\[3\\]"):
        sd.grad(lambda x: x * 2.0)(np.ones(3))
    with pytest.raises(ShapeError, match="real scalar, got c128\\[\\]"):
        sd.grad(lambda z: z * z)(np.complex128(1j))


def test_has_aux():
    def f(x):
        return snp.sum(x ** 2), snp.max(x)

    g, aux = sd.grad(f, has_aux=True)(np.arange(3.0))
    np.testing.assert_array_equal(g, [0.0, 2.0, 4.0])
    assert float(aux) == 2.0
    (v, aux), g = sd.value_and_grad(f, has_aux=True)(np.arange(3.0))
    assert float(v) == 5.0 and float(aux) == 2.0


def test_jvp_tangent_type_must_match():
    with pytest.raises(ShapeError, match="jvp: a tangent must have its primal's shape"):
        sd.jvp(lambda x: x * 2, (np.ones(3),), (np.ones(2),))
    with pytest.raises(DTypeError, match=r"jvp: a tangent must have its primal's dtype: "
                                         r"primal f64\[3\] needs a float64 tangent, got "
                                         r"f32\[3\]"):
        sd.jvp(lambda x: x * 2, (np.ones(3),), (np.ones(3, np.float32),))


def test_vjp_cotangent_dtype_is_a_dtype_error():
    _, vjp_fn = sd.vjp(lambda x: snp.sin(x), np.ones(3))
    with pytest.raises(DTypeError, match=r"vjp: a cotangent must have its output's dtype: "
                                         r"output f64\[3\] needs a float64 cotangent, got "
                                         r"f32\[3\]"):
        vjp_fn(np.ones(3, np.float32))
    with pytest.raises(ShapeError, match=r"cotangent must have its output's shape: output "
                                         r"f64\[3\], cotangent f64\[2\]"):
        vjp_fn(np.ones(2))

    def inside(x):  # the same check while tracing
        _, pullback = sd.vjp(lambda x: snp.sin(x), x)
        return pullback(snp.astype(x, np.float32))

    with pytest.raises(DTypeError, match="needs a float64 cotangent, got f32"):
        sd.trace(inside, np.ones(3))


# ---------------------------------------------------------------------------
# stop_gradient


def test_stop_gradient_is_identity_with_zero_derivative(x64):
    f = lambda x: x * sd.stop_gradient(x) + snp.sin(sd.stop_gradient(x) * x)  # noqa: E731
    fj = lambda x: x * jax.lax.stop_gradient(x) + jnp.sin(jax.lax.stop_gradient(x) * x)  # noqa
    x = 0.7
    assert float(sd.function(f)(x)) == pytest.approx(float(fj(x)), rel=1e-15)
    _close(sd.grad(f)(x), jax.grad(fj)(x), 1e-14)
    _close(sd.jvp(f, (x,), (1.0,)), jax.jvp(fj, (x,), (1.0,)), 1e-14)
    _close(sd.vjp(f, x)[1](1.0), jax.vjp(fj, x)[1](1.0), 1e-14)
    _close(sd.grad(sd.grad(f))(x), jax.grad(jax.grad(fj))(x), 1e-14)
    _close(sd.hvp(lambda v: snp.sum(f(v)), np.full(2, x), np.ones(2)),
           jax.jvp(jax.grad(lambda v: jnp.sum(fj(v))), (np.full(2, x),), (np.ones(2),))[1],
           1e-14)
    assert float(sd.grad(lambda x: sd.stop_gradient(x) ** 2)(3.0)) == 0.0


def test_stop_gradient_passes_non_floats_and_pytrees_through():
    n = np.arange(3)
    assert sd.stop_gradient(n) is n
    out = sd.stop_gradient({"a": np.ones(2), "n": n, "s": 2.0})
    assert out["n"] is n and float(out["s"]) == 2.0
    np.testing.assert_array_equal(out["a"], np.ones(2))
    g = sd.trace(lambda x, k: sd.stop_gradient((x, k)), np.ones(2), n)
    assert [nd.primitive.name for nd in g.nodes] == ["stop_gradient"]  # not on `k`


def test_stop_gradient_survives_optimize():
    def f(x):
        c = sd.stop_gradient(snp.cos(x))
        return snp.sum(snp.sin(x) * c * 1.0)

    x = np.linspace(0.0, 1.0, 4)
    g = sd.graph.passes.optimize(sd.trace(f, x))
    assert "stop_gradient" in str(g)
    vg = sd.graph.vjp_graph(g)
    fwd = sd.graph.evaluate(vg.forward, x)
    (gx,) = sd.graph.evaluate(vg.backward, *fwd[1:], np.float64(1.0))
    np.testing.assert_allclose(gx, np.cos(x) * np.cos(x), rtol=1e-14)
    np.testing.assert_allclose(sd.grad(f)(x), np.cos(x) * np.cos(x), rtol=1e-14)


def test_missing_jvp_rule_is_named():
    p = sd.primitive("test_ad_nojvp")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x * 2)
    with pytest.raises(sd.errors.MissingRuleError, match="`test_ad_nojvp` has no JVP rule"):
        sd.grad(lambda x: snp.sum(p(x)))(np.ones(2))


# ---------------------------------------------------------------------------
# derivative nodes point at the user's line of the node they come from


def _line_of(fn, text: str) -> int:
    """The line number of the first line of `fn`'s source containing `text`."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _singular_objective(p):
    a = snp.asarray(np.array([[1.0, 2.0], [2.0, 4.0]])) * p
    x = sd.linalg.solve(a, np.ones(2))
    return snp.sum(x)


def test_run_time_error_inside_grad_names_the_users_line():
    this = test_run_time_error_inside_grad_names_the_users_line
    with pytest.raises(sd.errors.SingularMatrixError) as excinfo:
        sd.grad(_singular_objective)(1.0)  # the line of the call: not the one named
    text = str(excinfo.value)
    assert f"test_autodiff.py:{_line_of(_singular_objective, 'sd.linalg.solve')}" in text
    assert f"test_autodiff.py:{_line_of(this, 'sd.grad(_singular_objective)')}" not in text


def test_derivative_graph_shows_the_users_lines():
    def f(x):
        y = snp.sin(x) * x
        return snp.sum(y ** 2)

    g = sd.trace(sd.grad(f), np.ones(3))
    lines = {_line_of(f, "snp.sin(x) * x"), _line_of(f, "snp.sum(y ** 2)")}
    call_line = _line_of(test_derivative_graph_shows_the_users_lines, "sd.trace(sd.grad(f)")
    sources = [n.source.line for n in g.nodes if n.source is not None]
    assert set(sources) <= lines | {call_line}, g
    # every node but the seed cotangent (`1.0`, made by `sd.grad` itself)
    # comes from one of f's lines
    assert sum(line == call_line for line in sources) == 1, g
    assert {n.source.line for n in g.nodes if n.primitive.name == "cos"} == \
        {_line_of(f, "snp.sin(x) * x")}
    sd.graph.verify(g)
    # forward mode the same
    j = sd.trace(lambda x: sd.jvp(f, (x,), (snp.ones_like(x),))[1], np.ones(3))
    assert {n.source.line for n in j.nodes if n.primitive.name == "cos"} == \
        {_line_of(f, "snp.sin(x) * x")}


def test_rule_error_while_differentiating_names_the_users_line():
    # a JVP that uses a primitive without a transpose rule: reverse mode
    # transposes the JVP and fails; the error names the line of `p(x)` in f
    q = sd.primitive("test_ad_src_no_transpose")
    q.def_abstract_eval(lambda t: t)
    q.def_impl(lambda t: 2 * t)
    p = sd.primitive("test_ad_src_outer")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x ** 2)
    p.def_jvp(lambda primals, tangents: (p(primals[0]), q(tangents[0]) * primals[0]))

    def f(x):
        y = snp.exp(x)
        return snp.sum(p(y))

    with pytest.raises(sd.errors.MissingRuleError,
                       match="`test_ad_src_no_transpose` has no transpose rule") as excinfo:
        sd.grad(f)(np.ones(2))
    assert f"test_autodiff.py:{_line_of(f, 'p(y)')}" in str(excinfo.value)


def test_a_gradient_of_a_constant_argument_inside_another_trace():
    """`sd.grad(g)(0.7)` inside a traced function: the reverse pass is
    emitted into that trace, and the argument, a constant there, is lifted
    into it (rules form cotangents only for traced operands: a constant
    matrix needs none). It had given zero through solves, loops and
    branches."""
    A = np.array([[4.0, 1.0], [1.0, 3.0]])
    cases = [
        (lambda A: snp.sum(sd.linalg.solve(A, np.array([1.0, 2.0])) ** 2), A),
        (lambda a: sd.scan(lambda c, x: (c * a + x, None), 1.0, snp.arange(3.0))[0], 1.5),
        (lambda a: sd.cond(a > 0, lambda a: a * a, lambda a: -a, a), 1.5),
        (lambda a: sd.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * a), (0, a),
                                 max_steps=5)[1], 1.5),
    ]
    for g, x in cases:
        want = np.asarray(sd.grad(g)(x))
        got = sd.function(lambda s: s * sd.grad(g)(x))(1.0)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
        assert np.abs(want).max() > 0
