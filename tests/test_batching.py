"""`sd.vmap`: batch rules on the primitives, against a loop over examples and
against `jax.vmap` of the same JAX code; the transform's pytree axes, its
composition with derivatives, and the sequential fallback."""

from __future__ import annotations

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

import sciad as sd
import sciad.numpy as snp
from registry_examples import EXAMPLES, builtin_primitives, elementwise_representatives
from sciad.errors import ConvergenceError, NonFiniteError, ShapeError, SingularMatrixError
from sciad.errors import BatchFallbackWarning

_ids = itertools.count()
BUILTINS = sorted(builtin_primitives())
BATCHED = [n for n in BUILTINS if sd.graph.lookup_primitive(n).batch_rule is not None]

# Built-in primitives still without a batch rule (they batch as a sequential
# map, with a warning). The list must match the registry exactly: a rule
# added removes its name here, and a new primitive must come with a rule.
PENDING = {
    # no operands: never batched
    "arange", "eye", "full", "linspace", "zeros", "linalg.rademacher",
}


def test_batch_rule_coverage_is_as_listed():
    missing = {n for n in BUILTINS if sd.graph.lookup_primitive(n).batch_rule is None}
    assert missing == PENDING, (
        f"with no batch rule but not listed: {sorted(missing - PENDING)}; listed but "
        f"with a rule now: {sorted(PENDING - missing)}")


def _batch_of(args, rng, size=3):
    """`size` examples around each argument: float arrays perturbed by 1%,
    others repeated."""
    out = []
    for a in args:
        a = np.asarray(a)
        if a.dtype.kind in "fc":
            out.append(np.stack([a * (1 + 0.01 * rng.standard_normal(a.shape))
                                 for _ in range(size)]))
        else:
            out.append(np.stack([a] * size))
    return out


#: examples whose batched and single programs may round apart by more than
#: 1e-12: a BDF solve at rtol 1e-12 whose 2 x 2 Newton matrices are
#: factored by scalar expressions (`_small_lu`), which XLA fuses (and
#: contracts to multiply-adds) otherwise in the vectorized program; its step
#: control turns that into 1e-11 (each within the solve's tolerance)
ROUNDING = {"ode.bdf_adjoint": 1e-10}


@pytest.mark.parametrize("name", elementwise_representatives(BATCHED))
def test_batch_rule_agrees_with_a_loop(name, rng):
    fn, args = EXAMPLES[name]
    batch = _batch_of(args, rng)
    one = sd.function(fn)
    want = [one(*[b[k] for b in batch]) for k in range(3)]
    want = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *want)
    variants = [0] + ([(0,) + (None,) * (len(args) - 1)] if len(args) > 1 else [])
    for in_axes in variants:
        ins = batch if in_axes == 0 else [batch[0]] + [np.asarray(a) for a in args[1:]]
        if in_axes != 0:
            w = [one(batch[0][k], *args[1:]) for k in range(3)]
            w = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *w)
        else:
            w = want
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", BatchFallbackWarning)
            graph = sd.trace(sd.vmap(fn, in_axes=in_axes), *ins)
        assert not [c for c in caught if f"'{name}'" in str(c.message)], \
            f"{name} fell back to a sequential map:\n{graph}"
        got = sd.graph.evaluate(graph, *ins)
        got = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(w), got)
        jax.tree_util.tree_map(
            lambda g, e: np.testing.assert_allclose(g, e, rtol=ROUNDING.get(name, 1e-12),
                                                    atol=1e-12), got, w)


def _model(xp):
    def f(a, idx, b):
        return (xp.take(a, idx, axis=1),
                xp.sum(xp.sin(a) @ b, axis=0) + xp.einsum("ij,jk->k", a, b) + a[0] @ b[:, 0]
                + (a[:, 0] @ a)[:2],
                a.at[:, idx].add(1.0), xp.sort(a, axis=0), xp.cumsum(a.T, axis=1),
                a[1:, ::-1].reshape(-1), xp.pad(a, ((1, 0), (0, 2))),
                xp.fft.rfft(a, axis=0), xp.where(a > 0, a, b[:3, :1]))
    return f


