"""Discrete Fourier transforms with `numpy.fft`'s semantics, differentiable.

```python
import sciad as sd

def smooth(u, sigma):
    k = sd.fft.rfftfreq(u.shape[-1]) * 2 * np.pi
    return sd.fft.irfft(sd.fft.rfft(u) * ops.exp(-0.5 * (sigma * k) ** 2), n=u.shape[-1])
```

`fft, ifft, rfft, irfft, hfft, ihfft` (one axis), `fft2, ifft2, rfft2, irfft2`
(two axes), `fftn, ifftn, rfftn, irfftn` (any axes) take NumPy's arguments:
`n` / `s` (crop or zero-pad the input to this transform length; `-1` in `s`
keeps an axis's size), `axis` / `axes`, and `norm` in `{"backward", "ortho",
"forward"}` (None is "backward"). Dtypes are NumPy 2's: float32 and complex64
transform in single precision, float64, complex128, integer and boolean
arrays in double. `fftfreq`, `rfftfreq`, `fftshift` and `ifftshift` are the
helpers. The module is also `sciad.numpy.fft`, and `numpy.fft.fft(x)` on a
traced `x` runs `sciad.fft.fft`.

Each transform is one `fft` node in the graph (see `sciad.primitives._fft`):
a linear primitive whose transpose has the right normalization and
conjugation for every `norm` and the Hermitian half-spectrum weights for the
real transforms, so gradients through complex intermediates match
`jax.grad` of the same `jax.numpy.fft` code. `optimize` folds a transform
applied to its inverse (same axes, lengths and norm), also where reverse mode
creates the pair. Cropping and padding are `getitem` / `pad` nodes.

Unlike NumPy, an axis may not be transformed twice in one call (repeated
`axes`); call the function twice instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import _ops as ops
from ._ops import _as_array, _is_sparse, _type_str, normalize_axis
from .errors import DTypeError, InvalidOptionError, NotSupportedError, ShapeError, plain
from .graph import Tracer
from .primitives._fft import NORMS, fft_p, half_length

__all__ = [
    "fft", "ifft", "rfft", "irfft", "hfft", "ihfft",
    "fft2", "ifft2", "rfft2", "irfft2",
    "fftn", "ifftn", "rfftn", "irfftn",
    "fftfreq", "rfftfreq", "fftshift", "ifftshift",
]

_SWAP_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


# ---------------------------------------------------------------------------
# argument handling


def _norm(norm, op: str) -> str:
    norm = "backward" if norm is None else norm
    if norm not in NORMS:
        raise InvalidOptionError(f"`norm` must be one of {NORMS} or None, got {norm!r}.", op=op)
    return norm


def _array(a, op: str):
    if _is_sparse(a):
        raise DTypeError("transforms dense arrays, got a sparse matrix (use "
                         "`.todense()` first).", op=op)
    return _as_array(a, op)


def _complex(a, op: str):
    """`a` as complex64 / complex128 (NumPy 2's precision rules)."""
    dt = np.dtype(a.dtype)
    if dt.kind == "c":
        want = np.dtype(np.complex128) if dt.itemsize > 16 else dt
    elif dt.kind == "f" and dt.itemsize <= 4:
        want = np.dtype(np.complex64)
    elif dt.kind in "biuf":
        want = np.dtype(np.complex128)
    else:
        raise DTypeError(f"expected a numeric array, got dtype {dt}.", op=op)
    return ops.astype(a, want) if dt != want else a


def _real(a, op: str):
    """`a` as float32 / float64; complex input is an error (as in NumPy)."""
    dt = np.dtype(a.dtype)
    if dt.kind == "c":
        raise DTypeError(f"expects a real array, got {_type_str(a)}; use `fft` for "
                         "complex input, or pass `x.real`.", op=op)
    if dt.kind == "f":
        want = np.dtype(np.float32) if dt.itemsize <= 4 else np.dtype(np.float64)
    elif dt.kind in "biu":
        want = np.dtype(np.float64)
    else:
        raise DTypeError(f"expected a numeric array, got dtype {dt}.", op=op)
    return ops.astype(a, want) if dt != want else a


def _resize(x, axis: int, size: int):
    """`x` cropped or zero-padded at the end of `axis` to `size`."""
    have = x.shape[axis]
    if have == size:
        return x
    if have > size:
        index = (slice(None),) * axis + (slice(0, size),)
        return x[index]
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - have)
    return ops.pad(x, widths)


