"""Graph passes: golden text before and after, idempotence, unchanged results."""

import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import RegistrationError
from sciad.graph import Body, Factored, Graph, Node, Primitive, TensorType, Var, passes
from sciad.primitives import broadcast_to_p, convert_p, reshape_p, transpose_p
from sciad.primitives._linalg import linalg_backsolve_p, linalg_factor_p


def check_pass(pass_fn, graph, before, after, *args):
    """The golden text before and after, idempotence, the inputs and the input
    graph untouched, and the same numbers from both graphs on `args`."""
    assert graph.pretty(source=False) == before
    new = pass_fn(graph)
    assert new.pretty(source=False) == after
    assert graph.pretty(source=False) == before  # the input is not changed
    assert new is not graph
    assert len(new.inputs) == len(graph.inputs)
    assert all(a is b for a, b in zip(new.inputs, graph.inputs))
    assert new.out_types == graph.out_types
    assert pass_fn(new).pretty(source=False) == after  # idempotent
    want = sd.graph.evaluate(graph, *args)
    got = sd.graph.evaluate(new, *args)
    assert len(got) == len(want)
    for w, g in zip(want, got):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=0)
    return new


# ---------------------------------------------------------------------------
# dce and cse


def redundant(x):
    a = snp.sin(x)
    b = snp.sin(x)
    unused = snp.cos(x) * 2.0
    return a + b


REDUNDANT = """\
graph redundant(%x: f64[3]) {
  %0 = sin %x      : f64[3]
  %1 = sin %x      : f64[3]
  %2 = cos %x      : f64[3]
  %3 = mul %2, 2.0 : f64[3]
  %4 = add %0, %1  : f64[3]
  return %4
}"""


def test_dce_removes_unused_nodes(rng):
    x = rng.standard_normal(3)
    g = sd.trace(redundant, x)
    new = check_pass(passes.dce, g, REDUNDANT, """\
graph redundant(%x: f64[3]) {
  %0 = sin %x     : f64[3]
  %1 = sin %x     : f64[3]
  %2 = add %0, %1 : f64[3]
  return %2
}""", x)
    # kept nodes keep their source lines
    assert [n.source for n in new.nodes] == [g.nodes[i].source for i in (0, 1, 4)]


def test_cse_merges_duplicates(rng):
    x = rng.standard_normal(3)
    check_pass(passes.cse, sd.trace(redundant, x), REDUNDANT, """\
graph redundant(%x: f64[3]) {
  %0 = sin %x      : f64[3]
  %1 = cos %x      : f64[3]
  %2 = mul %1, 2.0 : f64[3]
  %3 = add %0, %0  : f64[3]
  return %3
}""", x)


def test_cse_compares_literals_by_value(rng):
    def f(x):
        return x * np.array([1.0, 2.0, 3.0]), x * np.array([1.0, 2.0, 3.0]), \
            x * np.float64(-0.0), x * np.float64(0.0)

    x = rng.standard_normal(3)
    check_pass(passes.cse, sd.trace(f, x), """\
graph f(%x: f64[3]) {
  %0 = mul %x, f64[3]{1.0, 2.0, 3.0} : f64[3]
  %1 = mul %x, f64[3]{1.0, 2.0, 3.0} : f64[3]
  %2 = mul %x, -0.0                  : f64[3]
  %3 = mul %x, 0.0                   : f64[3]
  return %0, %1, %2, %3
}""", """\
graph f(%x: f64[3]) {
  %0 = mul %x, f64[3]{1.0, 2.0, 3.0} : f64[3]
  %1 = mul %x, -0.0                  : f64[3]
  %2 = mul %x, 0.0                   : f64[3]
  return %0, %0, %1, %2
}""", x)


