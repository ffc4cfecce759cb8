"""Second derivatives through `sd.to_jax`: JAX's reverse-over-reverse and
forward-over-reverse of the wrapped function agree with sciad's own, on every
primitive's registry example and on examples at the edges of each elementwise
op's domain (negative bases, zeros), where a derivative formed for a constant
(`log(x)` for the exponent of `x ** 2`) once turned into NaN.

Each walk compares, for a loss `sum(Re(w * out))` with fixed random weights
and random vectors `v`, `u` over the differentiated arguments:

- forward over reverse, `jax.jvp(jax.grad(loss), x, v)` with `sd.jvp(sd.grad(loss), x, v)`;
- reverse over reverse, `jax.vjp(jax.grad(loss), x)[1](u)` with `sd.vjp(sd.grad(loss), x)[1](u)`;

and requires every value to be finite. Each side is one compiled program.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from registry_examples import EXAMPLES, builtin_primitives, distinct_examples, marked_slow
from sciad.primitives._elementwise import BINARY, UNARY

BUILTINS = sorted(builtin_primitives())

# Primitives whose example has no float path from input to output, so there is
# nothing to differentiate: boolean and integer results, integer operands.
NO_FLOAT_PATH = {
    "isfinite", "logical_not", "invert",           # bool or integer results
    "eq", "ne", "lt", "le", "gt", "ge",             # comparisons: bool
    "logical_and", "logical_or",                    # bool operands and result
    "bitwise_and", "bitwise_or", "bitwise_xor",     # integer operands and result
}
# Diagnostics that refuse to be differentiated (`NotSupportedError`, pinned in
# tests/test_to_jax.py): condition estimates.
NOT_DIFFERENTIATED = {"linalg.rcond", "linalg.factor_rcond"}


def _f(*values):
    return np.array(values, dtype=np.float64)


def _pow_const(x):
    """Constant exponents, integer-valued and not, on negative bases and zeros."""
    return x ** 2, x ** 3, x ** 0.0, x ** 1, snp.power(x, np.int64(4)), snp.abs(x) ** 2.5


# Examples at the edges of each differentiable elementwise op's domain:
# `name: (fn, args, differentiated argument indices or None for all float ones)`.
# Every elementwise op not in NO_FLOAT_PATH needs one (a test checks).
_U = _f(-2.0, -0.5, 0.0, 0.5, 2.0)  # negatives and a zero
_EDGE_ARGS = {"log": _f(1e-3, 0.1, 0.5, 1.0, 10.0), "sqrt": _f(1e-4, 0.1, 0.5, 1.0, 4.0),
              "log1p": _f(-0.9, -0.5, 0.0, 0.5, 2.0), "arcsin": _f(-0.99, -0.5, 0.0, 0.5, 0.99),
              "arccos": _f(-0.99, -0.5, 0.0, 0.5, 0.99), "tan": _f(-1.2, -0.5, 0.0, 0.5, 1.2)}


def _unary_edge(name):
    prim = sd.primitives.unary_primitives[name]
    return (lambda x: prim.bind(x)), (_EDGE_ARGS.get(name, _U),), None


def _binary_edge(name, x, y, diff=None):
    prim = sd.primitives.binary_primitives[name]
    return (lambda x, y: prim.bind(x, y)), (x, y), diff


_X, _Y = _f(-2.0, -0.5, 0.0, 1.5, 3.0), _f(-1.0, 2.5, -3.0, 0.0, 0.5)
_NONZERO = _f(-2.0, -0.5, 0.75, 1.0, 3.0)
EDGES = {name: _unary_edge(name) for name in UNARY if name not in NO_FLOAT_PATH}
EDGES.update({
    "add": _binary_edge("add", _X, _Y),
    "sub": _binary_edge("sub", _X, _Y),
    "mul": _binary_edge("mul", _X, _Y),
    "div": _binary_edge("div", _X, _NONZERO),
    "maximum": _binary_edge("maximum", _X, _f(-2.0, 1.0, 0.0, -1.0, 3.0)),  # with ties
    "minimum": _binary_edge("minimum", _X, _f(-2.0, 1.0, 0.0, -1.0, 3.0)),
    "arctan2": _binary_edge("arctan2", _X, _f(-1.0, -2.0, 1.0, 0.0, -0.5)),  # every quadrant
    "remainder": _binary_edge("remainder", _f(-3.5, -1.2, 0.0, 1.3, 4.1),
                              _f(2.0, -1.5, 1.1, -2.0, 3.0)),
    "floor_divide": _binary_edge("floor_divide", _f(-3.5, -1.2, 0.0, 1.3, 4.1),
                                 _f(2.0, -1.5, 1.1, -2.0, 3.0)),
    # both operands differentiated: positive bases (the exponent's derivative
    # is log(x) x^y), exponents zero and negative
    "pow": _binary_edge("pow", _f(0.3, 0.5, 1.0, 2.0, 3.0), _f(0.0, -1.0, 2.0, 0.5, -2.5)),
    # the exponent an argument that is not differentiated, the base negative or zero
    "pow (exponent held fixed)": _binary_edge("pow", _X, _f(2.0, 3.0, 0.0, 1.0, 2.0), (0,)),
    "pow (constant exponents)": (_pow_const, (_X,), None),
    "pow (integer exponents)": (lambda x, n: x ** n, (_X, np.array([2, 3, 0, 1, 4])), None),
})


def _is_float(x) -> bool:
    return np.asarray(x).dtype.kind in "fc"


def _random_like(rng, a):
    v = rng.standard_normal(np.shape(a))
    if np.asarray(a).dtype.kind == "c":
        v = v + 1j * rng.standard_normal(np.shape(a))
    return v.astype(np.asarray(a).dtype)


def _grouped(examples: dict):
    """One example running all of `examples` on their concatenated arguments
    (one compiled program per side instead of one per example): `(fn, args,
    diff, owner)` with `owner[i]` the example argument `i` came from."""
    fns, args, diff, owner, slices = [], [], [], [], []
    for name, (fn, a, d) in examples.items():
        start = len(args)
        slices.append(slice(start, start + len(a)))
        fns.append(fn)
        args.extend(a)
        owner.extend([name] * len(a))
        diff.extend(start + i for i in (d if d is not None else range(len(a)))
                    if _is_float(a[i]))
    return ((lambda *xs: tuple(f(*xs[sl]) for f, sl in zip(fns, slices))), tuple(args),
            tuple(diff), owner)


def _second_derivatives(fn, args, diff, F, rng):
    """`(forward over reverse, reverse over reverse)` of the weighted loss of
    `fn` with respect to the arguments `diff`, from sciad (`sd.function` of
    its own transforms) and from JAX's transforms of `F = sd.to_jax(fn)`."""
    out = F(*args)
    weights = [rng.standard_normal(np.shape(o)) if _is_float(o) else None
               for o in jax.tree_util.tree_leaves(out)]
    v = tuple(_random_like(rng, args[i]) for i in diff)
    u = tuple(_random_like(rng, args[i]) for i in diff)

    def second(f, xp, grad, jvp, vjp):
        def loss(*a):
            total = 0.0
            for leaf, w in zip(jax.tree_util.tree_leaves(f(*a)), weights):
                if w is not None:
                    total = total + xp.sum(xp.real(leaf * w))
            return total

        def run(*a):
            def gradient(*d):
                def partial(*d):
                    full = list(a)
                    for i, x in zip(diff, d):
                        full[i] = x
                    return loss(*full)
                return grad(partial, argnums=tuple(range(len(diff))))(*d)

            d0 = tuple(a[i] for i in diff)
            _, forward_over_reverse = jvp(gradient, d0, v)
            _, pullback = vjp(gradient, *d0)
            return forward_over_reverse, pullback(u)
        return run

    want = sd.function(second(fn, snp, sd.grad, sd.jvp, sd.vjp))(*args)
    got = jax.jit(second(F, jnp, jax.grad, jax.jvp, jax.vjp))(*args)
    return want, got