@pytest.mark.parametrize("in_axes, out_axes", [((0, 0, None), 0), ((2, None, 1), 1)])
def test_vmap_matches_jax_vmap(rng, in_axes, out_axes):
    x, i, y = rng.standard_normal((5, 3, 4)), rng.integers(0, 4, (5, 2)), \
        rng.standard_normal((4, 2))
    if in_axes[0] == 2:
        x, i, y = np.moveaxis(x, 0, 2), i[0], np.stack([y] * 5, 1)
    got = sd.vmap(_model(snp), in_axes=in_axes, out_axes=out_axes)(x, i, y)
    with sd.config.x64_scope():
        want = jax.vmap(_model(jnp), in_axes=in_axes, out_axes=out_axes)(x, i, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-13)


def test_vmap_composes_with_derivatives(rng):
    x, w = rng.standard_normal((4, 6)), rng.standard_normal(6)

    def loss(x, w, xp=snp):
        return xp.sum(xp.tanh(x * w) ** 2) + xp.max(xp.cumsum(x))

    per_example = sd.vmap(sd.grad(loss, argnums=1), in_axes=(0, None))(x, w)
    grad_of_batch = sd.grad(lambda w: snp.sum(sd.vmap(loss, in_axes=(0, None))(x, w)))(w)
    with sd.config.x64_scope():
        jl = lambda x, w: loss(x, w, jnp)  # noqa: E731
        want = jax.vmap(jax.grad(jl, argnums=1), in_axes=(0, None))(x, w)
    np.testing.assert_allclose(per_example, want, rtol=1e-13)
    np.testing.assert_allclose(grad_of_batch, want.sum(0), rtol=1e-12)
    hv = sd.vmap(lambda v: sd.hvp(lambda w: loss(x[0], w), w, v))(np.eye(6))
    with sd.config.x64_scope():
        hj = jax.hessian(lambda w: jl(x[0], w))(w)
    np.testing.assert_allclose(hv, hj, rtol=1e-11, atol=1e-12)


def test_vmap_pytrees_and_nesting(rng):
    tree = {"a": rng.standard_normal((3, 2)), "b": (rng.standard_normal(3), 2.0)}
    f = sd.vmap(lambda t: {"s": t["a"].sum() * t["b"][0] + t["b"][1]},
                in_axes=({"a": 0, "b": (0, None)},))
    np.testing.assert_allclose(f(tree)["s"], tree["a"].sum(1) * tree["b"][0] + 2.0)
    m = rng.standard_normal((2, 3, 4))
    nested = sd.vmap(sd.vmap(lambda r: snp.sum(r ** 2)))(m)
    np.testing.assert_allclose(nested, (m ** 2).sum(-1), rtol=1e-14)
    unmapped_out = sd.vmap(lambda x, c: (x * 2, c + 1.0), in_axes=(0, None),
                           out_axes=(0, None))(m[0], np.ones(4))
    np.testing.assert_allclose(unmapped_out[1], 2.0)


def test_vmap_errors():
    with pytest.raises(ShapeError, match="different sizes"):
        sd.vmap(lambda a, b: a + b)(np.ones(3), np.ones(4))
    with pytest.raises(ShapeError, match="in_axes"):
        sd.vmap(lambda a: a, in_axes=(0, 0))(np.ones(3))
    with pytest.raises(ShapeError, match="at least one mapped"):
        sd.vmap(lambda a: a, in_axes=None)(np.ones(3))
    with pytest.raises(ShapeError, match="out_axes=None"):
        sd.vmap(lambda a: a * 2, out_axes=None)(np.ones(3))