def test_effects_are_kept_and_not_merged():
    sin = sd.graph.lookup_primitive("sin")
    x, a, b, c = (Var(TensorType((3,), np.float64)) for _ in range(4))
    io = frozenset({"io"})
    g = Graph((x,), (Node(sin, (x,), (a,), {}, io), Node(sin, (x,), (b,), {}, io),
                     Node(sin, (x,), (c,), {})), (x,))
    effects_only = """\
graph graph(%arg0: f64[3]) {
  %0 = sin !{io} %arg0 : f64[3]
  %1 = sin !{io} %arg0 : f64[3]
  return %arg0
}"""
    assert passes.dce(g).pretty(source=False) == effects_only
    assert passes.optimize(g).pretty(source=False) == effects_only
    assert len(passes.cse(g).nodes) == 3
    # a call whose body has effects has them too: kept though its result is unused
    out = Var(TensorType((3,), np.float64))
    outer = Graph((x,), (Node(sd.primitives.call_p, (x,), (out,), {"body": Body.of(g)}),), (x,))
    assert len(passes.dce(outer).nodes) == 1
    assert len(passes.optimize(outer).nodes) == 1


# ---------------------------------------------------------------------------
# fold_constants


def test_fold_constants(rng):
    def f(x):
        return snp.exp(np.float64(2.0)) * x, snp.ones(3) + 1.0

    x = rng.standard_normal(3)
    check_pass(passes.fold_constants, sd.trace(f, x), """\
graph f(%x: f64[3]) {
  %0 = exp 2.0                                : f64[]
  %1 = mul %0, %x                             : f64[3]
  %2 = full[dtype=f64, shape=(3,), value=1.0] : f64[3]
  %3 = add %2, 1.0                            : f64[3]
  return %1, %3
}""", """\
graph f(%x: f64[3]) {
  %0 = mul 7.38905609893065, %x : f64[3]
  return %0, f64[3]{2.0, 2.0, 2.0}
}""", x)


def test_fold_constants_keeps_dtype_and_respects_max_size(rng):
    def f(x):
        return x + snp.arange(3, dtype=np.float32), snp.ones(5) * 2.0

    x = rng.standard_normal(3).astype(np.float32)
    g = sd.trace(f, x)
    new = passes.fold_constants(g, max_size=4)
    assert new.pretty(source=False) == """\
graph f(%x: f32[3]) {
  %0 = add %x, f32[3]{0.0, 1.0, 2.0}          : f32[3]
  %1 = full[dtype=f64, shape=(5,), value=1.0] : f64[5]
  %2 = mul %1, 2.0                            : f64[5]
  return %0, %2
}"""
    assert new.nodes[0].inputs[1].value.dtype == np.float32


failing_p = sd.primitive("test_passes_failing")


@failing_p.def_abstract_eval
def _failing_shape(x):
    return x


@failing_p.def_impl
def _failing_impl(x):
    raise RuntimeError("no host evaluation")


def test_fold_constants_leaves_failing_nodes():
    g = sd.trace(lambda x: failing_p(np.float64(1.0)) + x, np.float64(0.0))
    new = passes.fold_constants(g)
    assert new.pretty(source=False) == g.pretty(source=False)


# ---------------------------------------------------------------------------
# simplify


def arithmetic(x):
    y = 1.0 * (x * 1.0)
    y = 0.0 + (y + 0.0) - 0.0
    y = -(-(y / 1.0))
    return y * snp.ones(3)


def test_simplify_arithmetic(rng):
    x = rng.standard_normal(3)
    check_pass(passes.simplify, sd.trace(arithmetic, x), """\
graph arithmetic(%x: f64[3]) {
  %0 = mul %x, 1.0                            : f64[3]
  %1 = mul 1.0, %0                            : f64[3]
  %2 = add %1, 0.0                            : f64[3]
  %3 = add 0.0, %2                            : f64[3]
  %4 = sub %3, 0.0                            : f64[3]
  %5 = div %4, 1.0                            : f64[3]
  %6 = neg %5                                 : f64[3]
  %7 = neg %6                                 : f64[3]
  %8 = full[dtype=f64, shape=(3,), value=1.0] : f64[3]
  %9 = mul %7, %8                             : f64[3]
  return %9
}""", """\
graph arithmetic(%x: f64[3]) {
  return %x
}""", x)