def _check(fn, args, diff, rng, owner=None, rtol=1e-9):
    args = tuple(np.asarray(a) for a in args)
    with jax.enable_x64(True):
        want, got = _second_derivatives(fn, args, diff, sd.to_jax(fn), rng)
    for mode, w_all, g_all in zip(("forward over reverse", "reverse over reverse"),
                                  want, got):
        for i, w, g in zip(diff, w_all, g_all):
            where = f"{mode}, argument {i}" + (f" of {owner[i]!r}" if owner else "")
            w, g = np.asarray(w), np.asarray(g)
            assert np.all(np.isfinite(w)), f"sciad's own {where}: {w}"
            assert np.all(np.isfinite(g)), f"through sd.to_jax, {where}: {g}"
            np.testing.assert_allclose(g, w, rtol=rtol, equal_nan=False,
                                       atol=rtol * max(1.0, float(np.max(np.abs(w)))),
                                       err_msg=where)


# ---------------------------------------------------------------------------
# The registry walk


def _walked(names):
    return [n for n in names if n not in NO_FLOAT_PATH | NOT_DIFFERENTIATED]


_DISTINCT = _walked(sorted(distinct_examples(BUILTINS)))
# the elementwise ops together (one program per side), and one by one the
# representatives the default run checks
_REPRESENTATIVES = ["add", "sin", "select", "convert"]
_GROUPS = {"unary elementwise": [n for n in _DISTINCT if n in UNARY],
           "binary elementwise": [n for n in _DISTINCT if n in BINARY],
           **{n: [n] for n in _DISTINCT if n not in UNARY and n not in BINARY},
           **{n: [n] for n in _REPRESENTATIVES}}

