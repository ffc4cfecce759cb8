"""`host_call`: run a Python function on the host from a compiled program.

sciad's host-side work (SuperLU factorizations and solves, the checks that
turn a failed computation into an error) goes through one JAX primitive,
`sciad_host_call`, instead of `jax.pure_callback`, for two reasons measured
on the 2-core CPU machine:

- cost: `jax.pure_callback` `device_put`s every argument (making JAX arrays
  of them) and copies every result; a trivial callback cost 0.19-0.30 ms. The
  primitive lowers through XLA's Python FFI callback directly, so the
  function receives the program's buffers as NumPy arrays: about 20 us a
  call. Time stepping and Newton loops are many small solves, so this is
  the fixed cost of each one.
- exact dtypes: `device_put` converts with the x64 setting of the thread the
  callback runs on, which may be an XLA worker without sciad's x64 scope
  (float64 silently became float32). Arguments here arrive as they are.
  Results are still checked by JAX against that thread's setting: with x64
  on globally (sciad's default) every thread has it and results cross as
  they are; otherwise 64-bit results cross as uint32 words (bitcast in the
  program, viewed back on the host: no copies). (A program compiled with x64
  on globally and run after it was turned off fails loudly: JAX finds the
  result's dtype changed.)

The FFI lowering is `jax.interpreters.mlir.emit_python_callback` (what JAX's
own CPU `spsolve` lowers with); where it is missing (another JAX version),
`host_call` falls back to `jax.pure_callback` with 64-bit arguments as words
too: slower, equally exact.

Under `jax.vmap` the function gets batched arguments with the batch axes in
front (an unbatched argument gets axes of size 1: broadcast it) and must
return results with those axes in front (JAX's "expand_dims" convention).
The primitive is never differentiated: sciad differentiates its graphs
before lowering.

A call made with `effect=True` (the run-time checks, `sciad.primitives`'
`check`) carries a JAX effect and is lowered as side-effecting, so neither
JAX's dead-code elimination (of `jax.jit`, `jax.grad`'s partial evaluation,
`lax.cond`) nor XLA's removes it when its result is unused: a check runs
whenever the computation it judges runs, whichever of that computation's
results a program reads.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

try:  # JAX's effect registry (no public API): declares a check's effect
    from jax._src import effects as _effects
except ImportError:  # pragma: no cover - depends on the JAX version
    _effects = None

try:  # the FFI lowering of Python callbacks (see the docstring)
    from jax.interpreters.mlir import emit_python_callback as _emit_python_callback
except ImportError:  # pragma: no cover - depends on the JAX version
    _emit_python_callback = None


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
    w = np.asarray(w, order="C")
    return w.reshape(-1).view(dtype).reshape(w.shape[:-1])


def host_to_words(a: np.ndarray) -> np.ndarray:
    """`to_words` on the host (a view of a contiguous array)."""
    if not _wide(a.dtype):
        return a
    a = np.asarray(a, order="C")  # (a 0-d array's dtype cannot be viewed: flatten)
    return a.reshape(-1).view(np.uint32).reshape(a.shape + (-1,))


def _words_struct(shape, dtype) -> jax.ShapeDtypeStruct:
    dtype = np.dtype(dtype)
    if not _wide(dtype):
        return jax.ShapeDtypeStruct(tuple(shape), dtype)
    return jax.ShapeDtypeStruct(tuple(shape) + (dtype.itemsize // 4,), jnp.uint32)


class _HostFn:
    """The host side of one call site: `fn` on NumPy arrays of the declared
    dtypes (given as words if `in_words`), results returned as words if
    `out_words`. Hashed by identity (it is a param of the primitive: equal
    call sites are not merged)."""

    __slots__ = ("fn", "in_dtypes", "out_dtypes", "in_words", "out_words", "__weakref__")

    def __init__(self, fn: Callable, in_dtypes, out_dtypes, in_words: bool,
                 out_words: bool):
        self.fn = fn
        self.in_dtypes = tuple(in_dtypes)
        self.out_dtypes = tuple(out_dtypes)
        self.in_words = in_words
        self.out_words = out_words

    def __call__(self, *args):
        if self.in_words:
            args = [host_from_words(a, dt) for a, dt in zip(args, self.in_dtypes)]
        outs = tuple(np.asarray(o, dt) for o, dt in zip(self.fn(*args), self.out_dtypes))
        return tuple(map(host_to_words, outs)) if self.out_words else outs


if _effects is not None:
    class CheckEffect(_effects.Effect):
        """A run-time check: kept when its result is unused, allowed wherever
        JAX allows its own debug callbacks (control flow, `jax.checkpoint`,
        custom derivatives), unordered."""

        __str__ = lambda self: "SciadCheck"  # noqa: E731

    check_effect = CheckEffect()
    for _set in (_effects.lowerable_effects, _effects.control_flow_allowed_effects,
                 _effects.remat_allowed_effects, _effects.custom_derivatives_allowed_effects,
                 _effects.partial_eval_kept_effects):
        _set.add_type(CheckEffect)
else:  # pragma: no cover - depends on the JAX version
    check_effect = None

host_call_p = Primitive("sciad_host_call")
host_call_p.multiple_results = True


def _host_call_abstract_eval(*avals, host, results, effect=False):
    outs = [jax.core.ShapedArray(r.shape, r.dtype) for r in results]
    return outs, ({check_effect} if effect and check_effect is not None else set())


def _effect_sharding(ctx):
    """The sharding a side-effecting call needs in a program partitioned over
    devices (XLA's SPMD partitioner refuses one without: "Side-effect HLO
    must have sharding"): what `jax.pure_callback` gives its calls (one
    device's, or per device inside `shard_map`). None where JAX's private
    helper is missing or declines."""
    try:
        from jax._src.callback import _callback_op_sharding
        return _callback_op_sharding(ctx.module_context.axis_context, None, ctx.avals_out)
    except Exception:  # (another JAX version; partly automatic axes)
        return None


def _host_call_lowering(ctx, *args, host, results, effect=False):
    kw = {}
    if effect:
        sharding = _effect_sharding(ctx)
        if sharding is not None:
            kw["sharding"] = sharding
    outs, _, _ = _emit_python_callback(ctx, host, None, list(args), ctx.avals_in,
                                       ctx.avals_out, has_side_effect=bool(effect),
                                       returns_token=False, **kw)
    return outs


def _host_call_impl(*args, host, results, effect=False):
    # outside jit: run it here (a raise is the host function's own exception)
    outs = host(*[np.asarray(a) for a in args])
    return [jnp.asarray(o) for o in outs]


def _host_call_batch(args, dims, *, host, results, effect=False):
    # an unbatched operand's axis is None (JAX's `not_mapped`)
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = [jnp.moveaxis(a, d, 0) if d is not None else a[None]
             for a, d in zip(args, dims)]
    out_results = tuple(jax.ShapeDtypeStruct((size,) + tuple(r.shape), r.dtype)
                        for r in results)
    return (host_call_p.bind(*moved, host=host, results=out_results, effect=effect),
            [0] * len(results))


host_call_p.def_effectful_abstract_eval(_host_call_abstract_eval)
host_call_p.def_impl(_host_call_impl)
batching.primitive_batchers[host_call_p] = _host_call_batch
if _emit_python_callback is not None:
    mlir.register_lowering(host_call_p, _host_call_lowering, cacheable=False)


def lead_axes(args, ranks) -> tuple:
    """The leading (batch) axes a host function's arguments carry under
    `jax.vmap` (`host_call`'s batching rule: size 1 where an argument is
    unbatched), given each argument's unbatched rank in `ranks`."""
    return np.broadcast_shapes(*(np.shape(a)[:np.ndim(a) - r] for a, r in zip(args, ranks)))


def host_call(fn: Callable, results: Sequence[jax.ShapeDtypeStruct], *args,
              effect: bool = False) -> tuple:
    """`fn(*args)` run on the host, with exact dtypes both ways.

    `fn` receives NumPy arrays of the arguments' own dtypes (with leading
    batch axes under `jax.vmap`) and returns one array per entry of
    `results` (tuples of `jax.ShapeDtypeStruct`), of that dtype. An exception
    raised by `fn` stops the program; it reaches the caller as JAX's runtime
    error carrying its text (see `sciad.errors.runtime_error_from`).
    With `effect=True` the call is side-effecting (see the module
    docstring): it runs even where nothing reads its results.
    """
    args = [jnp.asarray(a) for a in args]
    in_dtypes = [np.dtype(a.dtype) for a in args]
    out_dtypes = [np.dtype(r.dtype) for r in results]
    ffi = _emit_python_callback is not None
    # with x64 on globally every thread has it: results cross as they are
    words = not (ffi and jax.enable_x64.get_global())
    structs = tuple(_words_struct(r.shape, r.dtype) if words
                    else jax.ShapeDtypeStruct(tuple(r.shape), r.dtype) for r in results)
    host = _HostFn(fn, in_dtypes, out_dtypes, in_words=not ffi, out_words=words)
    if ffi:
        outs = host_call_p.bind(*args, host=host, results=structs, effect=effect)
    elif effect:  # pragma: no cover - depends on the JAX version
        from jax.experimental import io_callback  # (a submodule: not loaded by `import jax`)

        outs = io_callback(host, structs, *[to_words(a) for a in args])
    else:  # pragma: no cover - depends on the JAX version
        outs = jax.pure_callback(host, structs, *[to_words(a) for a in args],
                                 vmap_method="expand_dims")
    if not words:
        return tuple(outs)
    return tuple(from_words(o, dt) for o, dt in zip(outs, out_dtypes))


# ---------------------------------------------------------------------------
# the host heap


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    """glibc's `malloc_trim`, or None (another C library, another system);
    looked up on first use, not when sciad is imported."""
    import ctypes
    import ctypes.util

    for name in ("libc.so.6", None):
        name = name or ctypes.util.find_library("c")  # (only where the usual name fails)
        try:
            trim = ctypes.CDLL(name).malloc_trim
        except (OSError, AttributeError, TypeError):
            continue
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        return trim
    return None


def release_host_heap() -> None:
    """Gives the heap's free pages back to the operating system (glibc's
    `malloc_trim(0)`; nothing elsewhere).

    A host setup that allocates and frees arrays of a few to tens of MB
    (an AMG hierarchy's sparse products at 10^6 unknowns) leaves them in
    glibc's heap: arrays below its mmap threshold (raised up to 32 MB as
    larger ones are freed) come from the heap, and the holes they leave
    are kept. Each new set of values then grows the process, by up to
    ~200 MB a call at 10^6 unknowns (measured). Trimming after such a
    setup costs a few milliseconds."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
