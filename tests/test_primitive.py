"""User primitives: registration, rules on the object, errors that name places."""

import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (LoweringError, MissingRuleError, RegistrationError, ShapeError)
from sciad.graph import TensorType

scaled_sin_p = sd.primitive("test_scaled_sin")


@scaled_sin_p.def_abstract_eval
def _scaled_sin_shape(x, *, scale):
    if x.dtype.kind not in "fc":
        raise sd.errors.DTypeError(f"expects a float operand, got {x.str_short()}.")
    return TensorType(x.shape, x.dtype)


@scaled_sin_p.def_impl
def _scaled_sin_impl(x, *, scale):
    return scale * jnp.sin(x)


def test_user_primitive_traces_prints_and_runs(rng):
    x = rng.standard_normal(4)
    g = sd.trace(lambda x: scaled_sin_p(x, scale=2.0) + 1.0, x)
    assert g.nodes[0].primitive is scaled_sin_p
    assert g.pretty(source=False).splitlines()[1].startswith(
        "  %0 = test_scaled_sin[scale=2.0] %x")
    out = sd.function(lambda x: scaled_sin_p(x, scale=2.0) + 1.0)(x)
    np.testing.assert_allclose(out, 2 * np.sin(x) + 1, rtol=1e-14)
    # outside a trace the primitive runs eagerly
    np.testing.assert_allclose(scaled_sin_p(x, scale=3.0), 3 * np.sin(x), rtol=1e-14)


def test_user_primitive_round_trips_through_json(rng):
    x = rng.standard_normal(4)
    g = sd.trace(lambda x: scaled_sin_p(x, scale=2.0), x)
    back = sd.Graph.from_json(g.to_json())
    assert back.nodes[0].primitive is scaled_sin_p and str(back) == str(g)


def test_repr_lists_rules():
    assert repr(scaled_sin_p) == "Primitive('test_scaled_sin', rules=[impl, abstract_eval])"
    assert scaled_sin_p.rules == ("impl", "abstract_eval")


def test_registering_a_name_twice_names_both_places():
    with pytest.raises(RegistrationError) as info:
        sd.primitive("test_scaled_sin")
    msg = str(info.value)
    assert msg.count("test_primitive.py:") == 2
    assert "already registered" in msg


def test_registering_a_builtin_name_is_an_error():
    with pytest.raises(RegistrationError, match=r"_elementwise\.py"):
        sd.primitive("sin")


def test_defining_a_rule_twice_is_an_error():
    p = sd.primitive("test_twice")
    p.def_impl(lambda x: x)
    with pytest.raises(RegistrationError, match="impl rule is already defined"):
        p.def_impl(lambda x: x)


def test_shape_rule_errors_name_op_and_user_line(rng):
    def bad(x):
        return scaled_sin_p(snp.astype(x, np.int64), scale=1.0)

    with pytest.raises(sd.errors.DTypeError) as info:
        sd.trace(bad, rng.standard_normal(3))
    msg = str(info.value)
    assert msg.startswith("test_scaled_sin: expects a float operand, got i64[3].")
    assert f"test_primitive.py:{bad.__code__.co_firstlineno + 1}" in msg


def test_missing_shape_rule(rng):
    p = sd.primitive("test_no_shape")
    p.def_impl(lambda x: x)
    with pytest.raises(MissingRuleError, match="def_abstract_eval"):
        sd.trace(lambda x: p(x), rng.standard_normal(3))


def test_missing_impl_fails_at_lowering(rng):
    p = sd.primitive("test_no_impl")
    p.def_abstract_eval(lambda x: x)
    g = sd.trace(lambda x: p(x), rng.standard_normal(3))  # tracing only needs the shape
    assert g.nodes[0].primitive is p
    with pytest.raises(MissingRuleError, match="cannot be lowered"):
        sd.function(lambda x: p(x))(rng.standard_normal(3))


def test_impl_disagreeing_with_shape_rule_is_caught(rng):
    p = sd.primitive("test_liar")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: jnp.concatenate([x, x]))
    with pytest.raises(LoweringError, match=r"returned f64\[6\] where the shape rule says "
                                            r"f64\[3\]"):
        sd.function(lambda x: p(x))(rng.standard_normal(3))