def _node_count(graph) -> int:
    """The nodes of `graph` and of every body its nodes hold."""
    return sum(1 + sum(_node_count(v) for v in n.params.values()
                       if isinstance(v, sd.graph.Graph)) for n in graph.nodes)


def test_user_primitive_without_a_rule_maps_as_one_node_with_one_warning(rng):
    p = sd.primitive("test_batching.cube")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x ** 3)
    x = rng.standard_normal((4, 3))
    with pytest.warns(BatchFallbackWarning, match="test_batching.cube"):
        out = sd.vmap(lambda v: p.bind(v) + 1.0)(x)
    np.testing.assert_allclose(out, x ** 3 + 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchFallbackWarning)
        sd.vmap(lambda v: p.bind(v) * 2.0)(x)  # warned once per primitive


def _cube_sin():
    """A user primitive with an implementation, a shape rule and a JVP, and
    no batch rule: `x**3 + sin(x)`."""
    p = sd.primitive(f"test_batching.cube_sin_{next(_ids)}")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x ** 3 + jnp.sin(x))

    @p.def_jvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return p.bind(x), (3 * x ** 2 + snp.cos(x)) * t
    return p


@pytest.mark.filterwarnings("ignore::sciad.errors.BatchFallbackWarning")
def test_a_primitive_without_a_batch_rule_is_one_map_node_whatever_the_batch(rng):
    # (a node per example before: 4.7 s to a first call at B = 100, 50 s at B = 1000)
    p = _cube_sin()

    def f(v):
        return snp.sum(p.bind(v) * v)

    def df(x):  # d/dx sum((x^3 + sin x) x) = (3x^2 + cos x) x + x^3 + sin x
        return (3 * x ** 2 + np.cos(x)) * x + x ** 3 + np.sin(x)

    variants = {"vmap": sd.vmap(f), "vmap of grad": sd.vmap(sd.grad(f)),
                "grad of vmap": sd.grad(lambda x: snp.sum(sd.vmap(f)(x)))}
    x = rng.standard_normal((1000, 3))
    for name, g in variants.items():
        small, big = sd.trace(g, x[:2]), sd.trace(g, x)
        assert _node_count(big) == _node_count(small), f"{name} grows with the batch:\n{big}"
        assert any(n.primitive.name == "map" for n in big.nodes), name
    want = {"vmap": ((x ** 3 + np.sin(x)) * x).sum(1), "vmap of grad": df(x),
            "grad of vmap": df(x)}
    for name, g in variants.items():
        np.testing.assert_allclose(g(x), want[name], rtol=1e-13, err_msg=name)


