"""Host callbacks that keep 64-bit values exact.

`jax.pure_callback` converts a callback's arguments (and results) with the
x64 setting of the thread the callback runs on. With JAX's x64 mode off
globally (sciad turns it on only in a scope around its own calls), that
thread may be an XLA worker where float64 silently becomes float32. So
64-bit arrays cross as uint32 words: bitcast in the program, viewed back on
the host, and the same way for results.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def _wide(dtype) -> bool:
    return np.dtype(dtype).itemsize > 4 and np.dtype(dtype) != np.complex64


def to_words(x):
    """`x` as uint32 words (a trailing axis of 2, or 4 for complex128) when
    its dtype is 64-bit; as it is otherwise."""
    if not _wide(x.dtype):
        return x
    if jnp.iscomplexobj(x):
        x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
        w = jax.lax.bitcast_convert_type(x, jnp.uint32)
        return w.reshape(w.shape[:-2] + (4,))
    return jax.lax.bitcast_convert_type(x, jnp.uint32)


def from_words(w, dtype):
    """Inverse of `to_words`, inside the program."""
    dtype = np.dtype(dtype)
    if not _wide(dtype):
        return w
    if dtype.kind == "c":
        parts = jax.lax.bitcast_convert_type(w.reshape(w.shape[:-1] + (2, 2)), jnp.float64)
        return jax.lax.complex(parts[..., 0], parts[..., 1])
    return jax.lax.bitcast_convert_type(w, dtype)


def host_from_words(w: np.ndarray, dtype) -> np.ndarray:
    """Inverse of `to_words`, on the host (a view, no copy)."""
    dtype = np.dtype(dtype)
    if not _wide(dtype):
        return np.asarray(w)
    w = np.ascontiguousarray(w)
    return w.view(dtype).reshape(w.shape[:-1])


def host_to_words(a: np.ndarray) -> np.ndarray:
    """`to_words` on the host."""
    if not _wide(a.dtype):
        return a
    a = np.ascontiguousarray(a)
    return a.view(np.uint32).reshape(a.shape + (-1,))


def words_struct(shape, dtype) -> jax.ShapeDtypeStruct:
    dtype = np.dtype(dtype)
    if not _wide(dtype):
        return jax.ShapeDtypeStruct(tuple(shape), dtype)
    return jax.ShapeDtypeStruct(tuple(shape) + (dtype.itemsize // 4,), jnp.uint32)


def callback(fn: Callable, result: tuple, *args, vmap_method: str = "expand_dims"):
    """`jax.pure_callback(fn, result, *args)` with 64-bit arrays kept exact.

    `fn` receives NumPy arrays of the arguments' own dtypes (batched along
    leading axes under `vmap`) and returns arrays of `result`'s dtypes;
    `result` is a tuple of `jax.ShapeDtypeStruct`s.
    """
    in_dtypes = [np.dtype(a.dtype) for a in args]
    out_dtypes = [np.dtype(r.dtype) for r in result]

    def host(*words):
        vals = [host_from_words(w, dt) for w, dt in zip(words, in_dtypes)]
        outs = fn(*vals)
        return tuple(host_to_words(np.asarray(o, dt)) for o, dt in zip(outs, out_dtypes))

    structs = tuple(words_struct(r.shape, r.dtype) for r in result)
    outs = jax.pure_callback(host, structs, *[to_words(a) for a in args],
                             vmap_method=vmap_method)
    return tuple(from_words(o, dt) for o, dt in zip(outs, out_dtypes))