def _axes(a, axes, op: str) -> list[int]:
    out = [normalize_axis(ax, a.ndim, op) for ax in axes]
    if len(set(out)) != len(out):
        raise NotSupportedError(f"repeated axes {tuple(axes)}: an axis is transformed "
                                "once per call (call the function twice to transform "
                                "it twice).", op=op)
    return out


def _nd_args(a, s, axes, op: str, inverse_real: bool = False):
    """NumPy's `s` and `axes` rules (`_cook_nd_args`): the axes and the
    transform length along each."""
    if axes is None:
        axes = list(range(a.ndim)) if s is None else list(range(-len(s), 0))
    elif isinstance(axes, (int, np.integer)):
        axes = [axes]
    axes = _axes(a, list(axes), op)
    if s is None:
        lengths = [a.shape[ax] for ax in axes]
        if inverse_real and axes:
            lengths[-1] = 2 * (a.shape[axes[-1]] - 1)
    else:
        if isinstance(s, (int, np.integer)):
            s = [s]
        s = list(s)
        if len(s) != len(axes):
            raise ShapeError(f"`s` {tuple(s)} and `axes` {tuple(axes)} have different "
                             "lengths.", op=op)
        lengths = [a.shape[ax] if int(n) == -1 else int(n) for n, ax in zip(s, axes)]
    for n in lengths:
        if n < 1:
            raise ShapeError(f"invalid number of FFT data points ({n}) for "
                             f"{_type_str(a)} along axes {tuple(axes)}.", op=op)
    return axes, lengths


def _one_axis(a, n, axis, op: str, inverse_real: bool = False):
    if isinstance(n, Tracer) or isinstance(axis, Tracer):
        raise ShapeError("`n` and `axis` must be static ints.", op=op)
    axes = _axes(a, [axis], op)
    if n is None:
        n = 2 * (a.shape[axes[0]] - 1) if inverse_real else a.shape[axes[0]]
    n = int(n)
    if n < 1:
        raise ShapeError(f"invalid number of FFT data points ({n}) for {_type_str(a)} "
                         f"along axis {axis}.", op=op)
    return axes, [n]


# ---------------------------------------------------------------------------
# the three families


def _c2c(kind: str, a, axes: list[int], lengths: list[int], norm: str, op: str):
    if not axes:
        return a
    x = _complex(a, op)
    for ax, n in zip(axes, lengths):
        x = _resize(x, ax, n)
    order = sorted(range(len(axes)), key=lambda i: axes[i])   # canonical: sorted axes
    return fft_p.bind(x, kind=kind, axes=tuple(axes[i] for i in order),
                      lengths=tuple(lengths[i] for i in order), norm=norm)


def _real_axes(axes: list[int], lengths: list[int], op: str):
    """The real transforms' canonical param order: the other axes sorted, the
    (half-spectrum) last axis last."""
    if not axes:
        raise ShapeError("needs at least one axis to transform.", op=op)
    order = sorted(range(len(axes) - 1), key=lambda i: axes[i]) + [len(axes) - 1]
    return tuple(axes[i] for i in order), tuple(lengths[i] for i in order)


def _r2c(a, axes, lengths, norm: str, op: str):
    x = _real(a, op)
    for ax, n in zip(axes, lengths):
        x = _resize(x, ax, n)
    axes_p, lengths_p = _real_axes(axes, lengths, op)
    return fft_p.bind(x, kind="rfft", axes=axes_p, lengths=lengths_p, norm=norm)


def _c2r(a, axes, lengths, norm: str, op: str):
    x = _complex(a, op)
    sizes = list(lengths)
    if axes:
        sizes[-1] = half_length(lengths[-1])
    for ax, n in zip(axes, sizes):
        x = _resize(x, ax, n)
    axes_p, lengths_p = _real_axes(axes, lengths, op)
    return fft_p.bind(x, kind="irfft", axes=axes_p, lengths=lengths_p, norm=norm)