def test_primitive_from_jax_batches_as_one_jax_vmap_node(rng):
    def fn(x, a):
        return jnp.cumsum(jnp.sin(x) * a)

    p = sd.primitive_from_jax(fn, f"test_batching.cumsin_{next(_ids)}")
    x, a = rng.standard_normal((3, 50)), 1.3

    def loss(x, a):
        return snp.sum(p(x, a) ** 2)

    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchFallbackWarning)
        graph = sd.trace(sd.vmap(p, in_axes=(0, None)), x.T, a)
        assert [n.primitive.name for n in graph.nodes] == [f"{p.name}.vmap[0]"], graph
        got = [sd.vmap(p, in_axes=(1, None))(x, a),
               *sd.vmap(sd.grad(loss, argnums=(0, 1)), in_axes=(1, None))(x, a),
               *sd.grad(lambda x, a: snp.sum(sd.vmap(loss, in_axes=(1, None))(x, a)),
                        argnums=(0, 1))(x, a)]
    with sd.config.x64_scope():
        jl = lambda x, a: jnp.sum(fn(x, a) ** 2)  # noqa: E731
        want = [jax.vmap(fn, in_axes=(1, None))(x, a),
                *jax.vmap(jax.grad(jl, argnums=(0, 1)), in_axes=(1, None))(x, a),
                *jax.grad(lambda x, a: jnp.sum(jax.vmap(jl, in_axes=(1, None))(x, a)),
                          argnums=(0, 1))(x, a)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def _loops(xp, lax):
    """Loops and branches written once for sciad and for JAX: a scan whose
    carry becomes batched only through a batched const, a while loop whose
    examples stop at different steps, and a cond on a per-example and on a
    shared predicate."""
    def f(x, w):
        def step(c, xi):
            c = xp.sin(c) * w + xi
            return c, c ** 2
        c, ys = lax.scan(step, 0.5, x)
        n, k = lax.while_loop(lambda s: s[1] < xp.sum(x ** 2) * 3,
                              lambda s: (s[0] * 1.1 + x, s[1] + 1.0), (x, 0.0))
        b = lax.cond(c > 0, lambda v: xp.sin(v) * 2, lambda v: v ** 2, x)
        s = lax.cond(True, lambda v: v * w, lambda v: v, x)
        return c + xp.sum(ys) + xp.sum(n) + k + xp.sum(b * s)
    return f


class _SdLax:
    scan = staticmethod(sd.scan)
    cond = staticmethod(sd.cond)

    @staticmethod
    def while_loop(c, b, init):
        return sd.while_loop(c, b, init, max_steps=64)


class _JaxLax:
    """`lax` with a while loop JAX can differentiate: 64 steps of `cond(pred,
    body, identity)`, the bounded form."""
    scan = staticmethod(jax.lax.scan)
    cond = staticmethod(jax.lax.cond)

    @staticmethod
    def while_loop(c, b, init):
        return jax.lax.fori_loop(0, 64, lambda i, s: jax.lax.cond(c(s), b, lambda s: s, s),
                                 init)


@pytest.mark.parametrize("in_axes", [(0, None), pytest.param((None, 0), marks=pytest.mark.slow),
                                     pytest.param((0, 0), marks=pytest.mark.slow)])
def test_loops_and_branches_batch_like_jax_vmap(rng, in_axes):
    xs, ws = rng.standard_normal((4, 5)), rng.standard_normal(4)
    x = xs if in_axes[0] == 0 else xs[0]
    w = ws if in_axes[1] == 0 else ws[0]
    f = _loops(snp, _SdLax)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BatchFallbackWarning)
        got = sd.vmap(f, in_axes=in_axes)(x, w)
        g_per = sd.vmap(sd.grad(f, argnums=(0, 1)), in_axes=in_axes)(x, w)
        g_sum = sd.grad(lambda x, w: snp.sum(sd.vmap(f, in_axes=in_axes)(x, w)),
                        argnums=(0, 1))(x, w)
    with sd.config.x64_scope():
        jf = _loops(jnp, _JaxLax)
        want = jax.vmap(jf, in_axes=in_axes)(x, w)
        jg = jax.vmap(jax.grad(jf, argnums=(0, 1)), in_axes=in_axes)(x, w)
        jsum = jax.grad(lambda x, w: jnp.sum(jax.vmap(jf, in_axes=in_axes)(x, w)),
                        argnums=(0, 1))(x, w)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for g, e in zip(g_per + g_sum, jg + jsum):
        np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-12)


def test_batched_while_stops_each_example_where_it_would_alone(rng):
    # per-example stopping: the step counts differ, each matches a loop of one
    x = np.array([0.1, 1.0, 3.0])
    f = sd.function(sd.vmap(lambda v: sd.while_loop(lambda s: s[0] < 10.0,
                                                     lambda s: (s[0] * 2.0, s[1] + 1),
                                                     (v, 0), max_steps=8)))
    vals, steps = f(x)
    np.testing.assert_array_equal(steps, [7, 4, 2])
    np.testing.assert_allclose(vals, x * 2.0 ** steps)
    with pytest.raises(sd.errors.ConvergenceError, match="max_steps=8"):
        f(np.array([1.0, 1e-6]))


