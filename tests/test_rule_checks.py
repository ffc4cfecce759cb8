"""`sd.testing.check_rules` catches wrong rules; `taylor_test` catches a wrong
gradient; user primitives with hand-written rules and `primitive_from_jax`."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import RuleError

_ids = itertools.count()


def _prim(base: str) -> sd.graph.Primitive:
    """A fresh user primitive (tests run in one process: names must differ)."""
    return sd.primitive(f"test_rules_{base}_{next(_ids)}")


def _sin_like(jvp_sign: float = 1.0):
    p = _prim("sin")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(jnp.sin)

    @p.def_jvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return p(x), jvp_sign * t * snp.cos(x)

    return p


def test_correct_user_rules_pass_with_derived_vjp(rng):
    p = _sin_like()
    report = sd.testing.check_rules(p, rng.standard_normal((3, 2)))
    assert report.jvp_error < 1e-8 and report.vjp_error < 1e-12
    assert report.second_order_error < 1e-6
    assert "jvp" in repr(p) and "vjp" not in repr(p)  # the VJP is derived


def test_sign_error_in_jvp_is_caught(rng):
    with pytest.raises(RuleError, match=r"JVP rule disagrees with central finite "
                                        r"differences: relative error 2\.0"):
        sd.testing.check_rules(_sin_like(-1.0), rng.standard_normal(4))


def test_missing_term_in_jvp_is_caught(rng):
    p = _prim("mul")
    p.def_abstract_eval(lambda x, y: x)
    p.def_impl(lambda x, y: x * y)

    @p.def_jvp
    def _jvp(primals, tangents):
        (x, y), (tx, ty) = primals, tangents
        return p(x, y), sd.graph.instantiate(tx) * y  # forgets x * ty

    with pytest.raises(RuleError, match="JVP rule disagrees"):
        sd.testing.check_rules(p, rng.standard_normal(3), rng.standard_normal(3))


def _matvec(transpose_bug: bool):
    p = _prim("matvec")
    p.def_abstract_eval(lambda a, x: sd.TensorType(a.shape[:1], a.dtype))
    p.def_impl(lambda a, x: a @ x)

    @p.def_jvp
    def _jvp(primals, tangents):
        (a, x), (ta, tx) = primals, tangents
        out = p(a, x)
        terms = []
        if not sd.graph.is_zero(ta):
            terms.append(ta @ x)
        if not sd.graph.is_zero(tx):
            terms.append(a @ tx)
        return out, terms[0] if len(terms) == 1 else terms[0] + terms[1]

    @p.def_vjp
    def _vjp(primals, out, ct):
        a, x = primals
        ct_x = (a @ ct) if transpose_bug else (a.T @ ct)  # the bug: A instead of A^T
        return snp.outer(ct, x), ct_x

    return p


def test_right_hand_written_vjp_passes(rng):
    sd.testing.check_rules(_matvec(False), rng.standard_normal((4, 4)), rng.standard_normal(4))


def test_transposed_matrix_in_vjp_is_caught(rng):
    with pytest.raises(RuleError, match=r"VJP disagrees with the JVP in the dot-product "
                                        r"test.*seed=7"):
        sd.testing.check_rules(_matvec(True), rng.standard_normal((4, 4)),
                               rng.standard_normal(4), seed=7)


def test_reverse_only_primitive_is_checked_against_finite_differences(rng):
    p = _prim("cube")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x ** 3)
    p.def_vjp(lambda primals, out, ct: (3.0 * primals[0] ** 2 * ct,))
    report = sd.testing.check_rules(p, rng.standard_normal(5))
    assert "jvp" in report.skipped and report.vjp_error < 1e-6

    bad = _prim("cube_bad")
    bad.def_abstract_eval(lambda x: x)
    bad.def_impl(lambda x: x ** 3)
    bad.def_vjp(lambda primals, out, ct: (2.0 * primals[0] ** 2 * ct,))
    with pytest.raises(RuleError, match="finite differences \\(no JVP rule\\)"):
        sd.testing.check_rules(bad, rng.standard_normal(5))


def test_wrong_second_order_is_caught(rng):
    # cos without a derivative of its own: first order right, second order wrong
    flat_cos = _prim("flat_cos")
    flat_cos.def_abstract_eval(lambda x: x)
    flat_cos.def_impl(jnp.cos)
    flat_cos.def_jvp(lambda primals, tangents: (
        flat_cos(primals[0]), sd.graph.Zero(sd.TensorType(primals[0].shape,
                                                          primals[0].dtype))))
    p = _prim("sin2")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(jnp.sin)
    p.def_jvp(lambda primals, tangents: (p(primals[0]), tangents[0] * flat_cos(primals[0])))
    with pytest.raises(RuleError, match="second order"):
        sd.testing.check_rules(p, rng.standard_normal(3))
    sd.testing.check_rules(p, rng.standard_normal(3), second_order=False)


def test_malformed_rule_output_is_named(rng):
    p = _prim("bad_type")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(jnp.sin)
    p.def_jvp(lambda primals, tangents: (p(primals[0]), snp.sum(tangents[0])))
    with pytest.raises(RuleError, match=r"the JVP rule returned a tangent of type f64\[\] "
                                        r"for output 0, of type f64\[3\]; a tangent has its "
                                        r"output's shape and dtype"):
        sd.jvp(lambda x: p(x), (np.ones(3),), (np.ones(3),))


def test_a_malformed_cotangent_names_its_operand():
    # the VJP rule gives `y` a scalar: the message says operand, and which one
    p = _prim("bad_ct")
    p.def_abstract_eval(lambda x, y: x)
    p.def_impl(lambda x, y: x * y)
    p.def_vjp(lambda primals, out, ct: (ct * primals[1], snp.sum(ct * primals[0])))
    with pytest.raises(RuleError, match=r"the VJP rule returned a cotangent of type f64\[\] "
                                        r"for operand 1 \(`y`\), of type f64\[3\]; a "
                                        r"cotangent has its operand's shape and dtype"):
        sd.grad(lambda x, y: snp.sum(p(x, y)), argnums=(0, 1))(np.ones(3), np.ones(3))


def test_a_malformed_transpose_names_its_operand():
    p = _prim("bad_transpose")
    p.def_abstract_eval(lambda a, v: v)
    p.def_impl(lambda a, v: a * v)
    p.def_jvp(lambda primals, tangents: (p(*primals), p(primals[0], tangents[1])))
    p.def_transpose(lambda ct, a, v: (None, snp.sum(ct)))
    with pytest.raises(RuleError, match=r"the transpose rule returned a cotangent of type "
                                        r"f64\[\] for operand 1 \(`v`\), of type f64\[2\]"):
        sd.grad(lambda v: snp.sum(p(3.0, v)))(np.ones(2))
    q = _prim("nonlinear_transpose")
    q.def_abstract_eval(lambda a, v: v)
    q.def_impl(lambda a, v: a * v)
    q.def_jvp(lambda primals, tangents: (q(*primals), q(primals[0], tangents[1])))
    q.def_transpose(lambda ct, a, v: (ct, q(a, ct)))
    with pytest.raises(RuleError, match=r"returned a cotangent for operand 0 \(`a`\), which "
                                        r"it is not linear in"):
        sd.grad(lambda v: snp.sum(q(np.full(2, 3.0), v)))(np.ones(2))


def test_check_rules_insists_on_float64():
    with pytest.raises(sd.errors.DTypeError, match="float64"):
        sd.testing.check_rules(lambda x: snp.sin(x), np.ones(3, np.float32))


# ---------------------------------------------------------------------------
# functions that compute in lower precision than their float64 inputs


@pytest.mark.parametrize("fn", [
    pytest.param(lambda x: snp.astype(x, np.float32), id="astype-float32"),
    pytest.param(lambda x: snp.astype(snp.sin(snp.astype(x, np.float32)), np.float64),
                 id="float32-inside"),
    pytest.param(lambda x: 100.0 + snp.astype(x, np.complex64) * 2.0, id="complex64"),
    pytest.param(lambda x: sd.fft.rfft(snp.astype(x, np.float32)), id="rfft-float32"),
])
def test_lower_precision_functions_pass_with_scaled_tolerances(fn, rng):
    for _ in range(3):  # fresh inputs and directions, seeded by the test's name
        report = sd.testing.check_rules(fn, rng.standard_normal(8),
                                        seed=int(rng.integers(2**31)))
    assert report.precision == "float32"
    assert report.jvp_error < 1e-3 and report.second_order_error < 1e-3
    assert any("finite differences with step 4.92e-03 relative" in n for n in report.notes)
    assert "precision='float32'" in repr(report)
    # float64 functions are checked as before, and say nothing about it
    plain = sd.testing.check_rules(lambda x: snp.sin(x), rng.standard_normal(3),
                                   seed=int(rng.integers(2**31)))
    assert plain.precision == "float64" and not plain.notes
    assert "precision" not in repr(plain)


def test_convert_primitive_to_float32_passes(rng):
    report = sd.testing.check_rules(sd.primitives.convert_p, rng.standard_normal(5),
                                    seed=int(rng.integers(2**31)), dtype=np.dtype(np.float32))
    assert report.precision == "float32" and report.jvp_error < 1e-4


def _sin32(jvp_factor: float):
    """sin computed in float32 (a float32 output for a float64 input)."""
    p = _prim("sin32")
    p.def_abstract_eval(lambda x: sd.TensorType(x.shape, np.float32))
    p.def_impl(lambda x: jnp.sin(x).astype(jnp.float32))

    @p.def_jvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return p(x), snp.astype(jvp_factor * t * snp.cos(x), np.float32)

    return p


def test_float32_output_rules_are_still_checked(rng):
    x = rng.standard_normal(6)
    seed = int(rng.integers(2**31))
    report = sd.testing.check_rules(_sin32(1.0), x, seed=seed)
    assert report.precision == "float32" and report.jvp_error < 1e-4
    with pytest.raises(RuleError, match=r"JVP rule disagrees with central finite "
                                        r"differences: relative error 2\.0.*scaled for "
                                        r"the float32 values in the graph"):
        sd.testing.check_rules(_sin32(-1.0), x, seed=seed)
    # a JVP off by 1% is far beyond float32's finite differences (about 1e-5)
    with pytest.raises(RuleError, match=r"relative error 9\.[89]\d\de-03"):
        sd.testing.check_rules(_sin32(1.01), x, seed=seed)


# ---------------------------------------------------------------------------
# taylor_test


def _objective(x):
    return snp.sum(snp.sin(x) * snp.exp(0.3 * x)) + 0.5 * snp.sum(x * x) ** 2


def test_taylor_test_rates_are_two_for_the_true_gradient(rng):
    x, dx = rng.standard_normal(6), rng.standard_normal(6)
    rates = sd.testing.taylor_test(_objective, x, dx)
    assert rates.shape == (4,)
    assert np.all(np.abs(rates - 2.0) < 0.1), rates


def test_taylor_test_fails_a_scaled_gradient(rng):
    x, dx = rng.standard_normal(6), rng.standard_normal(6)
    g = sd.grad(_objective)
    rates = sd.testing.taylor_test(_objective, x, dx, grad=lambda x: 0.9 * np.asarray(g(x)))
    assert np.all(np.abs(rates - 1.0) < 0.2), rates


# ---------------------------------------------------------------------------
# primitive_from_jax


def test_primitive_from_jax_rules_come_from_jax(rng):
    p = sd.primitive_from_jax(lambda x, a: jnp.sin(x) * a ** 2, f"test_pfj_{next(_ids)}")
    x, a = rng.standard_normal(4), np.float64(1.5)
    report = sd.testing.check_rules(p, x, a)
    assert report.second_order_error is not None
    g = sd.trace(sd.grad(lambda x: snp.sum(p(x, a))), x)
    assert f"{p.name}.vjp" in str(g)
    np.testing.assert_allclose(sd.grad(lambda x: snp.sum(p(x, a)))(x),
                               np.cos(x) * a ** 2, rtol=1e-13)


def test_primitive_from_jax_multiple_results_and_integer_inputs(rng):
    p = sd.primitive_from_jax(lambda x, n: (x * n, jnp.cumsum(x)), f"test_pfj_{next(_ids)}",
                              multiple_results=True)
    x = rng.standard_normal(3)
    sd.testing.check_rules(lambda x: list(p(x, np.arange(3))), x)
    with pytest.raises(sd.errors.RegistrationError, match="multiple_results=True"):
        q = sd.primitive_from_jax(lambda x: (x, x), f"test_pfj_{next(_ids)}")
        sd.trace(lambda x: q(x), x)


def test_a_wrong_batch_rule_is_caught_and_a_missing_one_noted(rng):
    p = _sin_like()
    report = sd.testing.check_rules(p, rng.standard_normal(3))
    assert report.batch_error < 1e-14
    assert any("without a batch rule was mapped" in n for n in report.notes)  # no rule

    q = _sin_like()

    @q.def_batch
    def _batch(args, dims):
        (x,), (d,) = args, dims
        return q(snp.flip(x, axis=d)), d  # mixes up the examples

    with pytest.raises(RuleError, match=r"batching: sd.vmap against a loop over examples, "
                                        r"example 0: relative error"):
        sd.testing.check_rules(q, rng.standard_normal(3))


def test_check_rules_batches_only_float_inputs(rng):
    # an integer array is shared by the examples: only x is batched
    report = sd.testing.check_rules(lambda x, k: snp.roll(x, 1) * k, rng.standard_normal(4),
                                    np.arange(4))
    assert report.batch_error < 1e-14 and not report.notes


def test_a_wrong_sparsity_rule_is_caught(rng):
    # a cumulative sum declared elementwise: its JVP has entries below the
    # diagonal that the declared pattern leaves out
    p = sd.primitive("test_rule_checks.cumsum_declared_diagonal", params={})
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: jnp.cumsum(x))
    p.def_jvp(lambda primals, tangents: (p.bind(*primals), snp.cumsum(tangents[0])))
    p.def_transpose(lambda ct, x: (snp.flip(snp.cumsum(snp.flip(ct))),))
    p.def_sparsity(lambda outs, x: x.matrix)
    with pytest.raises(RuleError, match="sparsity rule misses Jacobian entries"):
        sd.testing.check_rules(p, rng.standard_normal(5), second_order=False, batch=False)

    q = sd.primitive("test_rule_checks.cumsum_declared_right", params={})
    q.def_abstract_eval(lambda x: x)
    q.def_impl(lambda x: jnp.cumsum(x))
    q.def_jvp(lambda primals, tangents: (q.bind(*primals), snp.cumsum(tangents[0])))
    q.def_transpose(lambda ct, x: (snp.flip(snp.cumsum(snp.flip(ct))),))

    @q.def_sparsity
    def _lower_triangle(outs, x):
        import scipy.sparse as sps

        return (sps.csr_matrix(np.tril(np.ones((x.size, x.size), bool))) @ x.matrix)

    report = sd.testing.check_rules(q, rng.standard_normal(5), second_order=False, batch=False)
    assert report.sparsity_checked
