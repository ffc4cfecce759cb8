"""`sd.function`: compiled per signature, cached, NumPy dtypes, static arguments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp


def f(x, y, z):
    a = snp.sin(x) @ y + z
    return snp.sum(snp.exp(-a * a), axis=0) - snp.max(a, axis=0)


def f_numpy(x, y, z):
    a = np.sin(x) @ y + z
    return np.sum(np.exp(-a * a), axis=0) - np.max(a, axis=0)


def test_matches_numpy_in_float64(rng):
    args = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    out = sd.function(f)(*args)
    assert isinstance(out, jax.Array) and out.dtype == np.float64
    np.testing.assert_allclose(np.asarray(out), f_numpy(*args), rtol=1e-12, atol=1e-12)


def test_traces_once_per_signature(rng):
    calls = []

    def g(x, y):
        calls.append(1)
        return x * y + 1.0

    gf = sd.function(g)
    a, b = rng.standard_normal(3), rng.standard_normal(3)
    for _ in range(3):
        gf(a, b)
    with jax.enable_x64(True):
        a_jax = jnp.asarray(a)
    gf(a_jax, b)  # a JAX array of the same signature: no retrace
    assert len(calls) == 1 and gf.trace_count == 1
    gf(rng.standard_normal(4), rng.standard_normal(4))  # new shape
    gf(a.astype(np.float32), b.astype(np.float32))  # new dtype
    assert len(calls) == 3 and gf.trace_count == 3
    assert gf.graphs[2].in_types[0].dtype == np.float32
    assert gf(a.astype(np.float32), b.astype(np.float32)).dtype == np.float32


def test_static_arguments_are_part_of_the_signature(rng):
    calls = []

    @sd.function(static_argnums=1, static_argnames="mode")
    def g(x, n, mode="sin"):
        calls.append((n, mode))
        for _ in range(n):
            x = snp.sin(x) if mode == "sin" else snp.cos(x)
        return x

    x = rng.standard_normal(3)
    np.testing.assert_allclose(g(x, 2), np.sin(np.sin(x)), rtol=1e-14)
    np.testing.assert_allclose(g(x, 2, mode="cos"), np.cos(np.cos(x)), rtol=1e-14)
    g(x, 2)
    assert calls == [(2, "sin"), (2, "cos")]


def test_pytrees_and_keyword_arguments(rng):
    @sd.function
    def g(params, x, *, scale):
        return {"y": params["a"] * x * scale, "z": params["b"] - x}

    p = {"a": rng.standard_normal(3), "b": rng.standard_normal(3)}
    x = rng.standard_normal(3)
    out = g(p, x, scale=2.0)
    np.testing.assert_allclose(out["y"], p["a"] * x * 2.0, rtol=1e-15)
    np.testing.assert_allclose(out["z"], p["b"] - x, rtol=1e-15)


def test_trace_method_returns_the_graph(rng):
    gf = sd.function(f)
    args = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    g = gf.trace(*args)
    assert isinstance(g, sd.Graph) and g.name == "f" and len(g.nodes) == 9
    assert "stablehlo" in gf.lower(*args).as_text() or "func.func" in gf.lower(*args).as_text()


def test_complex_and_float32_dtypes_follow_numpy(rng):
    z = rng.standard_normal(4) + 1j * rng.standard_normal(4)
    out = sd.function(lambda z: snp.abs(z) + snp.real(z * 2j))(z)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, np.abs(z) + np.real(z * 2j), rtol=1e-14)
    x32 = rng.standard_normal(4).astype(np.float32)
    assert sd.function(lambda x: x * 2.5 + 1)(x32).dtype == np.float32


def test_composes_with_jax_jit_outside(rng):
    gf = sd.function(lambda x: snp.tanh(x) * 2.0)
    x = rng.standard_normal(5)
    with jax.enable_x64(True):
        y = jax.jit(lambda v: gf(v) + 1.0)(x)
    np.testing.assert_allclose(y, np.tanh(x) * 2.0 + 1.0, rtol=1e-14)


def test_shape_errors_surface_at_trace_time_with_user_line(rng):
    def bad(a, b):
        return a @ b  # the line the error must name

    with pytest.raises(sd.errors.ShapeError) as info:
        sd.function(bad)(rng.standard_normal((3, 4)), rng.standard_normal((5, 2)))
    msg = str(info.value)
    assert "matmul: cannot multiply f64[3,4] by f64[5,2]" in msg
    assert f"test_function.py:{bad.__code__.co_firstlineno + 1}" in msg


def test_global_x64_switched_off_after_creation_is_refused():
    from sciad.errors import NotSupportedError

    was = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", True)
        f = sd.function(lambda x: snp.sin(x) * 2.0)
        assert f(np.ones(3)).dtype == np.float64
        jax.config.update("jax_enable_x64", False)
        with pytest.raises(NotSupportedError, match="x64 mode was on when this"):
            f(np.ones(3))
    finally:
        jax.config.update("jax_enable_x64", was)
    assert sd.function(lambda x: snp.sin(x) * 2.0)(np.ones(3)).dtype == np.float64


def _klu_misfit(n):
    import scipy.sparse as sp

    M = sp.csr_array(sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], (n, n)))
    coo = M.tocoo()

    def misfit(d, b):
        A = sd.sparse.coo_matrix((d, (coo.row, coo.col)), shape=(n, n))
        return snp.sum(sd.linalg.solve(A, b) ** 2)
    return misfit, coo


def test_a_checked_program_is_one_call_without_effects(rng):
    """A program with run-time checks and side-effecting kernel calls (a
    sparse solve: KLU's factor and free, the backward-error check) is bound
    as one `sciad_program` call that declares no effects, so JAX dispatches
    it from C++; its lowering keeps the effects (a failed check still
    raises), and `jax.vmap` of the function inlines it again."""
    from sciad.errors import SingularMatrixError

    misfit, coo = _klu_misfit(12)
    g = sd.function(sd.value_and_grad(misfit))
    b = rng.standard_normal(12)
    jaxpr = jax.make_jaxpr(g._dispatch.current)(coo.data, b)
    assert jaxpr.effects == set()
    inner = jaxpr.jaxpr.eqns[0].params["jaxpr"].jaxpr
    assert [e.primitive.name for e in inner.eqns] == ["sciad_program"]
    assert inner.eqns[0].params["jaxpr"].effects  # (the checks, inside)
    v, _ = g(coo.data, b)
    A = np.zeros((12, 12))
    A[coo.row, coo.col] = coo.data
    u = np.linalg.solve(A, b)
    np.testing.assert_allclose(float(v), u @ u, rtol=1e-12)
    with pytest.raises(SingularMatrixError):
        g(np.zeros_like(coo.data), b)
    B = rng.standard_normal((3, 12))
    np.testing.assert_allclose(np.asarray(jax.vmap(sd.function(misfit), (None, 0))(coo.data, B)),
                               [x @ x for x in np.linalg.solve(A, B.T).T], rtol=1e-12)


def test_a_program_with_another_effect_is_left_as_it_is():
    """Only sciad's own effects are erased: an ordered host callback keeps the
    program as it was traced (its effect, its token)."""
    from jax.experimental import io_callback

    from sciad._function import _as_program

    def run(x):
        io_callback(lambda v: None, None, x, ordered=True)
        return (x * 2,)

    jaxpr = jax.make_jaxpr(lambda x: _as_program(run, [x]))(jnp.ones(3))
    assert jaxpr.effects and "sciad_program" not in str(jaxpr)


def test_a_large_captured_constant_is_not_folded_by_xla():
    """A sparse matrix whose values are a constant the function captures (an
    FEM assembly's duplicates: a scatter-add onto the pattern) compiled 3x
    slower than with the values an argument, XLA folding the scatter at
    compile time (10-28 s at 256^2 unknowns): a large constant reaches the
    program through an optimization barrier, and the result is the same."""
    import scipy.sparse as sp

    N = 70  # (4,900 unknowns: values of 2 x 24,220 entries, above LARGE_LITERAL)
    T = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], (N, N))
    M = (sp.kron(sp.eye(N), T) + sp.kron(T, sp.eye(N))).tocoo()
    rows, cols = np.r_[M.row, M.row], np.r_[M.col, M.col]
    vals = np.r_[M.data, M.data] / 2
    n = N * N

    def g(v, b):
        A = sd.sparse.coo_matrix((v, (rows, cols)), shape=(n, n), tags={"spd"})
        return snp.sum(sd.linalg.solve(A, b, solver="splu") ** 2)

    b = np.ones(n)
    captured = sd.function(lambda b: g(vals, b))
    assert vals.size >= sd.graph._lower.LARGE_LITERAL
    assert "optimization_barrier" in captured.lower(b).as_text()
    np.testing.assert_allclose(float(captured(b)), float(sd.function(g)(vals, b)), rtol=1e-12)
