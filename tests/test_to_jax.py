"""`sd.to_jax(f)`: a plain JAX function whose derivatives are sciad's.

Values agree with `sd.function` and NumPy; `jax.grad`, `jax.jvp`, `jax.jit`,
`jax.vmap` and their compositions agree with `sd.grad` and with JAX's AD of the
`jax.numpy` version; a user primitive with a deliberately different VJP rule
shows that reverse mode runs sciad's rule, not JAX's AD of the lowering.
Every test computes in float64 inside `jax.enable_x64(True)`, except the one
that checks float32 with x64 off.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp


def f(x, y):
    a = snp.sin(x) @ y
    return snp.sum(snp.exp(-a * a)) + snp.sum(x * x * x) * 0.1


def f_jnp(x, y):
    a = jnp.sin(x) @ y
    return jnp.sum(jnp.exp(-a * a)) + jnp.sum(x * x * x) * 0.1


def f_numpy(x, y):
    a = np.sin(x) @ y
    return np.sum(np.exp(-a * a)) + np.sum(x * x * x) * 0.1


def _args(rng):
    return rng.standard_normal((3, 4)), rng.standard_normal(4)


def _close(a, b, rtol=1e-10):
    jax.tree_util.tree_map(
        lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol,
                                                atol=rtol), a, b)


# A user primitive `2 x` whose VJP rule is deliberately wrong (3 instead of 2):
# reverse mode through `sd.to_jax` must give 3s (sciad's rule), forward mode 2s
# (its JVP rule), and JAX's AD of the lowering would give 2s for both.
scaled_p = sd.primitive("to_jax_test_scaled")
scaled_p.def_abstract_eval(lambda x: x)
scaled_p.def_impl(lambda x: 2 * x)
scaled_p.def_jvp(lambda primals, tangents: (scaled_p.bind(primals[0]),
                                            2.0 * tangents[0]))
scaled_p.def_vjp(lambda primals, out, ct: (ct * 3.0,))

# A linear primitive with a JVP rule but neither transpose nor VJP rule:
# forward mode works, reverse mode raises sciad's MissingRuleError.
forward_only_p = sd.primitive("to_jax_test_forward_only")
forward_only_p.def_abstract_eval(lambda x: x)
forward_only_p.def_impl(lambda x: 2 * x)
forward_only_p.def_jvp(lambda primals, tangents: (forward_only_p.bind(primals[0]),
                                                  forward_only_p.bind(tangents[0])))


def test_value_matches_function_and_numpy(rng):
    x, y = _args(rng)
    with jax.enable_x64(True):
        out = sd.to_jax(f)(x, y)
        assert out.dtype == np.float64
        _close(out, sd.function(f)(x, y), rtol=1e-12)
        _close(out, f_numpy(x, y), rtol=1e-12)
        _close(jax.jit(sd.to_jax(f))(x, y), f_numpy(x, y), rtol=1e-12)


def test_grad_matches_sd_grad_and_jax(rng):
    x, y = _args(rng)
    with jax.enable_x64(True):
        g = jax.grad(sd.to_jax(f), argnums=(0, 1))(x, y)
        _close(g, sd.grad(f, argnums=(0, 1))(x, y))
        _close(g, jax.jit(jax.grad(f_jnp, argnums=(0, 1)))(x, y))
        _close(jax.jit(jax.grad(sd.to_jax(f)))(x, y), g[0])
        value, gx = jax.jit(jax.value_and_grad(sd.to_jax(f)))(x, y)
        _close((value, gx), (f_numpy(x, y), g[0]))


def test_forward_mode_and_higher_derivatives(rng):
    # Compiled: op-by-op dispatch of nested transforms spends its time in XLA
    # compiles of single ops, for the jax.numpy references as much as for sciad.
    x, y = _args(rng)
    tx, ty = _args(rng)
    F = sd.to_jax(f)
    jit = jax.jit
    with jax.enable_x64(True):
        jvp = jax.jvp(F, (x, y), (tx, ty))  # eager
        _close(jvp, jit(lambda *a: jax.jvp(f_jnp, a[:2], a[2:]))(x, y, tx, ty))
        _close(jvp[1], sd.jvp(f, (x, y), (tx, ty))[1])
        _close(jit(jax.jacfwd(F))(x, y), jit(jax.grad(f_jnp))(x, y))
        want = jit(jax.hessian(f_jnp))(x, y)
        _close(jit(jax.hessian(F))(x, y), want)  # forward over reverse
        _close(jit(jax.jacrev(jax.jacfwd(F)))(x, y), want)
        _close(jit(jax.jacrev(jax.jacrev(F)))(x, y), want)
        _close(jit(jax.jacfwd(jax.jacfwd(F)))(x, y), want)
        _, lin = jax.linearize(F, x, y)
        _close(lin(tx, ty), jvp[1])


def test_vmap_matches_loop(rng):
    xs, y = rng.standard_normal((5, 3, 4)), rng.standard_normal(4)
    F = sd.to_jax(f)
    with jax.enable_x64(True):
        _close(jax.vmap(F, (0, None))(xs, y), [f_numpy(x, y) for x in xs], rtol=1e-12)
        grad_jnp = jax.jit(jax.grad(f_jnp))
        _close(jax.jit(jax.vmap(jax.grad(F), (0, None)))(xs, y),
               [grad_jnp(x, y) for x in xs])
        _close(jax.jit(jax.vmap(jax.grad(F, 1), (0, None)))(xs, y),
               [jax.grad(f_jnp, 1)(x, y) for x in xs])


def test_transforms_of_vmap(rng):
    # `sciad_linear` batched: grad through vmap, vmap of jvp with batched or
    # unbatched tangents.
    xs, y = rng.standard_normal((5, 3, 4)), rng.standard_normal(4)

    def loss(fn):
        return lambda y: jnp.sum(jax.vmap(fn, (0, None))(xs, y) ** 2)

    def pushes(fn, x):
        return (jax.vmap(lambda v: jax.jvp(fn, (x, y), (v, y))[1])(xs),
                jax.vmap(lambda x: jax.jvp(fn, (x, y), (x, y))[1])(xs),
                jax.vmap(lambda x: jax.jvp(fn, (x, y), (xs[0], y))[1])(xs))

    jit = jax.jit
    with jax.enable_x64(True):
        F = sd.to_jax(f)
        _close(jit(jax.grad(loss(F)))(y), jit(jax.grad(loss(f_jnp)))(y))
        _close(jit(jax.hessian(loss(F)))(y), jit(jax.hessian(loss(f_jnp)))(y))
        _close(jit(lambda x: pushes(F, x))(xs[1]),
               jit(lambda x: pushes(f_jnp, x))(xs[1]))
        _close(jit(jax.grad(lambda y: jnp.sum(pushes(F, xs[1])[0] ** 2)))(y),
               jit(jax.grad(lambda y: jnp.sum(pushes(f_jnp, xs[1])[0] ** 2)))(y))


def test_pytrees_in_and_out(rng):
    def g(p):
        return snp.sin(p["w"]) * p["b"], snp.sum(p["w"] ** 2)

    def g_jnp(p):
        return jnp.sin(p["w"]) * p["b"], jnp.sum(p["w"] ** 2)

    p = {"w": rng.standard_normal(3), "b": rng.standard_normal(3)}
    G = sd.to_jax(g)
    with jax.enable_x64(True):
        out = G(p)
        assert isinstance(out, tuple) and len(out) == 2
        _close(out, g_jnp(p), rtol=1e-12)

        def scalar(fn):
            return lambda p: jnp.sum(fn(p)[0] ** 2) + fn(p)[1]

        gp = jax.grad(scalar(G))(p)
        assert set(gp) == {"w", "b"}
        _close(gp, jax.jit(jax.grad(scalar(g_jnp)))(p))
        _close(jax.jit(lambda p: jax.jvp(G, (p,), (p,)))(p),
               jax.jit(lambda p: jax.jvp(g_jnp, (p,), (p,)))(p))


def test_integer_inputs_and_outputs_pass_through(rng):
    def g(x, n):
        return snp.sum(x * n), n + 1

    x, n = rng.standard_normal(3), np.arange(1, 4)
    G = sd.to_jax(g)
    with jax.enable_x64(True):
        s, m = G(x, n)
        _close(s, np.sum(x * n), rtol=1e-12)
        assert m.dtype == np.int64 and np.array_equal(m, n + 1)
        _close(jax.grad(lambda x, n: G(x, n)[0])(x, n), n.astype(float))
        _close(jax.jit(jax.grad(lambda x, n: G(x, n)[0]))(x, n), n.astype(float))
        gn = jax.grad(lambda x, n: G(x, n)[0], argnums=1, allow_int=True)(x, n)
        assert gn.dtype == jax.dtypes.float0
        (s, m), (ts, tm) = jax.jvp(G, (x, n), (x, np.zeros(3, jax.dtypes.float0)))
        _close(ts, np.sum(x * n))
        assert tm.dtype == jax.dtypes.float0


def test_reverse_mode_uses_sciads_vjp_rule(rng):
    def g(x):
        return snp.sum(scaled_p.bind(x) * snp.cos(x))

    x = rng.standard_normal(4)
    G = sd.to_jax(g)
    with jax.enable_x64(True):
        _close(G(x), np.sum(2 * x * np.cos(x)), rtol=1e-12)
        # d/dx [p(x) cos x] with p's VJP rule 3: 3 cos x - 2 x sin x
        rule3 = 3 * np.cos(x) - 2 * x * np.sin(x)
        rule2 = 2 * np.cos(x) - 2 * x * np.sin(x)  # the true derivative (JVP rule)
        _close(jax.grad(G)(x), rule3)
        _close(jax.grad(G)(x), sd.grad(g)(x))
        _close(jax.jit(jax.grad(G))(x), rule3)
        _close(jax.jit(jax.jacrev(G))(x), rule3)
        _close(jax.jit(jax.vmap(jax.grad(G)))(np.stack([x, x])), [rule3, rule3])
        _close(jax.jit(jax.grad(lambda x: jnp.sum(jax.vmap(G)(x[None]))))(x), rule3)
        # forward mode runs the JVP rule
        _close(jax.jvp(G, (x,), (np.ones(4),))[1], np.sum(rule2))
        _close(jax.jit(jax.jacfwd(G))(x), rule2)


def test_forward_mode_needs_no_reverse_rules(rng):
    def g(x):
        return snp.sum(forward_only_p.bind(x) * x)

    x, t = rng.standard_normal(3), rng.standard_normal(3)
    G = sd.to_jax(g)
    with jax.enable_x64(True):
        _close(jax.jvp(G, (x,), (t,))[1], np.sum(4 * x * t))
        with pytest.raises(sd.errors.MissingRuleError,
                           match="`to_jax_test_forward_only` has no transpose rule"):
            jax.grad(G)(x)


def test_complex_inputs_follow_jax(rng):
    def g(z):
        return snp.sum(snp.real(z * snp.conj(z)) * snp.real(z))

    def g_jnp(z):
        return jnp.sum(jnp.real(z * jnp.conj(z)) * jnp.real(z))

    z = rng.standard_normal(3) + 1j * rng.standard_normal(3)
    with jax.enable_x64(True):
        G, jit = sd.to_jax(g), jax.jit
        _close(jax.grad(G)(z), jit(jax.grad(g_jnp))(z))
        _close(jit(lambda z: jax.jvp(G, (z,), (z,)))(z),
               jit(lambda z: jax.jvp(g_jnp, (z,), (z,)))(z))


def test_traces_once_per_signature(rng):
    calls = []

    def g(x):
        calls.append(1)
        return snp.sin(x) * 2.0

    G = sd.to_jax(g)
    with jax.enable_x64(True):
        for _ in range(3):
            G(rng.standard_normal(3))
        jax.jit(G)(rng.standard_normal(3))
        jax.grad(lambda x: jnp.sum(G(x)))(rng.standard_normal(3))
        assert len(calls) == 1 and G.trace_count == 1
        G(rng.standard_normal(4))
        G(rng.standard_normal(3).astype(np.float32))
        assert len(calls) == 3 and len(G.graphs) == 3
        assert G.graphs[2].in_types[0].dtype == np.float32


def test_x64_off_traces_in_float32(rng):
    x = rng.standard_normal(3)  # float64; JAX makes it float32 with x64 off
    with jax.enable_x64(False):
        out = sd.to_jax(lambda x: snp.sum(snp.sin(x) * 2.0))(x)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, np.sum(np.sin(x) * 2.0), rtol=1e-5)
        g = jax.grad(sd.to_jax(lambda x: snp.sum(snp.sin(x) * 2.0)))(x)
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, 2 * np.cos(x), rtol=1e-5)
        with pytest.raises(sd.errors.NotSupportedError, match="x64 mode is off"):
            sd.to_jax(lambda x: x * snp.ones(3))(x)  # `ones` is float64


def test_closing_over_a_jax_tracer_is_a_clear_error(rng):
    with jax.enable_x64(True):
        def outer(y):
            return sd.to_jax(lambda x: snp.sum(x * y))(np.ones(3))

        with pytest.raises(sd.errors.TracerError, match="sd.to_jax"):
            jax.jit(outer)(2.0)


def test_optimistix_bfgs_on_rosenbrock():
    optx = pytest.importorskip("optimistix")

    def rosenbrock(y, args):
        return snp.sum(100.0 * (y[1:] - y[:-1] ** 2) ** 2 + (1.0 - y[:-1]) ** 2)

    with jax.enable_x64(True):
        sol = optx.minimise(sd.to_jax(rosenbrock), optx.BFGS(rtol=1e-10, atol=1e-10),
                            jnp.array([-1.2, 1.0, -0.5]), max_steps=500)
        np.testing.assert_allclose(sol.value, np.ones(3), atol=1e-8)


# ---------------------------------------------------------------------------
# Every primitive through `sd.to_jax`: JAX's transforms of the wrapped
# function agree with sciad's own derivatives of the registry example.

from registry_examples import (  # noqa: E402
    EXAMPLES, builtin_primitives, distinct_examples, marked_slow)

_BUILTINS = sorted(distinct_examples(sorted(builtin_primitives())))
# diagnostics that are not differentiated (they raise if asked to be)
_NOT_DIFFERENTIATED = {"linalg.rcond", "linalg.factor_rcond"}


def _grouped(names):
    """The elementwise primitives' examples checked together (one compiled
    program each for sciad and JAX instead of one per primitive, which the
    default test run cannot afford); the others one by one."""
    from sciad.primitives._elementwise import BINARY, UNARY

    groups = {"unary elementwise": [n for n in names if n in UNARY],
              "binary elementwise": [n for n in names if n in BINARY]}
    alone = [n for n in names if n not in UNARY and n not in BINARY]
    return {**{k: v for k, v in groups.items() if v}, **{n: [n] for n in alone}}


_GROUPS = _grouped(_BUILTINS)


def _group_example(names):
    """One function running the examples of `names` on their concatenated
    arguments."""
    if len(names) == 1:
        return EXAMPLES[names[0]]
    fns, args, slices = [], [], []
    for n in names:
        fn, a = EXAMPLES[n]
        slices.append(slice(len(args), len(args) + len(a)))
        fns.append(fn)
        args.extend(a)
    return (lambda *xs: tuple(f(*xs[sl]) for f, sl in zip(fns, slices))), tuple(args)


def _is_float(x) -> bool:
    return np.asarray(x).dtype.kind in "fc"


def _weights(out, seed: int):
    """A fixed random weight per float output leaf: the loss is
    `sum(Re(w * out))` over them (sparse outputs: their data)."""
    r = np.random.default_rng(seed)
    leaves = jax.tree_util.tree_leaves(out)
    return [r.standard_normal(np.shape(leaf)) if _is_float(leaf) else None for leaf in leaves]


def _loss(fn, weights, xp):
    def loss(*args):
        leaves = jax.tree_util.tree_leaves(fn(*args))
        total = 0.0
        for leaf, w in zip(leaves, weights):
            if w is not None:
                total = total + xp.sum(xp.real(leaf * w))
        return total
    return loss


# (the eigen, matrix-free and ODE families' `to_jax` paths are also tested in
# their own files: slow here)
@pytest.mark.parametrize("name", marked_slow(sorted(_GROUPS), {
    "linalg.svd_guard", "linalg.eigh_guard", "linalg.eigh_apply", "linalg.solve_operator",
    "linalg.backsolve", "map", "linalg.svd", "ode.odeint", "while_adjoint",
    "linalg.eigsh_operator", "optimize.root_guard", "scan_adjoint", "linalg.eigh",
    "ode.radau_adjoint", "ode.radau_tangent", "ode.bdf_adjoint"}))
def test_to_jax_derivatives_of_every_primitive(name, rng):
    fn, args = _group_example(_GROUPS[name])
    args = [np.asarray(a) for a in args]
    diff = tuple(i for i, a in enumerate(args) if _is_float(a))
    F = sd.to_jax(fn)
    with jax.enable_x64(True):
        out = F(*args)
        _close(out, sd.function(fn)(*args), rtol=1e-12)
        if not diff:
            return
        weights = _weights(out, int(rng.integers(2**31)))
        if not any(w is not None for w in weights):
            return
        loss_sd, loss_jax = _loss(fn, weights, snp), _loss(F, weights, jnp)
        if name in _NOT_DIFFERENTIATED:
            with pytest.raises(sd.errors.NotSupportedError, match="not differentiated"):
                jax.grad(loss_jax, argnums=diff)(*args)
            return
        tangents = [_random_like(rng, a) if i in diff else np.zeros_like(a)
                    for i, a in enumerate(args)]
        v = [tangents[i] for i in diff]

        # sciad's own: gradient and forward mode (second order through
        # sd.to_jax: test_forward_mode_and_higher_derivatives, and through
        # solves in test_numerical_honesty.py)
        def derivatives(loss, f, grad, jvp):
            def run(*a):
                def g(*d):
                    full = list(a)
                    for i, x in zip(diff, d):
                        full[i] = x
                    return loss(*full)
                d0 = tuple(a[i] for i in diff)
                grads = grad(g, argnums=tuple(range(len(diff))))(*d0)
                _, tout = jvp(lambda *d: f(*[d[diff.index(i)] if i in diff else a[i]
                                             for i in range(len(a))]), d0, tuple(v))
                return grads, tout
            return run

        sd_all = derivatives(loss_sd, fn, sd.grad, sd.jvp)
        jax_all = derivatives(loss_jax, F, jax.grad, jax.jvp)

        float_out = [w is not None for w in weights]

        def floats(res):  # tangents of the float outputs (JAX's others are float0)
            grads, tout = res
            return grads, [t for t, f in zip(jax.tree_util.tree_leaves(tout), float_out) if f]

        sd_all_c = sd.function(sd_all)
        want = floats(sd_all_c(*args))
        # vmap of grad over a batch of the first differentiated argument (the
        # path that gave zeros through direct solves), in the same program
        i0 = diff[0]
        batch = np.stack([args[i0], args[i0] + 0.01 * _random_like(rng, args[i0])])
        g0 = jax.grad(loss_jax, argnums=i0)

        def jax_both(*a):
            return jax_all(*a), jax.vmap(lambda x: g0(*[x if i == i0 else v for i, v in
                                                          enumerate(a)]))(batch)

        got, got_batch = jax.jit(jax_both)(*args)
        _close(floats(got), want, rtol=1e-9)
        want_batch = [sd_all_c(*[x if i == i0 else a for i, a in enumerate(args)])[0][0]
                      for x in batch]
        _close(got_batch, np.stack([np.asarray(w) for w in want_batch]), rtol=1e-9)


def _random_like(rng, a):
    v = rng.standard_normal(a.shape)
    if a.dtype.kind == "c":
        v = v + 1j * rng.standard_normal(a.shape)
    return v.astype(a.dtype)


def test_a_checked_program_declares_no_effects_to_jax(rng):
    """A sparse solve (KLU's side-effecting factor and free, the backward-error
    check) under `jax.jit`, `jax.grad` and `jax.vmap` of `sd.to_jax`: the
    jaxpr JAX dispatches declares no effects (so it dispatches from C++),
    the values and gradients are a dense solve's, and a singular matrix
    still raises through the gradient under `jax.jit`."""
    import scipy.sparse as sp

    from sciad.errors import SingularMatrixError

    n = 10
    coo = sp.coo_array(sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (n, n)))

    def misfit(d, b):
        A = sd.sparse.coo_matrix((d, (coo.row, coo.col)), shape=(n, n))
        return snp.sum(sd.linalg.solve(A, b) ** 2)

    def dense(d, b):
        A = jnp.zeros((n, n)).at[coo.row, coo.col].add(d)
        return jnp.sum(jnp.linalg.solve(A, b) ** 2)

    with jax.enable_x64(True):
        b = rng.standard_normal(n)
        B = rng.standard_normal((3, n))
        f = sd.to_jax(misfit)
        grad = jax.jit(jax.grad(f))
        assert jax.make_jaxpr(grad)(coo.data, b).effects == set()
        assert jax.make_jaxpr(jax.jit(f))(coo.data, b).effects == set()
        np.testing.assert_allclose(np.asarray(grad(coo.data, b)),
                                   np.asarray(jax.grad(dense)(coo.data, b)), rtol=1e-10)
        np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(f, (None, 0)))(coo.data, B)),
                                   np.asarray(jax.vmap(dense, (None, 0))(coo.data, B)),
                                   rtol=1e-10)
        with pytest.raises(SingularMatrixError), sd.errors.unwrapped():
            jax.block_until_ready(grad(0 * coo.data, b))
