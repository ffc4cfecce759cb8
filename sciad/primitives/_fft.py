"""`fft[kind, axes, lengths, norm](x)`: discrete Fourier transforms over `axes`.

One primitive, six kinds, all linear (real-linear where a real value is involved):

- `fft`, `ifft`: complex -> complex, `lengths[i] == x.shape[axes[i]]`.
- `rfft`: real -> complex half spectrum (the last of `axes` has `n // 2 + 1`
  entries, `n = lengths[-1]`).
- `irfft`: complex half spectrum -> real of `lengths` (`numpy.fft.irfftn`: the
  imaginary parts at zero and Nyquist frequency along the last axis are ignored).
- `rfft_adjoint`, `irfft_adjoint`: the transposes of `rfft` and `irfft`. They
  are kinds of their own, not `irfft`/`rfft` plus elementwise fix-ups, so the
  transpose of a transpose is the original and `simplify` can fold a pair of
  them exactly as it folds `irfft(rfft(x))`.

`norm` is NumPy's: "backward" (no scaling forward, 1/N inverse), "ortho"
(1/sqrt(N) both ways) or "forward" (1/N forward). Cropping and zero-padding
(NumPy's `n` and `s`) are separate `getitem`/`pad` nodes inserted by
`sciad.fft`, so here the transformed axes have exactly the sizes the kind
needs, and every rule below is about the transform alone.

Transposes, with the unconjugated pairing `Re sum(ct * y)` that sciad (as JAX)
uses for complex values. Write `F` for the unnormalized DFT over `axes` and
`N = prod(lengths)`:

- `F` is a symmetric matrix, so `fft^T = fft` and `ifft^T = ifft`, each with
  the same `norm`.
- `rfft(x) = S F x` (`S` keeps the half spectrum) for real `x`:
  `rfft^T(c) = Re(F^T S^T c)`. Along the last axis, `Re(sum_j c_j e^{-i th_j k})`
  over the half spectrum is what an inverse real transform gives for the half
  spectrum `conj(c) * w` with weights `w = 1` at zero (and Nyquist, for even
  `n`) and `1/2` elsewhere: the inverse counts each interior frequency twice
  (for itself and its Hermitian mirror). With the scale, for
  `norm = backward` this is `N irfftn(conj(c) w)`: `irfftn` with the "dual"
  norm (backward <-> forward, ortho <-> ortho).
- `irfft(c) = (1/N) Re(conj-symmetric sum)` transposes to
  `irfft^T(t) = conj(m rfftn(t)) / N` with the multiplicities `m = 1/w`
  (1 at zero and Nyquist, 2 elsewhere): again the dual norm.

Each kind's JVP is the same transform of the tangent.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..errors import DTypeError, InvalidOptionError, ShapeError
from ..graph import Primitive, TensorType
from ..graph._batch import front_rule, shift_axes
from ..graph._cost import Cost, size
from ..graph._sparsity import along
from ._shape import _linear_jvp
from ._util import INTS, normalize_axis, tensor

fft_p = Primitive("fft", params={"kind": str, "axes": INTS, "lengths": INTS,
                                 "norm": str})

KINDS = ("fft", "ifft", "rfft", "irfft", "rfft_adjoint", "irfft_adjoint")
NORMS = ("backward", "ortho", "forward")

# the transpose of each kind (same axes, lengths and norm)
TRANSPOSE = {"fft": "fft", "ifft": "ifft", "rfft": "rfft_adjoint",
             "rfft_adjoint": "rfft", "irfft": "irfft_adjoint", "irfft_adjoint": "irfft"}
# (inner, outer) kinds whose composition is the identity (same axes, lengths, norm)
INVERSE_PAIRS = frozenset({("fft", "ifft"), ("ifft", "fft"), ("rfft", "irfft"),
                           ("irfft_adjoint", "rfft_adjoint")})
_REAL_IN = ("rfft", "irfft_adjoint")             # real -> complex half spectrum
_HALF_IN = ("irfft", "rfft_adjoint")             # complex half spectrum -> real


def half_length(n: int) -> int:
    """The number of entries in the half spectrum of a real signal of length `n`."""
    return n // 2 + 1


def _complex_of(dtype: np.dtype) -> np.dtype:
    return np.result_type(dtype, np.complex64)


def _real_of(dtype: np.dtype) -> np.dtype:
    return np.finfo(dtype).dtype


def _check_params(x: TensorType, kind, axes, lengths, norm) -> None:
    if kind not in KINDS:
        raise InvalidOptionError(f"`kind` must be one of {KINDS}, got {kind!r}.", op="fft")
    if norm not in NORMS:
        raise InvalidOptionError(f"`norm` must be one of {NORMS}, got {norm!r}.", op="fft")
    axes, lengths = tuple(axes), tuple(lengths)
    if not axes or len(axes) != len(lengths):
        raise ShapeError(f"`axes` {axes} and `lengths` {lengths} must be non-empty and "
                         "of one length.", op="fft")
    if tuple(normalize_axis(a, x.ndim, "fft") for a in axes) != axes or \
            len(set(axes)) != len(axes):
        raise ShapeError(f"`axes` {axes} must be distinct non-negative axes of "
                         f"{x.str_short()}.", op="fft")
    if any(not isinstance(n, int) or n < 1 for n in lengths):
        raise ShapeError(f"`lengths` must be positive ints, got {lengths}.", op="fft")


@fft_p.def_abstract_eval
def _fft_shape(x, *, kind, axes, lengths, norm):
    x = tensor(x, "fft")
    _check_params(x, kind, axes, lengths, norm)
    if kind in _REAL_IN:
        if x.dtype not in (np.float32, np.float64):
            raise DTypeError(f"kind={kind} transforms float32 or float64 arrays, got "
                             f"{x.str_short()}.", op="fft")
        out_dtype = _complex_of(x.dtype)
    else:
        if x.dtype not in (np.complex64, np.complex128):
            raise DTypeError(f"kind={kind} transforms complex64 or complex128 arrays, got "
                             f"{x.str_short()}.", op="fft")
        out_dtype = _real_of(x.dtype) if kind in _HALF_IN else x.dtype
    want = list(lengths)
    if kind in _HALF_IN:
        want[-1] = half_length(lengths[-1])
    got = [x.shape[a] for a in axes]
    if got != want:
        what = "the half spectrum's sizes " if kind in _HALF_IN else "sizes "
        raise ShapeError(f"kind={kind} with lengths={tuple(lengths)} needs {what}"
                         f"{tuple(want)} along axes {tuple(axes)}, got {x.str_short()}.",
                         op="fft")
    shape = list(x.shape)
    if kind in _REAL_IN:
        shape[axes[-1]] = half_length(lengths[-1])
    elif kind in _HALF_IN:
        shape[axes[-1]] = lengths[-1]
    return TensorType(tuple(shape), out_dtype)


def _hermitian_weights(kind: str, n: int, axis: int, ndim: int, scale: float,
                       dtype) -> np.ndarray:
    """`scale` times the weights along `axis` of the half spectrum of length-`n`
    signals: 1 at zero (and Nyquist, for even `n`) frequency and 2 at the
    others (`irfft_adjoint`), or 1/2 (`rfft_adjoint`); shaped to broadcast
    against an `ndim`-array. The norm's scale is folded in, so an adjoint
    transform costs one elementwise multiply besides its FFT (as JAX's)."""
    w = np.full(half_length(n), 2.0 if kind == "irfft_adjoint" else 0.5)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    shape = [1] * ndim
    shape[axis] = w.size
    return (scale * w).astype(dtype).reshape(shape)


def _jnp_norm(norm: str) -> str | None:
    # None is "backward" without jnp's multiplication by one
    return None if norm == "backward" else norm


@fft_p.def_impl
def _fft_impl(x, *, kind, axes, lengths, norm):
    if kind == "fft":
        return jnp.fft.fftn(x, axes=axes, norm=_jnp_norm(norm))
    if kind == "ifft":
        return jnp.fft.ifftn(x, axes=axes, norm=_jnp_norm(norm))
    if kind == "rfft":
        return jnp.fft.rfftn(x, axes=axes, norm=_jnp_norm(norm))
    if kind == "irfft":
        return jnp.fft.irfftn(x, s=lengths, axes=axes, norm=_jnp_norm(norm))
    # The adjoint kinds: the unnormalized transform and one multiply by the
    # Hermitian weights times the scale of the dual norm (see the docstring).
    size = float(np.prod(lengths, dtype=np.float64))
    real = _real_of(x.dtype)
    if kind == "rfft_adjoint":
        # N irfftn_backward(conj(c) w) for norm=backward; sqrt(N) ortho; 1 forward
        scale = {"backward": size, "ortho": np.sqrt(size), "forward": 1.0}[norm]
        w = _hermitian_weights(kind, lengths[-1], axes[-1], x.ndim, scale, real)
        return jnp.fft.irfftn(jnp.conj(x) * w, s=lengths, axes=axes)
    assert kind == "irfft_adjoint", kind
    # conj(rfftn_backward(t)) m / N for norm=backward; / sqrt(N) ortho; 1 forward
    scale = {"backward": 1.0 / size, "ortho": 1.0 / np.sqrt(size), "forward": 1.0}[norm]
    w = _hermitian_weights(kind, lengths[-1], axes[-1], x.ndim, scale, real)
    return jnp.conj(jnp.fft.rfftn(x, axes=axes)) * w


# linear: the tangent goes through the same transform (a Zero tangent or
# cotangent never reaches a one-operand rule: the transforms skip the node)
fft_p.def_jvp(_linear_jvp(fft_p))


@fft_p.def_transpose
def _fft_transpose(ct, x, *, kind, axes, lengths, norm):
    # see the module docstring: fft and ifft are symmetric, the real kinds
    # transpose into their adjoint kinds (and back)
    return (fft_p.bind(ct, kind=TRANSPOSE[kind], axes=axes, lengths=lengths, norm=norm),)


@fft_p.def_simplify
def _fft_simplify(node, producer):
    # ifft(fft(x)) -> x, fft(ifft(x)) -> x, irfft(rfft(x)) -> x and
    # rfft_adjoint(irfft_adjoint(x)) -> x (the transpose of the previous one),
    # for the same axes, lengths and norm. rfft(irfft(c)) is not c: irfft
    # drops the imaginary parts at zero and Nyquist frequency.
    inner = producer(node.inputs[0])
    if inner is None or inner.primitive is not fft_p:
        return None
    p, q = node.params, inner.params
    if (q["kind"], p["kind"]) not in INVERSE_PAIRS:
        return None
    if any(p[k] != q[k] for k in ("axes", "lengths", "norm")):
        return None
    return inner.inputs[0]


@fft_p.def_cost
def _fft_cost(node, body):
    # 5 n log2 n real FLOPs per complex transform of length n (half for a
    # real one), over every transform in the batch

    n = float(np.prod(node.params["lengths"])) if node.params["lengths"] else 1.0
    elems = max(size(node.inputs[0].type), size(node.outputs[0].type))
    real = node.params["kind"] != "fft" and node.params["kind"] != "ifft"
    return Cost((2.5 if real else 5.0) * elems * np.log2(max(n, 2.0)))


# Sparsity: an output element depends on every input element of its line
# (the elements that share its position on the axes not transformed, whose
# sizes the transform keeps; along the transformed ones it mixes them all).

@fft_p.def_sparsity
def _fft_sparsity(outs, x, *, kind, axes, lengths, norm):
    return along(outs[0], x, axes)


def _install_batch_rule() -> None:
    fft_p.def_batch(front_rule(fft_p, shift_axes("axes")))


_install_batch_rule()
