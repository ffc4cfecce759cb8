"""The FFT family: values and dtypes against `numpy.fft`, every kind's rules
(`check_rules` for each norm, even and odd lengths, several axes), gradients
and second derivatives of real losses through complex intermediates against
`jax.grad` of the same `jax.numpy.fft` code, the folding of inverse pairs, and
the errors users see."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import DTypeError, InvalidOptionError, NotSupportedError, ShapeError
from sciad.primitives import fft_p

NORMS = (None, "backward", "ortho", "forward")


def _c(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _fft_nodes(graph):
    return [n for n in graph.nodes if n.primitive is fft_p]


# ---------------------------------------------------------------------------
# values against numpy.fft

# (function name, input shape, kwargs)
CASES = [
    ("fft", (7,), {}),
    ("fft", (3, 8), {"n": 5}),
    ("fft", (4, 3), {"n": 6, "axis": 0}),
    ("ifft", (3, 6), {"axis": -1}),
    ("ifft", (5, 2), {"n": 3, "axis": 0}),
    ("rfft", (9,), {}),
    ("rfft", (3, 8), {"n": 11}),
    ("rfft", (6, 3), {"n": 4, "axis": 0}),
    ("irfft", (5,), {}),
    ("irfft", (3, 5), {"n": 9}),
    ("irfft", (3, 5), {"n": 4}),
    ("irfft", (4, 3), {"axis": 0, "n": 7}),
    ("hfft", (5,), {}),
    ("hfft", (3, 4), {"n": 5, "axis": 0}),
    ("ihfft", (6,), {}),
    ("ihfft", (3, 7), {"n": 4}),
    ("fft2", (4, 5), {}),
    ("fft2", (2, 4, 5), {"s": (3, 7)}),
    ("ifft2", (4, 6), {"axes": (1, 0)}),
    ("rfft2", (4, 6), {}),
    ("rfft2", (3, 4, 5), {"axes": (0, 2), "s": (5, 3)}),
    ("irfft2", (4, 4), {}),
    ("irfft2", (4, 3), {"s": (5, 5)}),
    ("fftn", (2, 3, 4), {}),
    ("fftn", (2, 3, 4), {"axes": (2, 0)}),
    ("fftn", (2, 3, 4), {"s": (4, -1), "axes": (0, 1)}),
    ("fftn", (2, 3, 4, 5), {}),
    ("ifftn", (3, 4, 2), {"axes": (0, 1)}),
    ("rfftn", (2, 3, 4), {}),
    ("rfftn", (2, 3, 4), {"axes": (2, 0)}),
    ("rfftn", (2, 3, 4, 3), {"axes": (1, 0, 3, 2)}),
    ("irfftn", (2, 3, 4), {}),
    ("irfftn", (4, 3, 5), {"axes": (2, 0), "s": (6, 3)}),
    ("irfftn", (4, 5), {"s": (-1, -1), "axes": (0, 1)}),
]


def _input(rng, name, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    if np.dtype(dtype).kind in "iu":
        x = rng.integers(-5, 5, shape)
    return x.astype(dtype)


def _check_value(got, want):
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
    tol = 1e-5 if want.dtype in (np.float32, np.complex64) else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("name,shape,kw", CASES)
def test_values_match_numpy(rng, name, shape, kw):
    f = getattr(sd.fft, name)
    # every dtype (NumPy 2's precision rules), eagerly
    for dtype in (np.float64, np.complex128, np.float32, np.complex64, np.int64):
        if name in ("rfft", "rfft2", "rfftn", "ihfft") and np.dtype(dtype).kind == "c":
            continue
        x = _input(rng, name, shape, dtype)
        _check_value(f(x, **kw), getattr(np.fft, name)(x, **kw))
    # every norm, eagerly and compiled
    x = _input(rng, name, shape, np.float64)
    compiled = sd.function(lambda x: [f(x, norm=norm, **kw) for norm in NORMS])(x)
    for norm, got in zip(NORMS, compiled):
        want = getattr(np.fft, name)(x, norm=norm, **kw)
        _check_value(f(x, norm=norm, **kw), want)
        _check_value(got, want)


def test_snp_fft_is_sd_fft_and_numpy_dispatches(rng):
    assert snp.fft is sd.fft
    x = rng.standard_normal((3, 8))
    g = sd.trace(lambda x: np.fft.irfft(np.fft.rfft(x, axis=0), n=3, axis=0), x)
    assert [n.params["kind"] for n in _fft_nodes(g)] == ["rfft", "irfft"]
    np.testing.assert_allclose(sd.graph.evaluate(g, x)[0], x, atol=1e-14)


def test_helpers_match_numpy(rng):
    for n in (1, 4, 7):
        for d in (1.0, 0.1, 3):
            np.testing.assert_array_equal(sd.fft.fftfreq(n, d), np.fft.fftfreq(n, d))
            np.testing.assert_array_equal(sd.fft.rfftfreq(n, d), np.fft.rfftfreq(n, d))
    assert sd.fft.fftfreq(4, dtype=np.float32).dtype == np.float32
    x = rng.standard_normal((4, 5, 3))
    for axes in (None, 0, (1, 2), (-1,)):
        np.testing.assert_array_equal(np.asarray(sd.fft.fftshift(x, axes)),
                                      np.fft.fftshift(x, axes))
        np.testing.assert_array_equal(np.asarray(sd.fft.ifftshift(x, axes)),
                                      np.fft.ifftshift(x, axes))
        back = sd.fft.ifftshift(sd.fft.fftshift(x, axes), axes)
        np.testing.assert_array_equal(np.asarray(back), x)
    # a traced spacing: frequencies differentiable in d
    k = sd.function(lambda d: sd.fft.fftfreq(6, d))(np.float64(0.5))
    np.testing.assert_allclose(np.asarray(k), np.fft.fftfreq(6, 0.5), rtol=1e-15)
    dk = sd.grad(lambda d: snp.sum(sd.fft.rfftfreq(6, d) ** 2))(np.float64(0.5))
    k1 = np.fft.rfftfreq(6, 1.0)
    np.testing.assert_allclose(float(dk), -2 * np.sum(k1 ** 2) / 0.5 ** 3, rtol=1e-13)


# ---------------------------------------------------------------------------
# rules of every kind


def _rule_cases(rng):
    c = lambda *s: _c(rng, *s)
    r = rng.standard_normal
    cases = []
    for n in (1, 2, 5, 6):
        h = n // 2 + 1
        cases += [
            ("fft", c(3, n), (1,), (n,)),
            ("ifft", c(n, 3), (0,), (n,)),
            ("rfft", r((3, n)), (1,), (n,)),
            ("irfft", c(3, h), (1,), (n,)),
            ("rfft_adjoint", c(h, 3), (0,), (n,)),
            ("irfft_adjoint", r((3, n)), (1,), (n,)),
        ]
    # several axes, the half-spectrum axis first in the array
    cases += [
        ("fft", c(4, 3, 5), (0, 2), (4, 5)),
        ("ifft", c(2, 3, 4), (0, 1, 2), (2, 3, 4)),
        ("rfft", r((5, 3, 4)), (2, 0), (4, 5)),
        ("irfft", c(3, 3, 4), (2, 0), (4, 4)),
        ("rfft_adjoint", c(3, 2, 4), (1, 2, 0), (2, 4, 4)),
        ("irfft_adjoint", r((4, 2, 6)), (1, 0), (2, 4)),
    ]
    return cases


# (11 s: every kind's rules are also the registry walk's, test_autodiff's
# check_rules of `fft`'s example, which binds each kind)
@pytest.mark.slow
@pytest.mark.parametrize("norm", ("backward", "ortho", "forward"))
def test_check_rules_every_kind(rng, norm):
    for kind, x, axes, lengths in _rule_cases(rng):
        report = sd.testing.check_rules(fft_p, x, kind=kind, axes=axes, lengths=lengths,
                                        norm=norm)
        assert report.jvp_error <= 1e-6 and report.vjp_error <= 1e-10, (kind, report)
        assert "second_order" not in report.skipped


def test_check_rules_public_functions(rng):
    x, z = rng.standard_normal((4, 6)), _c(rng, 4, 6)
    for f, arg in [
        (lambda x: sd.fft.rfft(x, n=9, norm="ortho"), x),
        (lambda x: sd.fft.irfft(x, n=5, axis=0), z),
        (lambda x: sd.fft.irfftn(x, s=(3, 8), norm="forward"), z),
        (lambda x: sd.fft.hfft(x, n=7), z),
        (lambda x: sd.fft.ihfft(x, axis=0, norm="forward"), x),
        (lambda x: sd.fft.fftshift(sd.fft.fft2(x, s=(5, 3))), z),
        (lambda x: sd.fft.ifftshift(sd.fft.rfft2(x), axes=0), x),
    ]:
        sd.testing.check_rules(f, arg)


def test_transposes_are_each_others_and_dtype_preserving(rng):
    from sciad.primitives._fft import KINDS, TRANSPOSE

    assert all(TRANSPOSE[TRANSPOSE[k]] == k for k in KINDS)
    # float32 / complex64 cotangents stay single precision
    x = rng.standard_normal((4, 6)).astype(np.float32)
    g = sd.grad(lambda x: snp.sum(snp.abs(sd.fft.rfft2(x)) ** 2))(x)
    assert np.asarray(g).dtype == np.float32
    # Parseval: sum |rfft2(x)|^2 counts interior frequencies once, not twice
    ref = jax.grad(lambda x: jnp.sum(jnp.abs(jnp.fft.rfft2(x)) ** 2))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref), rtol=2e-4, atol=1e-3)


# ---------------------------------------------------------------------------
# gradients and second derivatives against jax.grad of the same code


def _spectral_losses():
    """Real losses through complex intermediates, written once for both
    `jax.numpy` and `sciad.numpy` (`xp.fft` is `jnp.fft` or `sd.fft`)."""

    def smooth(x, xp):        # rfft -> filter -> irfft, odd length
        k = xp.fft.rfftfreq(x.shape[-1])
        y = xp.fft.irfft(xp.fft.rfft(x) * xp.exp(-20.0 * k ** 2) * (1 + 0.5j), n=x.shape[-1])
        return xp.sum(y ** 2 * xp.sin(x))

    def power(x, xp):         # |fft|^2 with ortho norm and padding
        X = xp.fft.fft(x * xp.cos(x), n=x.shape[-1] + 3, norm="ortho")
        return xp.sum(xp.abs(X) ** 2 * xp.arange(X.shape[-1])) + xp.sum(xp.real(X) ** 3)

    def conv2(x, xp):         # a 2-D periodic convolution, forward norm
        X = xp.fft.rfft2(x, norm="forward")
        K = xp.exp(-xp.fft.fftfreq(x.shape[0])[:, None] ** 2
                   - xp.fft.rfftfreq(x.shape[1])[None, :] ** 2)
        y = xp.fft.irfft2(X * K, s=x.shape, norm="forward")
        return xp.sum(xp.tanh(y) * x)

    def complex_path(x, xp):  # fftn over two axes, ifft along one, hfft
        Z = xp.fft.fftn(x, axes=(0, 2))
        w = xp.fft.ifft(Z * xp.conj(Z), axis=1, norm="ortho")
        h = xp.fft.hfft(w[:, :, :2], n=3, axis=2)
        return xp.sum(xp.real(w) * xp.imag(w)) + xp.sum(h ** 2)

    def crop(x, xp):          # irfftn of a cropped spectrum, ihfft, shifts
        X = xp.fft.rfftn(x)
        y = xp.fft.irfftn(X[:, :2], s=(x.shape[0], 3))
        v = xp.fft.ihfft(xp.fft.fftshift(x, axes=0), axis=0, norm="ortho")
        return xp.sum(y ** 3) + xp.sum(xp.abs(v) ** 2)

    return {"smooth": (smooth, (2, 9)), "power": (power, (3, 6)), "conv2": (conv2, (6, 5)),
            "complex_path": (complex_path, (3, 4, 5)), "crop": (crop, (4, 6))}


LOSSES = _spectral_losses()


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradient_and_hvp_match_jax(rng, name):
    f, shape = LOSSES[name]
    x, v = rng.standard_normal(shape), rng.standard_normal(shape)
    grad_jnp = jax.grad(lambda x: f(x, jnp))
    with jax.enable_x64(True):  # compiled: JAX op by op takes seconds here
        want_g = np.asarray(jax.jit(grad_jnp)(x))
        want_h = np.asarray(jax.jit(lambda x, v: jax.jvp(grad_jnp, (x,), (v,))[1])(x, v))
    got_g = np.asarray(sd.grad(lambda x: f(x, snp))(x))
    got_h = np.asarray(sd.hvp(lambda x: f(x, snp), x, v))
    np.testing.assert_allclose(got_g, want_g, rtol=1e-11, atol=1e-11 * np.abs(want_g).max())
    np.testing.assert_allclose(got_h, want_h, rtol=1e-10, atol=1e-10 * np.abs(want_h).max())
    rates = sd.testing.taylor_test(lambda x: f(x, snp), x, v)
    assert np.all(np.abs(rates[-2:] - 2) < 0.1), rates


def test_gradient_wrt_complex_input_matches_jax(rng):
    z = _c(rng, 4, 6)

    def f(z, xp):
        Y = xp.fft.fft2(z, norm="ortho")
        y = xp.fft.irfft(Y[:, :3] * xp.conj(Y[:, 1:4]), n=5)
        return xp.sum(y ** 2) + xp.sum(xp.real(xp.fft.ifft(z, axis=0)) * xp.imag(z))

    with jax.enable_x64(True):
        want = np.asarray(jax.jit(jax.grad(lambda z: f(z, jnp)))(z))
    got = np.asarray(sd.grad(lambda z: f(z, snp))(z))
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


def test_irfft_ignores_imaginary_parts_at_zero_and_nyquist(rng):
    # the gradient with respect to the imaginary part of c_0 and c_{n/2} is zero
    c = _c(rng, 5)
    g = np.asarray(sd.grad(lambda c: snp.sum(sd.fft.irfft(c, n=8) ** 2))(c))
    with jax.enable_x64(True):
        want = np.asarray(jax.grad(lambda c: jnp.sum(jnp.fft.irfft(c, n=8) ** 2))(c))
    np.testing.assert_allclose(g, want, atol=1e-14)
    # JAX's convention: the gradient of a real loss is the conjugate of dL/dRe + i dL/dIm
    assert g[0].imag == 0 and g[-1].imag == 0 and np.all(g[1:-1].imag != 0)


# ---------------------------------------------------------------------------
# simplification


def test_inverse_pairs_fold(rng):
    x, z = rng.standard_normal((4, 6)), _c(rng, 4, 6)
    opt = sd.graph.passes.optimize
    for f, arg in [
        (lambda z: sd.fft.ifft(sd.fft.fft(z, axis=0), axis=0) * 2.0, z),
        (lambda z: sd.fft.fft2(sd.fft.ifft2(z, norm="ortho"), norm="ortho") * 2.0, z),
        (lambda z: sd.fft.ifftn(sd.fft.fftn(z, axes=(1, 0)), axes=(0, 1)) * 2.0, z),
        (lambda x: sd.fft.irfft2(sd.fft.rfft2(x, norm="forward"), s=x.shape,
                                 norm="forward") * 2.0, x),
        (lambda x: sd.fft.irfft(sd.fft.rfft(x, n=9), n=9)[:, :6] * 2.0, x),
    ]:
        g = sd.trace(f, arg)
        assert len(_fft_nodes(g)) == 2
        o = opt(g)
        assert not _fft_nodes(o), str(o)
        np.testing.assert_allclose(sd.graph.evaluate(o, arg)[0],
                                   sd.graph.evaluate(g, arg)[0], atol=1e-14)


def test_non_inverse_pairs_do_not_fold(rng):
    x, z = rng.standard_normal((4, 6)), _c(rng, 4, 4)
    opt = sd.graph.passes.optimize
    for f, arg in [
        (lambda z: sd.fft.ifft(sd.fft.fft(z), norm="ortho"), z),      # norms differ
        (lambda z: sd.fft.ifft(sd.fft.fft(z, axis=0), axis=1), z),      # axes differ
        (lambda z: sd.fft.fft(sd.fft.fft(z)), z),                       # not inverse
        (lambda z: sd.fft.rfft(sd.fft.irfft(z, n=6)), z),               # drops Im(c_0)
        (lambda x: sd.fft.irfft(sd.fft.rfft(x), n=7), x),               # lengths differ
    ]:
        g = sd.trace(f, arg)
        o = opt(g)
        assert len(_fft_nodes(o)) == 2, str(o)
        np.testing.assert_allclose(sd.graph.evaluate(o, arg)[0],
                                   sd.graph.evaluate(g, arg)[0], atol=1e-13)


def test_pairs_created_by_reverse_mode_fold(rng):
    # the unoptimized forward irfft(rfft(x)): its backward is
    # rfft_adjoint(irfft_adjoint(ct)), the transpose of the pair, and folds too
    x = rng.standard_normal((3, 8))

    def f(x):
        y = sd.fft.irfft(sd.fft.rfft(x, norm="ortho"), n=8, norm="ortho")
        z = sd.fft.ifft(sd.fft.fft(y * x))
        return snp.sum(snp.real(z) ** 2)

    g = sd.trace(f, x)
    vg = sd.graph.vjp_graph(g)
    kinds = [n.params["kind"] for n in _fft_nodes(vg.backward)]
    assert sorted(kinds) == ["fft", "ifft", "irfft_adjoint", "rfft_adjoint"], kinds
    assert not _fft_nodes(sd.graph.passes.optimize(vg.backward))
    gg = sd.trace(sd.grad(f), x)
    assert _fft_nodes(gg) and not _fft_nodes(sd.graph.passes.optimize(gg))
    np.testing.assert_allclose(np.asarray(sd.grad(f)(x)), 4 * x ** 3, rtol=1e-12)


def test_simplify_rule_results_are_checked():
    p = sd.primitive("test_fft_bad_simplify")
    p.def_abstract_eval(lambda x: x)
    p.def_impl(lambda x: x)
    p.def_simplify(lambda node, producer: sd.graph.Literal(np.zeros(2)))
    g = sd.trace(lambda x: p(x), np.zeros(3))
    with pytest.raises(sd.errors.RuleError, match="f64\\[3\\]"):
        sd.graph.passes.simplify(g)


# ---------------------------------------------------------------------------
# errors


def test_errors_name_the_op_and_the_line(rng):
    x, z = rng.standard_normal((4, 6)), _c(rng, 4, 6)
    with pytest.raises(InvalidOptionError, match=r"fft: `norm` must be one of .*got 'unitary'"):
        sd.trace(lambda x: sd.fft.fft(x, norm="unitary"), x)
    with pytest.raises(ShapeError, match=r"rfft: invalid number of FFT data points \(0\)"):
        sd.trace(lambda x: sd.fft.rfft(x, n=0), x)
    with pytest.raises(ShapeError, match="irfft: invalid number of FFT data points"):
        sd.fft.irfft(np.ones(1) + 0j)
    with pytest.raises(ShapeError, match="axis 2 is out of bounds"):
        sd.trace(lambda x: sd.fft.fft(x, axis=2), x)
    with pytest.raises(NotSupportedError, match="repeated axes"):
        sd.trace(lambda x: sd.fft.fftn(x, axes=(0, 0)), x)
    with pytest.raises(ShapeError, match="`s` \\(3,\\) and `axes` \\(0, 1\\)"):
        sd.fft.rfftn(x, s=(3,), axes=(0, 1))
    with pytest.raises(DTypeError, match="rfft2: expects a real array, got c128\\[4,6\\]"):
        sd.trace(lambda z: sd.fft.rfft2(z), z)
    with pytest.raises(DTypeError, match="sparse"):
        sd.fft.fft(sd.sparse.coo_matrix((np.ones(3), (np.arange(3), np.arange(3))),
                                        shape=(3, 3)))
    with pytest.raises(InvalidOptionError, match="positive int"):
        sd.fft.fftfreq(0)
    try:
        sd.trace(lambda x: sd.fft.irfft(x, norm="bad"), z)
    except InvalidOptionError as e:
        assert "test_fft.py" in str(e)
    else:
        raise AssertionError("no error")


def test_primitive_shape_rule_errors(rng):
    z = _c(rng, 4, 6)
    with pytest.raises(ShapeError, match=r"kind=irfft with lengths=\(6,\) needs the half "
                                         r"spectrum's sizes \(4,\) along axes \(1,\)"):
        sd.trace(lambda z: fft_p.bind(z, kind="irfft", axes=(1,), lengths=(6,),
                                      norm="backward"), z)
    with pytest.raises(DTypeError, match="kind=fft transforms complex64 or complex128"):
        sd.trace(lambda x: fft_p.bind(x, kind="fft", axes=(0,), lengths=(4,),
                                      norm="backward"), z.real)
    with pytest.raises(InvalidOptionError, match="`kind` must be one of"):
        sd.trace(lambda z: fft_p.bind(z, kind="dct", axes=(0,), lengths=(4,),
                                      norm="backward"), z)
    with pytest.raises(ShapeError, match="distinct non-negative axes"):
        sd.trace(lambda z: fft_p.bind(z, kind="fft", axes=(-1,), lengths=(6,),
                                      norm="backward"), z)