def _transform(kind: str, a, n_or_s, axis_or_axes, norm, op: str, one_axis: bool):
    """`kind` ("fft", "ifft", "rfft" or "irfft") of `a`, with NumPy's one-axis
    (`n`, `axis`) or n-axis (`s`, `axes`) arguments; errors name `op`."""
    a = _array(a, op)
    parse = _one_axis if one_axis else _nd_args
    axes, lengths = parse(a, n_or_s, axis_or_axes, op, inverse_real=kind == "irfft")
    norm = _norm(norm, op)
    if kind == "rfft":
        return _r2c(a, axes, lengths, norm, op)
    if kind == "irfft":
        return _c2r(a, axes, lengths, norm, op)
    return _c2c(kind, a, axes, lengths, norm, op)


# ---------------------------------------------------------------------------
# public transforms


def fft(a, n: int | None = None, axis: int = -1, norm: str | None = None):
    """The one-dimensional discrete Fourier transform (`numpy.fft.fft`).

    `n` crops or zero-pads the input along `axis`; `norm` is "backward"
    (default, unscaled), "ortho" or "forward" (scaled by `1/n`). Returns a
    complex array. Differentiable (linear) in `a`.
    """
    return _transform("fft", a, n, axis, norm, "fft", one_axis=True)


def ifft(a, n: int | None = None, axis: int = -1, norm: str | None = None):
    """The one-dimensional inverse discrete Fourier transform (`numpy.fft.ifft`):
    `ifft(fft(a)) == a` for the same `norm`."""
    return _transform("ifft", a, n, axis, norm, "ifft", one_axis=True)


def rfft(a, n: int | None = None, axis: int = -1, norm: str | None = None):
    """The discrete Fourier transform of real input (`numpy.fft.rfft`): the
    `n // 2 + 1` non-negative frequency terms."""
    return _transform("rfft", a, n, axis, norm, "rfft", one_axis=True)


def irfft(a, n: int | None = None, axis: int = -1, norm: str | None = None):
    """The inverse of `rfft` (`numpy.fft.irfft`): a real array of length `n`
    along `axis` (default `2 * (m - 1)` for `m` input frequencies). The input
    is cropped or zero-padded to `n // 2 + 1` frequencies; the imaginary parts
    at zero (and, for even `n`, Nyquist) frequency are ignored, and so carry
    a zero gradient."""
    return _transform("irfft", a, n, axis, norm, "irfft", one_axis=True)


def hfft(a, n: int | None = None, axis: int = -1, norm: str | None = None):
    """The transform of a Hermitian-symmetric signal given by its first half
    (`numpy.fft.hfft`): a real spectrum of length `n` (default `2 * (m - 1)`)."""
    conj = ops.conj(_complex(_array(a, "hfft"), "hfft"))
    return _transform("irfft", conj, n, axis, _SWAP_NORM[_norm(norm, "hfft")], "hfft",
                      one_axis=True)


def ihfft(a, n: int | None = None, axis: int = -1, norm: str | None = None):
    """The inverse of `hfft` (`numpy.fft.ihfft`): the `n // 2 + 1` first terms
    of the inverse transform of a real signal."""
    return ops.conj(_transform("rfft", a, n, axis, _SWAP_NORM[_norm(norm, "ihfft")], "ihfft",
                               one_axis=True))


def fftn(a, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
         norm: str | None = None):
    """The N-dimensional discrete Fourier transform over `axes` (all axes by
    default; the last `len(s)` axes when only `s` is given) (`numpy.fft.fftn`)."""
    return _transform("fft", a, s, axes, norm, "fftn", one_axis=False)


def ifftn(a, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
          norm: str | None = None):
    """The N-dimensional inverse discrete Fourier transform (`numpy.fft.ifftn`)."""
    return _transform("ifft", a, s, axes, norm, "ifftn", one_axis=False)


def rfftn(a, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
          norm: str | None = None):
    """The N-dimensional transform of real input (`numpy.fft.rfftn`): the last
    of `axes` keeps its `s[-1] // 2 + 1` non-negative frequencies."""
    return _transform("rfft", a, s, axes, norm, "rfftn", one_axis=False)