# The default run walks a few cheap representatives (elementwise, a
# reduction, a contraction, indexing, the FFT; the solve and eigvalsh
# cases are tested below); the rest are slow. (By default, the first-order
# walk of tests/test_to_jax.py and check_rules' second order in
# tests/test_autodiff.py cover them.)
_DEFAULT = set(_REPRESENTATIVES) | {"reduce_sum", "matmul", "getitem", "fft"}


def test_every_primitive_has_a_second_order_example():
    missing = sorted(set(BUILTINS) - set(EXAMPLES))
    assert not missing, f"add examples to tests/registry_examples.py for: {missing}"
    walked = {n for names in _GROUPS.values() for n in names}
    # (a primitive sharing its example with another is walked with that one)
    covered = {n for n in BUILTINS if any(EXAMPLES[n] is EXAMPLES[m] for m in walked)}
    left = set(BUILTINS) - covered - NO_FLOAT_PATH - NOT_DIFFERENTIATED
    assert not left, f"walk these too: {sorted(left)}"
    assert not (NO_FLOAT_PATH | NOT_DIFFERENTIATED) - set(BUILTINS), "stale exclusions"


@pytest.mark.parametrize("name", sorted(NO_FLOAT_PATH))
def test_excluded_primitives_have_no_float_path(name):
    fn, args = EXAMPLES[name]
    graph = sd.trace(fn, *args)
    diff = sd.graph.is_differentiable
    assert not (any(diff(v.type) for v in graph.inputs)
                and any(diff(v.type) for v in graph.outputs)), (
        f"{name} can be differentiated: take it out of NO_FLOAT_PATH")


@pytest.mark.slow  # (tests/test_to_jax.py pins it by default)
@pytest.mark.parametrize("name", sorted(NOT_DIFFERENTIATED))
def test_not_differentiated_primitives_refuse(name):
    fn, args = EXAMPLES[name]
    args = [np.asarray(a) for a in args]
    with jax.enable_x64(True), pytest.raises(sd.errors.NotSupportedError,
                                             match="not differentiated"):
        jax.grad(lambda *a: jnp.sum(jnp.asarray(jax.tree_util.tree_leaves(
            sd.to_jax(fn)(*a))[0])))(*args)


@pytest.mark.parametrize("group", marked_slow(sorted(_GROUPS), set(_GROUPS) - _DEFAULT))
def test_second_order_through_to_jax_of_every_primitive(group, rng):
    names = _GROUPS[group]
    fn, args, diff, owner = _grouped({n: (*EXAMPLES[n], None) for n in names})
    _check(fn, args, diff, rng, owner)


def test_every_elementwise_op_has_an_edge_example():
    ops = {name.split(" ")[0] for name in EDGES}
    missing = sorted((set(UNARY) | set(BINARY)) - NO_FLOAT_PATH - ops)
    assert not missing, f"add examples at the edges of their domains to EDGES: {missing}"


# `pow`'s edges (the NaN of the issue) by default; the others slow
_EDGE_GROUPS = {"pow": [n for n in EDGES if n.startswith("pow")],
                "unary": [n for n in EDGES if n in UNARY],
                "binary": [n for n in EDGES if n in BINARY and n != "pow"]}