def test_batched_checkpointed_scan_keeps_its_schedule(rng):
    x, w = rng.standard_normal((3, 12)), 0.9

    def f(x, w):
        c, _ = sd.scan(lambda c, xi: (snp.sin(c) * w + xi, None), 0.0, x, checkpoints=2)
        return c

    graph = sd.trace(sd.vmap(sd.grad(f, argnums=1), in_axes=(0, None)), x, w)
    text = str(graph)
    assert text.count("scan_adjoint") == 1 and "binomial(2)" in text
    loop = [sd.grad(f, argnums=1)(xi, w) for xi in x]
    np.testing.assert_allclose(sd.graph.evaluate(graph, x, w)[0], loop, rtol=1e-13)


# -- linear algebra ---------------------------------------------------------------

_N = 12


def _pattern():
    i = np.arange(_N)
    rows = np.concatenate([i, i[1:], i[:-1], [0]])
    cols = np.concatenate([i, i[:-1], i[1:], [_N - 1]])
    return rows, cols


def _stiffness(k):
    """A sparse matrix on one pattern whose values depend on `k` (n,)."""
    r, c = _pattern()
    vals = snp.where(r == c, 4.0 + k[r], -0.5 - 0.1 * (k[r] + k[c]))
    return sd.sparse.coo_matrix((vals, (r, c)), shape=(_N, _N))


def _dense_stiffness(k, xp):
    r, c = _pattern()
    vals = xp.where(r == c, 4.0 + k[r], -0.5 - 0.1 * (k[r] + k[c]))
    return xp.zeros((_N, _N)).at[r, c].add(vals)


def _loss(k, b, solver="splu"):
    return snp.sum(sd.linalg.solve(_stiffness(k), b, solver=solver) ** 2)


def _ops(graph, name):
    """The nodes of `name`, a `map` of one `name` node counted as one."""
    out = []
    for n in graph.nodes:
        inner = n.params["body"].nodes if n.primitive.name == "map" else ()
        if n.primitive.name == name or (len(inner) == 1 and inner[0].primitive.name == name):
            out.append(n)
    return out


@pytest.mark.parametrize("cols", [None, 2])
def test_right_hand_sides_against_one_matrix_are_one_factorization(rng, cols):
    k = rng.uniform(0.5, 1.5, _N)
    B = rng.standard_normal((5, _N) if cols is None else (5, _N, cols))

    def total(k, B):
        return snp.sum(sd.vmap(lambda b: _loss(k, b))(B))

    graph = sd.graph.passes.optimize(sd.trace(sd.grad(total), k, B))
    assert len(_ops(graph, "linalg.factor")) == 1 and not _ops(graph, "map")
    (x_shape, *_) = [n.outputs[0].type.shape for n in _ops(graph, "linalg.backsolve")]
    assert x_shape == ((_N, 5) if cols is None else (_N, 5 * cols))
    loop = sum(sd.grad(_loss)(k, b) for b in B)
    np.testing.assert_allclose(sd.graph.evaluate(graph, k, B)[0], loop, rtol=1e-12)