def structural(m, z):
    t = snp.transpose(snp.transpose(m, (1, 0, 2)), (0, 2, 1))
    r = snp.reshape(snp.reshape(m, (24,)), (4, 6))
    return (t, m.T.T, r, snp.reshape(snp.reshape(m, (24,)), (2, 3, 4)),
            reshape_p(m, shape=(2, 3, 4)), transpose_p(m, perm=(0, 1, 2)),
            broadcast_to_p(z, shape=(3,)), convert_p(z, dtype=np.dtype(np.complex128)),
            snp.conj(snp.conj(z)))


def test_simplify_structural(rng):
    m = rng.standard_normal((2, 3, 4))
    z = rng.standard_normal(3) + 1j * rng.standard_normal(3)
    check_pass(passes.simplify, sd.trace(structural, m, z), """\
graph structural(%m: f64[2,3,4], %z: c128[3]) {
  %0 = transpose[perm=(1, 0, 2)] %m : f64[3,2,4]
  %1 = transpose[perm=(0, 2, 1)] %0 : f64[3,4,2]
  %2 = reshape[shape=(24,)] %m      : f64[24]
  %3 = reshape[shape=(4, 6)] %2     : f64[4,6]
  %4 = transpose[perm=(2, 1, 0)] %m : f64[4,3,2]
  %5 = transpose[perm=(2, 1, 0)] %4 : f64[2,3,4]
  %6 = reshape[shape=(24,)] %m      : f64[24]
  %7 = reshape[shape=(2, 3, 4)] %6  : f64[2,3,4]
  %8 = reshape[shape=(2, 3, 4)] %m  : f64[2,3,4]
  %9 = transpose[perm=(0, 1, 2)] %m : f64[2,3,4]
  %10 = broadcast_to[shape=(3,)] %z : c128[3]
  %11 = convert[dtype=c128] %z      : c128[3]
  %12 = conj %z                     : c128[3]
  %13 = conj %12                    : c128[3]
  return %1, %5, %3, %7, %8, %9, %10, %11, %13
}""", """\
graph structural(%m: f64[2,3,4], %z: c128[3]) {
  %0 = transpose[perm=(1, 2, 0)] %m : f64[3,4,2]
  %1 = reshape[shape=(4, 6)] %m     : f64[4,6]
  return %0, %m, %1, %m, %m, %m, %z, %z, %z
}""", m, z)


def test_simplify_skips_inexact_rewrites(rng):
    def f(x, z):
        return x * np.ones((2, 3)), x * 0.0, z * 1.0, x * np.float64(np.nan)

    x = rng.standard_normal(3)
    z = rng.standard_normal(3) + 1j * rng.standard_normal(3)
    text = """\
graph f(%x: f64[3], %z: c128[3]) {
  %0 = mul %x, const<f64[2,3] #087ee8> : f64[2,3]
  %1 = mul %x, 0.0                     : f64[3]
  %2 = mul %z, 1+0j                    : c128[3]
  %3 = mul %x, nan                     : f64[3]
  return %0, %1, %2, %3
}"""
    check_pass(passes.simplify, sd.trace(f, x, z), text, text, x, z)


# Every rewrite above is a `def_simplify` rule of its op, beside the op; the
# pass only calls rules. A rule is defined once per primitive, built-in or not,
# so a user's rewrite goes on the user's own primitive.

scale_p = sd.primitive("test_passes_scale", params={"c": float})
scale_p.def_abstract_eval(lambda x, *, c: x)
scale_p.def_impl(lambda x, *, c: x * c)


@scale_p.def_simplify
def _scale_simplify(node, producer):
    # scale(scale(x, a), b) -> scale(x, a * b); scale(x, 1) -> x
    x, c = node.inputs[0], node.params["c"]
    inner = producer(x)
    if inner is not None and inner.primitive is scale_p:
        return node.replace(inputs=inner.inputs, params={"c": inner.params["c"] * c})
    return x if c == 1.0 else None