@pytest.mark.parametrize("group", marked_slow(sorted(_EDGE_GROUPS), {"unary", "binary"}))
def test_second_order_through_to_jax_at_domain_edges(group, rng):
    fn, args, diff, owner = _grouped({n: EDGES[n] for n in _EDGE_GROUPS[group]})
    _check(fn, args, diff, rng, owner)


# ---------------------------------------------------------------------------
# The cases of the issue, against closed forms


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def test_hessian_of_a_square_at_a_negative_base(x64):
    x = np.array([-1.0, 2.0])
    f = sd.to_jax(lambda p: snp.sum(p ** 2))
    want = 2.0 * np.eye(2)
    np.testing.assert_array_equal(jax.jacrev(jax.grad(f))(x), want)
    np.testing.assert_array_equal(jax.jacfwd(jax.grad(f))(x), want)
    np.testing.assert_array_equal(sd.jacrev(sd.grad(lambda p: snp.sum(p ** 2)))(x), want)


def test_hessian_with_an_exponent_held_fixed(x64):
    # the exponent is an argument JAX does not differentiate: a constant
    x, c = np.array([-1.5, 0.0, 2.0]), 3.0
    f = sd.to_jax(lambda p, c: snp.sum(p ** c))
    want = np.diag(c * (c - 1) * x ** (c - 2))
    np.testing.assert_allclose(jax.jacrev(jax.grad(f))(x, c), want, rtol=1e-14)
    np.testing.assert_allclose(jax.jacfwd(jax.jacfwd(f))(x, c), want, rtol=1e-14)


def test_hessian_with_integer_exponents(x64):
    x, n = np.array([-1.5, 0.0, 2.0]), np.array([3, 2, 4])
    f = sd.to_jax(lambda p, n: snp.sum(p ** n))
    want = np.diag(n * (n - 1) * x ** (n - 2))
    np.testing.assert_allclose(jax.jacrev(jax.grad(f))(x, n), want, rtol=1e-14)


def test_power_zero_at_zero_has_zero_second_derivative(x64):
    # d/dx x^0 = 0: the rule's x^(y-1) is infinite at x = 0 and must not meet a zero
    x = np.array([0.0, 1.0, -2.0])
    f = sd.to_jax(lambda p: snp.sum(p ** 0.0))
    np.testing.assert_array_equal(jax.jacrev(jax.grad(f))(x), np.zeros((3, 3)))
    np.testing.assert_array_equal(
        sd.jacrev(sd.grad(lambda p: snp.sum(p ** 0.0)))(x), np.zeros((3, 3)))


def _graphs(gfn, seen=None):
    """Every graph `sd.to_jax` built for a function: its own and, recursively,
    those of the derivative graphs JAX's transforms asked for."""
    seen = set() if seen is None else seen
    if id(gfn) in seen:
        return []
    seen.add(id(gfn))
    out = [gfn.graph]
    for entry in list(gfn._vjp.values()) + list(gfn._tangent.values()):
        for part in entry:
            if hasattr(part, "graph"):
                out += _graphs(part, seen)
    return out


def _ops(graph):
    return {n.primitive.name for n in graph.nodes}


def test_no_log_of_the_base_in_any_derivative_program(x64):
    x = np.array([-1.5, 0.5, 2.0])

    def f(p, c):
        return snp.sum(p ** 3) + snp.sum(p ** c) + snp.sum(p ** np.array([2, 3, 4]))

    # sciad's own transforms, second order in both orders
    own = sd.trace(lambda p, c: (sd.jacrev(sd.grad(f))(p, c),
                                 sd.hvp(lambda p: f(p, c), p, p)), x, 2.0)
    assert "log" not in _ops(own), own
    # the graphs sd.to_jax builds for JAX's second derivatives
    F = sd.to_jax(f)
    jax.jacrev(jax.grad(F))(x, 2.0)
    jax.jacfwd(jax.jacfwd(F))(x, 2.0)
    (gfn, _), = F._cache.values()
    graphs = _graphs(gfn)
    assert len(graphs) > 4
    for g in graphs:
        assert "log" not in _ops(g), g
    # differentiating the exponent does form it
    jax.grad(F, argnums=1)(x, 2.0)
    assert any("log" in _ops(g) for g in _graphs(gfn))