def irfftn(a, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
           norm: str | None = None):
    """The inverse of `rfftn` (`numpy.fft.irfftn`): a real array with lengths
    `s` along `axes` (the last defaults to `2 * (m - 1)`)."""
    return _transform("irfft", a, s, axes, norm, "irfftn", one_axis=False)


def fft2(a, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1),
         norm: str | None = None):
    """`fftn` over the last two axes by default (`numpy.fft.fft2`)."""
    return _transform("fft", a, s, axes, norm, "fft2", one_axis=False)


def ifft2(a, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1),
          norm: str | None = None):
    """`ifftn` over the last two axes by default (`numpy.fft.ifft2`)."""
    return _transform("ifft", a, s, axes, norm, "ifft2", one_axis=False)


def rfft2(a, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1),
          norm: str | None = None):
    """`rfftn` over the last two axes by default (`numpy.fft.rfft2`)."""
    return _transform("rfft", a, s, axes, norm, "rfft2", one_axis=False)


def irfft2(a, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1),
           norm: str | None = None):
    """`irfftn` over the last two axes by default (`numpy.fft.irfft2`)."""
    return _transform("irfft", a, s, axes, norm, "irfft2", one_axis=False)


# ---------------------------------------------------------------------------
# helpers


def _spacing(d, op: str):
    if isinstance(d, Tracer):
        return d
    d = np.asarray(d)
    if d.ndim != 0 or d.dtype.kind not in "biuf":
        raise ShapeError(f"the sample spacing `d` must be a real scalar, got {plain(d)}.", op=op)
    return float(d)


def _count(n, op: str) -> int:
    if isinstance(n, Tracer) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidOptionError(f"`n` must be a positive int, got {plain(n)}.", op=op)
    return int(n)


def fftfreq(n: int, d=1.0, *, dtype=None):
    """The sample frequencies of `fft` for `n` points with spacing `d`
    (`numpy.fft.fftfreq`): `[0, 1, ..., n//2 - 1 (or (n-1)/2), -n//2, ..., -1] / (d n)`.

    A NumPy float64 array (or `dtype`) for a number `d`; a traced array for a
    traced `d`.
    """
    n = _count(n, "fftfreq")
    k = np.fft.fftfreq(n, 1.0) * n             # the integer frequencies, exactly
    return _scale(k, n, _spacing(d, "fftfreq"), dtype)


def rfftfreq(n: int, d=1.0, *, dtype=None):
    """The sample frequencies of `rfft` (`numpy.fft.rfftfreq`):
    `[0, 1, ..., n // 2] / (d n)`."""
    n = _count(n, "rfftfreq")
    k = np.arange(half_length(n), dtype=np.float64)
    return _scale(k, n, _spacing(d, "rfftfreq"), dtype)


def _scale(k: np.ndarray, n: int, d, dtype):
    # as NumPy computes it: k * (1 / (n d))
    if isinstance(d, Tracer):
        out = ops.asarray(k) * (1.0 / (d * n))
        return out if dtype is None else ops.astype(out, dtype)
    out = k * (1.0 / (n * d))
    return out if dtype is None else out.astype(dtype)


def _shift_axes(x, axes, op: str) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(x.ndim))
    if isinstance(axes, (int, np.integer)):
        axes = (axes,)
    return tuple(normalize_axis(a, x.ndim, op) for a in axes)


def fftshift(x, axes: int | Sequence[int] | None = None):
    """Moves the zero-frequency term to the center (`numpy.fft.fftshift`): a
    cyclic shift by `n // 2` along `axes` (all by default)."""
    x = _array(x, "fftshift")
    axes = _shift_axes(x, axes, "fftshift")
    if not axes:
        return x
    return ops.roll(x, tuple(x.shape[a] // 2 for a in axes), axes)


def ifftshift(x, axes: int | Sequence[int] | None = None):
    """The inverse of `fftshift` (`numpy.fft.ifftshift`): a shift by `-(n // 2)`."""
    x = _array(x, "ifftshift")
    axes = _shift_axes(x, axes, "ifftshift")
    if not axes:
        return x
    return ops.roll(x, tuple(-(x.shape[a] // 2) for a in axes), axes)