def scaled(x, m):
    y = scale_p(scale_p(x * 1.0, c=4.0), c=0.25)
    return scale_p(y, c=3.0), snp.reshape(snp.reshape(m, (6,)), (3, 2))


def test_simplify_calls_a_user_primitives_rule_beside_the_built_in_ones(rng):
    x, m = rng.standard_normal(3), rng.standard_normal((2, 3))
    check_pass(passes.simplify, sd.trace(scaled, x, m), """\
graph scaled(%x: f64[3], %m: f64[2,3]) {
  %0 = mul %x, 1.0                  : f64[3]
  %1 = test_passes_scale[c=4.0] %0  : f64[3]
  %2 = test_passes_scale[c=0.25] %1 : f64[3]
  %3 = test_passes_scale[c=3.0] %2  : f64[3]
  %4 = reshape[shape=(6,)] %m       : f64[6]
  %5 = reshape[shape=(3, 2)] %4     : f64[3,2]
  return %3, %5
}""", """\
graph scaled(%x: f64[3], %m: f64[2,3]) {
  %0 = test_passes_scale[c=3.0] %x : f64[3]
  %1 = reshape[shape=(3, 2)] %m    : f64[3,2]
  return %0, %1
}""", x, m)


def test_simplify_calls_the_rules_of_built_in_ops(rng, monkeypatch):
    mul_p = sd.graph.lookup_primitive("mul")
    seen = []
    rule = mul_p.simplify_rule

    def spy(node, producer):
        seen.append(node)
        return rule(node, producer)

    monkeypatch.setattr(mul_p, "simplify_rule", spy)
    x = rng.standard_normal(3)
    check_pass(passes.simplify, sd.trace(lambda x: snp.sin(x) * 1.0, x), """\
graph lambda(%x: f64[3]) {
  %0 = sin %x      : f64[3]
  %1 = mul %0, 1.0 : f64[3]
  return %1
}""", """\
graph lambda(%x: f64[3]) {
  %0 = sin %x : f64[3]
  return %0
}""", x)
    assert seen and all(n.primitive is mul_p for n in seen)
    # no rewrite of reshape is made but by its rule
    monkeypatch.setattr(reshape_p, "simplify_rule", lambda node, producer: None)
    m = rng.standard_normal((2, 3))
    text = """\
graph lambda(%m: f64[2,3]) {
  %0 = reshape[shape=(6,)] %m   : f64[6]
  %1 = reshape[shape=(2, 3)] %0 : f64[2,3]
  return %1
}"""
    check_pass(passes.simplify, sd.trace(lambda m: snp.reshape(snp.reshape(m, (6,)), (2, 3)), m),
               text, text, m)


def test_a_built_in_ops_simplify_rule_is_defined_once():
    with pytest.raises(RegistrationError, match="simplify rule is already defined"):
        sd.graph.lookup_primitive("mul").def_simplify(lambda node, producer: None)


# ---------------------------------------------------------------------------
# subgraphs and optimize


def body(a):
    s = snp.sin(a) + snp.sin(a)
    unused = snp.tanh(a)
    return (s * 1.0 + snp.cos(a) * 0.0,)


BODY_CALLED_TWICE = """\
graph twice(%x: f64[3]) {
  %0 = call[body=<body body>] %x : f64[3]
    graph body(%a: f64[3]) [consts=1, carry=0, xs=0] {
      %0 = sin %a      : f64[3]
      %1 = sin %a      : f64[3]
      %2 = add %0, %1  : f64[3]
      %3 = tanh %a     : f64[3]
      %4 = mul %2, 1.0 : f64[3]
      %5 = cos %a      : f64[3]
      %6 = mul %5, 0.0 : f64[3]
      %7 = add %4, %6  : f64[3]
      return %7
    }
  %1 = mul %0, 2.0               : f64[3]
  %2 = call[body=<body body>] %x : f64[3]
    graph body(%a: f64[3]) [consts=1, carry=0, xs=0] {
      %0 = sin %a      : f64[3]
      %1 = sin %a      : f64[3]
      %2 = add %0, %1  : f64[3]
      %3 = tanh %a     : f64[3]
      %4 = mul %2, 1.0 : f64[3]
      %5 = cos %a      : f64[3]
      %6 = mul %5, 0.0 : f64[3]
      %7 = add %4, %6  : f64[3]
      return %7
    }
  %3 = add %1, %2                : f64[3]
  return %3
}"""