@pytest.mark.parametrize("solver", ["splu", "klu", "lu", "cg"])
def test_batch_of_matrices_on_one_pattern_shares_factors_with_its_adjoint(rng, solver):
    K, B = rng.uniform(0.5, 1.5, (4, _N)), rng.standard_normal((4, _N))
    if solver == "lu":
        def loss(k, b):
            return snp.sum(sd.linalg.solve(_stiffness(k).todense(), b) ** 2)
    else:
        def loss(k, b):
            return _loss(k, b, solver)

    def total(K, B):
        return snp.sum(sd.vmap(loss)(K, B))

    graph = sd.graph.passes.optimize(sd.trace(sd.grad(total, argnums=(0, 1)), K, B))
    if solver != "cg":
        (factor,) = _ops(graph, "linalg.factor")
        assert factor.primitive.name == "map"
        readers = [n for n in graph.nodes if factor.outputs[0] in n.inputs
                   and not n.primitive.releases]  # (klu: its release reads it too)
        assert len(readers) == 2  # the solve and the adjoint's transposed solve
    got = sd.graph.evaluate(graph, K, B)
    with sd.config.x64_scope():
        def jloss(k, b):
            return jnp.sum(jnp.linalg.solve(_dense_stiffness(k, jnp), b) ** 2)
        want = jax.grad(lambda K, B: jnp.sum(jax.vmap(jloss)(K, B)), argnums=(0, 1))(K, B)
    tol = 1e-12 if solver != "cg" else 1e-7
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def test_batched_solves_differentiate_twice_and_under_jax_vmap(rng):
    K, B, V = (rng.uniform(0.5, 1.5, (3, _N)), rng.standard_normal((3, _N)),
               rng.standard_normal((3, _N)))
    hv = sd.vmap(lambda k, b, v: sd.hvp(lambda k: _loss(k, b), k, v))(K, B, V)
    loop = [sd.hvp(lambda k: _loss(k, b), k, v) for k, b, v in zip(K, B, V)]
    np.testing.assert_allclose(hv, loop, rtol=1e-11)
    jf = sd.to_jax(_loss)
    got = jax.jit(jax.vmap(jax.grad(jf)))(K, B)
    np.testing.assert_allclose(got, [sd.grad(_loss)(k, b) for k, b in zip(K, B)], rtol=1e-12)


def test_a_singular_matrix_in_a_batch_raises(rng):
    A = rng.standard_normal((3, 4, 4)) + 4 * np.eye(4)
    A[1] = 0.0
    f = sd.vmap(lambda a: sd.linalg.solve(a, np.ones(4)))
    with pytest.raises(sd.errors.SingularMatrixError, match="singular"):
        f(A)


@pytest.mark.slow  # ~8 s; the registry's batch sweep covers linalg.solve_operator
def test_matrix_free_operators_batch_through_their_matvec(rng):
    th, b = rng.uniform(-0.5, 0.5, (3, 4)), rng.standard_normal(4)

    def solve(t):
        op = sd.linalg.operator(lambda v: snp.exp(t) * v + 0.1 * snp.roll(v, 1), (4, 4))
        return sd.linalg.solve(op, b, solver="gmres", tol=1e-12)

    got = sd.vmap(solve)(th)
    g = sd.grad(lambda th: snp.sum(sd.vmap(solve)(th) ** 2))(th)
    np.testing.assert_allclose(got, [solve(t) for t in th], rtol=1e-10)
    np.testing.assert_allclose(g, [sd.grad(lambda t: snp.sum(solve(t) ** 2))(t) for t in th],
                               rtol=1e-8)


@pytest.mark.parametrize("solver", ["splu", pytest.param("cg", marks=pytest.mark.slow)])
def test_jax_vmap_of_to_jax_shares_factors_in_value_grad_and_hvp(rng, solver):
    # two solves with one matrix: one factorization, read by both solves and
    # by the adjoint's transposed solves, saved between JAX's forward and
    # backward passes and batched by jax.vmap
    def f(k, b):
        A = _stiffness(k)
        x = sd.linalg.solve(A, b, solver=solver)
        return snp.sum(x ** 2) + snp.sum(sd.linalg.solve(A, x, solver=solver))

    K, B, V = (rng.uniform(0.5, 1.5, (3, _N)), rng.standard_normal((3, _N)),
               rng.standard_normal((3, _N)))
    jf = sd.to_jax(f)
    with sd.config.x64_scope():
        val, (gk, gb) = jax.jit(jax.vmap(jax.value_and_grad(jf, argnums=(0, 1))))(K, B)
        if solver == "splu":  # (forward over reverse through CG: 15 s of compiling)
            hv = jax.vmap(lambda k, b, v: jax.jvp(lambda k: jax.grad(jf)(k, b), (k,),
                                                  (v,))[1])(K, B, V)
    for j in range(3):
        v, (wk, wb) = sd.value_and_grad(f, argnums=(0, 1))(K[j], B[j])
        np.testing.assert_allclose(val[j], v, rtol=1e-12)
        np.testing.assert_allclose(gk[j], wk, rtol=1e-10)
        np.testing.assert_allclose(gb[j], wb, rtol=1e-10)
        if solver == "splu":
            np.testing.assert_allclose(hv[j], sd.hvp(lambda k: f(k, B[j]), K[j], V[j]),
                                       rtol=1e-9)


