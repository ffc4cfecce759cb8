"""Tracing: pytrees, static arguments, constants, escaped tracers, control flow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import TracerError
from sciad.graph import Literal, TensorType


def test_pytree_inputs_and_outputs(rng):
    def f(p, xs):
        return {"a": p["w"] * xs[0], "b": (xs[1] - p["w"], 3.0)}

    p = {"w": rng.standard_normal(3)}
    xs = [rng.standard_normal(3), rng.standard_normal(3)]
    g = sd.trace(f, p, xs)
    assert [v.hint for v in g.inputs] == ["p_w", "xs_0", "xs_1"]
    assert len(g.outputs) == 3 and isinstance(g.outputs[2], Literal)
    out = sd.function(f)(p, xs)
    np.testing.assert_array_equal(out["a"], p["w"] * xs[0])
    np.testing.assert_array_equal(out["b"][0], xs[1] - p["w"])
    assert float(out["b"][1]) == 3.0


def test_static_argnums(rng):
    def f(x, n, mode):
        for _ in range(n):
            x = snp.sin(x) if mode == "sin" else snp.cos(x)
        return x

    x = rng.standard_normal(4)
    g = sd.trace(f, x, 3, "cos", static_argnums=(1, 2))
    assert [n.primitive.name for n in g.nodes] == ["cos"] * 3
    assert len(g.inputs) == 1


def test_abstract_arguments():
    g = sd.trace(lambda a, b: a @ b, TensorType((2, 3), np.float32),
                 jax.ShapeDtypeStruct((3,), np.float32))
    assert g.out_types == (TensorType((2,), np.float32),)


def test_constants_are_captured_as_literals(rng):
    c_np = rng.standard_normal(3)
    c_jax = jnp.arange(3.0)

    g = sd.trace(lambda x: x * c_np + c_jax + 2, rng.standard_normal(3))
    lits = [a for n in g.nodes for a in n.inputs if isinstance(a, Literal)]
    assert len(lits) == 3
    np.testing.assert_array_equal(lits[0].value, c_np)
    assert not lits[0].value.flags.writeable


def test_python_scalars_are_weak(rng):
    x = rng.standard_normal(3).astype(np.float32)
    g = sd.trace(lambda x: 2.0 * x + 1, x)
    assert all(n.outputs[0].type.dtype == np.float32 for n in g.nodes)


def test_bool_of_tracer_explains_control_flow(rng):
    def f(x):
        if snp.sum(x) > 0:
            return x
        return -x

    with pytest.raises(TracerError, match=r"sd\.cond") as info:
        sd.trace(f, rng.standard_normal(3))
    assert "test_trace.py" in str(info.value)


@pytest.mark.parametrize("convert", [float, int, np.asarray, lambda t: range(t)])
def test_concrete_conversions_fail(rng, convert):
    with pytest.raises(TracerError):
        sd.trace(lambda x: convert(snp.sum(x)), rng.standard_normal(3))


def test_escaped_tracer_is_an_error(rng):
    leaked = []

    def f(x):
        leaked.append(snp.sin(x))
        return x

    x = rng.standard_normal(3)
    sd.trace(f, x)
    with pytest.raises(TracerError, match="finished trace"):
        sd.trace(lambda y: y + leaked[0], x)


def test_numpy_functions_dispatch_to_sciad(rng):
    g = sd.trace(lambda x: np.sum(np.sin(x) * 2, axis=0), rng.standard_normal((3, 2)))
    assert [n.primitive.name for n in g.nodes] == ["sin", "mul", "reduce_sum"]


def test_numpy_functions_without_sciad_equivalent_fail_clearly(rng):
    with pytest.raises(TracerError, match="numpy.unique has no sciad equivalent"):
        sd.trace(lambda x: np.unique(x), rng.standard_normal((3, 3)))
    with pytest.raises(TracerError, match="cannot be converted to a NumPy array"):
        sd.trace(lambda x: np.asarray(x), rng.standard_normal(3))


@pytest.mark.parametrize("fn, match", [
    (jnp.sin, r"trace: JAX's `sin` was given a sciad traced value: .* Use `snp.sin` "
              r"\(`import sciad.numpy as snp`\)"),
    (jnp.sum, r"JAX's `sum` .* Use `snp.sum`"),
    (jnp.fft.fft, r"JAX's `fft` .* Use `sd.fft.fft` in functions"),
    (jnp.linalg.inv, r"JAX's `inv` .* Use `sciad.numpy` .* `sd.primitive_from_jax"),
])
def test_a_jax_function_on_a_traced_value_says_what_to_use(rng, fn, match):
    with pytest.raises(TracerError, match=match) as err:  # (a TypeError, as JAX's was)
        sd.grad(lambda x: snp.sum(fn(x)))(rng.standard_normal((3, 3)))
    assert isinstance(err.value, TypeError) and "test_trace.py" in str(err.value)


def test_other_type_errors_in_a_traced_function_pass_unchanged(rng):
    def f(x):
        return x + len(3)

    with pytest.raises(TypeError, match="has no len") as err:
        sd.trace(f, rng.standard_normal(3))
    assert not isinstance(err.value, TracerError)


@pytest.mark.parametrize("index, text", [(0, "0"), ((slice(1, 3), Ellipsis), "1:3, ..."),
                                         ((slice(None), 2), ":, 2"), ([0, 1], "idx")])
def test_item_assignment_says_to_use_at_set(rng, index, text):
    def f(x):
        x[index] = 1.0
        return x

    at = text.replace(".", r"\.")
    with pytest.raises(TracerError, match=rf"cannot be changed in place \(`x\[{at}\] = "
                                          rf"\.\.\.`\).* Write `x = x\.at\[{at}\]\.set"
                                          rf"\(value\)`") as err:
        sd.trace(f, rng.standard_normal((3, 3)))
    assert isinstance(err.value, TypeError) and "test_trace.py" in str(err.value)


def test_numpy_array_on_the_left_defers_to_tracer(rng):
    c = rng.standard_normal(3)
    g = sd.trace(lambda x: c * x - c, rng.standard_normal(3))
    assert [n.primitive.name for n in g.nodes] == ["mul", "sub"]


def test_tracer_methods(rng):
    x = rng.standard_normal((2, 3))

    def f(x):
        return (x.T.shape, x.ndim, x.size, len(x), x.reshape(3, 2).shape, x.dtype,
                x.sum(axis=1).shape, [r.shape for r in x])

    out = {}

    def g(x):
        out["v"] = f(x)
        return x

    sd.trace(g, x)
    assert out["v"] == ((3, 2), 2, 6, 2, (3, 2), np.float64, (2,), [(3,), (3,)])


def test_non_array_argument_needs_static(rng):
    with pytest.raises(TypeError, match="static_argnums"):
        sd.trace(lambda x, s: x, rng.standard_normal(2), "mode")


def test_eager_ops_run_outside_a_trace(rng):
    x = rng.standard_normal((2, 3))
    y = snp.sum(snp.sin(x) ** 2, axis=0)
    assert isinstance(y, jax.Array) and y.dtype == np.float64
    np.testing.assert_allclose(y, np.sum(np.sin(x) ** 2, axis=0), rtol=1e-13)


def test_tracing_does_not_change_global_jax_config(rng):
    before = jax.config.jax_enable_x64
    sd.function(lambda x: x * 2)(rng.standard_normal(3))
    snp.sin(rng.standard_normal(3))
    assert jax.config.jax_enable_x64 == before