@pytest.fixture
def called_twice(rng):
    x = rng.standard_normal(3)
    inner = sd.trace(body, x)

    def twice(x):
        return sd.call(inner, x)[0] * 2.0 + sd.call(inner, x)[0]

    return sd.trace(twice, x), x


def test_passes_recurse_into_subgraphs(called_twice):
    g, x = called_twice
    inner = g.nodes[0].params["body"]
    # one body, called twice: the two calls of the new body merge
    new = check_pass(passes.cse, g, BODY_CALLED_TWICE, """\
graph twice(%x: f64[3]) {
  %0 = call[body=<body body>] %x : f64[3]
    graph body(%a: f64[3]) [consts=1, carry=0, xs=0] {
      %0 = sin %a      : f64[3]
      %1 = add %0, %0  : f64[3]
      %2 = tanh %a     : f64[3]
      %3 = mul %1, 1.0 : f64[3]
      %4 = cos %a      : f64[3]
      %5 = mul %4, 0.0 : f64[3]
      %6 = add %3, %5  : f64[3]
      return %6
    }
  %1 = mul %0, 2.0               : f64[3]
  %2 = add %1, %0                : f64[3]
  return %2
}""", x)
    sub = new.nodes[0].params["body"]
    assert all(a is b for a, b in zip(sub.inputs, inner.inputs))
    assert sub.out_types == inner.out_types
    # the same new body is shared by both calls
    new = passes.dce(g)
    assert new.nodes[0].params["body"] is new.nodes[2].params["body"]
    assert new.nodes[0].params["body"].pretty(source=False) == """\
graph body(%a: f64[3]) [consts=1, carry=0, xs=0] {
  %0 = sin %a      : f64[3]
  %1 = sin %a      : f64[3]
  %2 = add %0, %1  : f64[3]
  %3 = mul %2, 1.0 : f64[3]
  %4 = cos %a      : f64[3]
  %5 = mul %4, 0.0 : f64[3]
  %6 = add %3, %5  : f64[3]
  return %6
}"""
    assert passes.dce(new).pretty(source=False) == new.pretty(source=False)
    np.testing.assert_allclose(sd.graph.evaluate(new, x)[0], sd.graph.evaluate(g, x)[0],
                               rtol=1e-12)


def test_optimize(called_twice):
    g, x = called_twice
    check_pass(passes.optimize, g, BODY_CALLED_TWICE, """\
graph twice(%x: f64[3]) {
  %0 = call[body=<body body>] %x : f64[3]
    graph body(%a: f64[3]) [consts=1, carry=0, xs=0] {
      %0 = sin %a      : f64[3]
      %1 = add %0, %0  : f64[3]
      %2 = cos %a      : f64[3]
      %3 = mul %2, 0.0 : f64[3]
      %4 = add %1, %3  : f64[3]
      return %4
    }
  %1 = mul %0, 2.0               : f64[3]
  %2 = add %1, %0                : f64[3]
  return %2
}""", x)


def test_optimize_chains_passes(rng):
    def f(x):
        one = snp.exp(np.float64(0.0))  # folds to 1.0, which simplify removes
        return snp.sin(x * one) + snp.sin(x)

    x = rng.standard_normal(3)
    g = sd.trace(f, x)
    check_pass(passes.optimize, g, g.pretty(source=False), """\
graph f(%x: f64[3]) {
  %0 = sin %x     : f64[3]
  %1 = add %0, %0 : f64[3]
  return %1
}""", x)