def test_impl_failure_names_the_node(rng):
    p = sd.primitive("test_broken")
    p.def_abstract_eval(lambda x: x)

    @p.def_impl
    def _impl(x):
        raise RuntimeError("kaboom")

    def user(x):
        return p(x * 2.0)

    with pytest.raises(LoweringError) as info:
        sd.function(user)(rng.standard_normal(3))
    msg = str(info.value)
    assert "RuntimeError: kaboom" in msg
    assert "while running: %1 = test_broken %0 : f64[3]" in msg
    assert f"test_primitive.py:{user.__code__.co_firstlineno + 1}" in msg


def test_multiple_results(rng):
    p = sd.primitive("test_split", multiple_results=True)

    @p.def_abstract_eval
    def _shape(x):
        if x.shape[0] % 2:
            raise ShapeError(f"needs an even length, got {x.str_short()}.")
        half = TensorType((x.shape[0] // 2,), x.dtype)
        return half, half

    p.def_impl(lambda x: tuple(jnp.split(x, 2)))
    x = rng.standard_normal(6)
    a, b = sd.function(lambda x: p(x))(x)
    np.testing.assert_array_equal(a, x[:3])
    np.testing.assert_array_equal(b, x[3:])
    with pytest.raises(ShapeError, match="test_split: needs an even length"):
        sd.trace(lambda x: p(x), rng.standard_normal(5))


def test_params_must_be_hashable(rng):
    with pytest.raises(TypeError, match="not hashable"):
        sd.trace(lambda x: scaled_sin_p(x, scale=[1.0]), rng.standard_normal(3))


def test_bad_primitive_names():
    with pytest.raises(RegistrationError, match="non-empty string"):
        sd.primitive("has space")


# ---------------------------------------------------------------------------
# The documented rule hooks: every `def_*` method's signature and example,
# (the custom-primitive guide's snippets run in tests/test_docs.py)


_HOOKS = ["impl", "abstract_eval", "jvp", "vjp", "transpose", "batch", "sparsity",
          "simplify", "vjp_fwd", "vjp_bwd", "dce", "hoist", "linearity", "cost"]


def _python_blocks(text: str) -> list[str]:
    import re
    import textwrap

    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]


def test_every_rule_hook_has_a_docstring_with_its_signature_and_an_example():
    from sciad.graph._core import _RULES

    assert set(_HOOKS) == set(_RULES), "document the new hook and add it to _HOOKS"
    for hook in _HOOKS:
        doc = getattr(sd.graph.Primitive, f"def_{hook}").__doc__ or ""
        assert "`fn(" in doc.split("\n\n")[0], f"def_{hook}: the signature comes first"
        assert "->" in doc.split("\n\n")[0], f"def_{hook}: and what the rule returns"
        assert _python_blocks(doc), f"def_{hook}: give an example"


def test_rule_hook_examples_run_and_show_their_results(scratch_registry):
    import jax.numpy as jnp
    from helpers import run_documented

    ns = {"np": np, "jnp": jnp, "sd": sd, "snp": snp}
    for hook in _HOOKS:
        for code in _python_blocks(getattr(sd.graph.Primitive, f"def_{hook}").__doc__):
            run_documented(code, ns, f"def_{hook}")
    assert sd.graph.lookup_primitive("doc_cube").rules == (
        "impl", "abstract_eval", "jvp", "vjp", "batch", "sparsity")


def test_a_vjp_rule_knows_which_operands_the_reverse_pass_differentiates(rng):
    # `needs_ct`: a traced operand held fixed (not in argnums, or computed
    # only from such values and constants) needs no cotangent
    seen = []
    mul_p = sd.primitive("test_needs_ct_mul")
    mul_p.def_abstract_eval(lambda x, c: x)
    mul_p.def_impl(lambda x, c: x * c)

    @mul_p.def_vjp
    def _vjp(primals, out, ct):
        x, c = primals
        seen.append((sd.graph.needs_ct(x), sd.graph.needs_ct(c)))
        return (ct * c if sd.graph.needs_ct(x) else None,
                snp.sum(ct * x) if sd.graph.needs_ct(c) else None)

    x, c = rng.standard_normal(3), np.float64(1.5)
    g = sd.grad(lambda x, c: snp.sum(mul_p(x, 2.0 * c)))(x, c)
    np.testing.assert_allclose(g, np.full(3, 3.0), rtol=1e-15)
    gx, gc = sd.grad(lambda x, c: snp.sum(mul_p(x, 2.0 * c)), argnums=(0, 1))(x, c)
    np.testing.assert_allclose(gc, 2.0 * np.sum(x), rtol=1e-14)
    sd.grad(lambda x: snp.sum(mul_p(x, 2.0)))(x)  # a constant operand
    assert seen == [(True, False), (True, True), (True, False)]