def test_a_large_batch_factors_each_matrix_once(rng, monkeypatch):
    # more matrices than the host store's count bound: none is pushed out
    # before its solves read it (which would factor it again)
    from sciad.solvers.direct import _sparse_direct

    calls = []
    one = _sparse_direct._factor_one
    monkeypatch.setattr(_sparse_direct, "_factor_one", lambda p, d: calls.append(1) or one(p, d))
    size = _sparse_direct.MAX_COUNTED + 8
    K, B = rng.uniform(0.5, 1.5, (size, _N)), rng.standard_normal((size, _N))
    g = sd.function(sd.grad(lambda K, B: snp.sum(sd.vmap(_loss)(K, B))))
    g(K, B)
    calls.clear()
    got = g(K, B)
    assert len(calls) == size
    np.testing.assert_allclose(got[:2], [sd.grad(_loss)(k, b) for k, b in zip(K[:2], B[:2])],
                               rtol=1e-12)


@pytest.mark.parametrize("dense", [False, True])
def test_a_batch_of_one_runs_unbatched(rng, dense):
    # (a map of size 1 lowers to its body on the one example)
    def loss(k, b):
        A = _stiffness(k)
        return snp.sum(sd.linalg.solve(A.todense() if dense else A, b) ** 2)

    K, B = rng.uniform(0.5, 1.5, (1, _N)), rng.standard_normal((1, _N))
    total = sd.function(sd.value_and_grad(lambda K, B: snp.sum(sd.vmap(loss)(K, B))))
    v, g = total(K, B)
    wv, wg = sd.value_and_grad(loss)(K[0], B[0])
    np.testing.assert_allclose(v, wv, rtol=1e-13)
    np.testing.assert_allclose(g, wg[None], rtol=1e-12)


def test_a_failing_example_is_named_by_its_index():
    # a batch of dense solves, the fourth matrix singular; a batch of sparse
    # ones (KLU: the checks in the program), the third holding NaN; a batch
    # of roots, one without a root
    A = np.stack([np.eye(3) * (i + 1) for i in range(5)])
    A[3] = 0.0
    with pytest.raises(SingularMatrixError, match=r"in example \[3\] of a batch of 5"):
        sd.vmap(lambda a, b: sd.linalg.solve(a, b))(A, np.ones((5, 3)))
    M = (sp.random(30, 30, density=0.2, random_state=0) + 10 * sp.eye(30)).tocsr()
    pat = sd.sparse.from_scipy(M).type.pattern
    D = np.stack([M.data] * 4)
    D[2, 0] = np.nan

    def solve(d, b):
        return sd.linalg.solve(sd.sparse.csr_matrix((d, pat.indices, pat.indptr),
                                                    shape=(30, 30)), b)

    with pytest.raises(NonFiniteError, match=r"in example \[2\] of a batch of 4"):
        sd.function(sd.vmap(solve))(D, np.ones((4, 30)))
    c = np.array([1.0, 2.0, -1.0])  # x^2 = c: no real root for c = -1
    with pytest.raises(ConvergenceError, match=r"in example \[2\] of a batch of 3"):
        sd.vmap(lambda c: sd.optimize.root(lambda x, c: x ** 2 - c, snp.ones(1), (c,)).x)(c)