def test_gradient_norm_through_a_solve(x64, rng):
    a = rng.standard_normal((3, 3)) + 4.0 * np.eye(3)
    b = rng.standard_normal(3)
    F = sd.to_jax(lambda a, b: snp.sum(sd.linalg.solve(a, b) ** 2))

    def norm(a):
        return jnp.sum(jax.grad(F)(a, b) ** 2)

    def norm_sd(a):
        return snp.sum(sd.grad(lambda a: snp.sum(sd.linalg.solve(a, b) ** 2))(a) ** 2)

    got = jax.jit(jax.grad(norm))(a)
    np.testing.assert_allclose(got, sd.grad(norm_sd)(a), rtol=1e-10)
    # and a central difference along one direction
    d, h = rng.standard_normal((3, 3)), 1e-5
    norm2 = jax.jit(lambda a: jnp.stack([norm(a + h * d), norm(a - h * d)]))
    fd = np.diff(norm2(a)[::-1])[0] / (2 * h)
    np.testing.assert_allclose(np.sum(got * d), fd, rtol=1e-6)


def test_gradient_norm_through_eigvalsh(x64, rng):
    s = rng.standard_normal((3, 3))
    s = s + s.T
    assert np.linalg.eigvalsh(s).min() < 0  # negative eigenvalues, squared

    G = sd.to_jax(lambda a: snp.sum(sd.linalg.eigvalsh(a) ** 2))

    def norm(a):
        return jnp.sum(jax.grad(G)(a) ** 2)

    def norm_sd(a):
        return snp.sum(sd.grad(lambda a: snp.sum(sd.linalg.eigvalsh(a) ** 2))(a) ** 2)

    got = jax.jit(jax.grad(norm))(s)
    np.testing.assert_allclose(got, sd.grad(norm_sd)(s), rtol=1e-10)
    # closed form: sum(eigvalsh(a)^2) = |a|_F^2 for symmetric a, gradient 2a,
    # so the gradient norm is 4|a|_F^2 with gradient 8a
    np.testing.assert_allclose(got, 8.0 * s, rtol=1e-10)


def test_second_order_through_a_loop_and_a_branch_with_an_exponent_held_fixed(x64):
    # sciad's own transforms too: the loop's and the branch's reverse passes
    # had formed the cotangent of `c` (log(u) u^c) as a dead output that the
    # second derivative then multiplied by zero
    x, c = np.array([-1.5, 0.5, 2.0]), 2.0

    def f(p, c):
        u, ys = sd.scan(lambda u, _: (0.5 * u + u ** c, snp.sum(u ** 3)), p, None, length=2)
        v = sd.cond(snp.sum(p) > 0, lambda p: p ** c, lambda p: p ** 3, p)
        return snp.sum(u) + snp.sum(ys) + snp.sum(v)

    def f_jax(p, c):
        u, ys = jax.lax.scan(lambda u, _: (0.5 * u + u ** c, jnp.sum(u ** 3)), p, None,
                             length=2)
        v = jax.lax.cond(jnp.sum(p) > 0, lambda p: p ** c, lambda p: p ** 3, p)
        return jnp.sum(u) + jnp.sum(ys) + jnp.sum(v)

    # reverse over reverse: u H, against JAX's own AD of the same program
    u = np.array([0.3, -1.0, 2.0])
    want = jax.vjp(jax.grad(f_jax), x, c)[1](u)[0]
    assert np.all(np.isfinite(want))
    own = sd.function(lambda x, c: sd.vjp(sd.grad(f), x, c)[1](u)[0])(x, c)
    np.testing.assert_allclose(own, want, rtol=1e-12)
    F = sd.to_jax(f)
    np.testing.assert_allclose(jax.vjp(jax.grad(F), x, c)[1](u)[0], want, rtol=1e-12)
    # held fixed by the inner gradient, `c` still moves it: the mixed derivative
    xp = np.abs(x)
    mixed = sd.grad(lambda c: snp.sum(sd.grad(f)(xp, c) * u))(c)
    np.testing.assert_allclose(mixed, jax.grad(lambda c: jnp.sum(jax.grad(f_jax)(xp, c) * u))(c),
                               rtol=1e-12)