def test_cse_merges_large_constants_by_content_exactly():
    # two copies of one large constant merge; a copy differing in one entry
    # (away from the sampled ones) or in the sign of a zero does not
    big = np.linspace(0.0, 1.0, 10_001)
    other = big.copy()
    other[1234] += 1e-12
    signed = np.zeros(10_001)
    negzero = -signed

    def f(x):
        return (x * big, x * big.copy(), x * other, x * signed, x * negzero)

    g = passes.cse(sd.trace(f, np.ones(10_001)))
    muls = [n for n in g.nodes if n.primitive.name == "mul"]
    assert len(muls) == 4, g.pretty(source=False)
    x = np.random.default_rng(0).standard_normal(10_001)
    for got, want in zip(sd.graph.evaluate(g, x), f(x)):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_optimize_stops_when_a_round_changes_nothing():
    g = sd.trace(lambda x: snp.sin(x) * 1.0 + 0.0, np.ones(3))
    o = passes.optimize(g)
    assert [n.primitive.name for n in o.nodes] == ["sin"]
    assert passes.optimize(o).pretty() == o.pretty()


def test_simplify_pow_one_and_constant_select():
    x = np.array([np.inf, -2.0, np.nan, 0.0])

    def f(x, y):
        a = x ** 1.0
        b = snp.where(np.array(True), x, y)                # constant condition
        c = snp.where(np.zeros(4, bool), x, y)
        d = snp.where(np.array([True, False, True, False]), x, y)   # kept
        return a, b, c, d

    g = sd.trace(f, x, -x)
    s = passes.simplify(g)
    assert [n.primitive.name for n in s.nodes] == ["select"], s.pretty(source=False)
    assert s.outputs[:3] == (s.inputs[0], s.inputs[0], s.inputs[1])
    for got, want in zip(sd.graph.evaluate(s, x, -x), sd.graph.evaluate(g, x, -x)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # complex x ** 1 is left alone (computed through exp and log: not exact)
    z = np.array([1 + 2j])
    assert passes.simplify(sd.trace(lambda z: z ** (1.0 + 0j), z)).nodes


# ---------------------------------------------------------------------------
# share_factors: keyed on the `factored` trait, not on op names

lu_solve_p = Primitive("test_passes_lu_solve", params={}, factored=lambda params: Factored(
    linalg_factor_p, {"solver": "lu"}, linalg_backsolve_p, {"solver": "lu"}))
lu_solve_p.def_abstract_eval(lambda a, b: b)
lu_solve_p.def_impl(lambda a, b: jnp.linalg.solve(a, b))


def two_solves(a, b):
    return lu_solve_p(a, b) + sd.linalg.solve(a, 2.0 * b, solver="lu")


def test_share_factors_follows_the_factored_trait(rng):
    # a solve-like primitive declaring `factored` shares the factorization of
    # its matrix with the built-in solves
    a = rng.standard_normal((3, 3)) + 3 * np.eye(3)
    b = rng.standard_normal(3)
    check_pass(passes.share_factors, sd.trace(two_solves, a, b), """\
graph two_solves(%a: f64[3,3], %b: f64[3]) {
  %0 = test_passes_lu_solve %a, %b      : f64[3]
  %1 = mul 2.0, %b                      : f64[3]
  %2 = linalg.solve[solver='lu'] %a, %1 : f64[3]
  %3 = add %0, %2                       : f64[3]
  return %3
}""", """\
graph two_solves(%a: f64[3,3], %b: f64[3]) {
  %0 = linalg.factor[solver='lu'] %a            : factor<lu, f64>[3,3]
  %1 = linalg.backsolve[solver='lu'] %0, %a, %b : f64[3]
  %2 = mul 2.0, %b                              : f64[3]
  %3 = linalg.backsolve[solver='lu'] %0, %a, %2 : f64[3]
  %4 = add %1, %3                               : f64[3]
  return %4
}""", a, b)
