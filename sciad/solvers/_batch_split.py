"""A batch of host kernel calls over several cores: sciad's batch splitter.

XLA:CPU runs a custom call on one thread, and its executor runs two custom
calls of one program one after the other even where neither needs the
other (measured: two halves of a batch of KLU factorizations, and four
quarters, each ran after the last on one thread). A batch of B independent
sparse factorizations in one kernel call therefore used one core.

`csrc/batch_split.cc` is an FFI handler that runs another FFI handler (an
"inner" one: KLU's kernels from klujax's extension) on slices of its
leading batch axis, one slice per thread, and returns when all are done.
It is a small C++ extension built on first use with the system compiler
(`sciad.solvers._build`); where it cannot be built (no compiler), calls run
unsplit, as before, and nothing else changes.

- `split_call(inner, args, out, batched, threads, handles)`: the inner
  target's call, split where `threads > 1` and the splitter is built.
- `threads_for(batch, work)`: how many slices a batch gets, from the usable
  cores and an estimate of each item's work (a slice must be worth a thread,
  about 50 us to start and join).

Thread use: the calling XLA thread runs the first slice and waits for the
others, so a split call keeps at most `usable_cores()` threads busy (XLA's
other threads may run other work beside it: the splitter never asks for more
threads than cores, and `SCIAD_HOST_THREADS` caps it, 1 turning it off).

```python
call = split_call("sciad_klu_factor_f64", (rows, cols, ax, raw),
                  jax.ShapeDtypeStruct((L,), jnp.uint64), batched=(2,),
                  threads=threads_for(L, nnz), handles=(-1, MAKE))
```
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import NotSupportedError
from . import _build
from ._threads import usable_cores

SOURCE = Path(__file__).with_name("csrc") / "batch_split.cc"
WHAT = "sciad's batch splitter"
TARGET = "sciad_batch_split"
#: at least this much estimated work (ns) per slice, or fewer slices
MIN_SLICE_NS = 200_000
#: the splitter's inner handlers: FFI target name -> slot (at most 64)
_slots: dict = {}
_lock = threading.Lock()


def max_threads() -> int:
    """The most slices a call is split into: the usable cores, or
    `$SCIAD_HOST_THREADS` where set (1: no splitting)."""
    cap = os.environ.get("SCIAD_HOST_THREADS", "").strip()
    cores = usable_cores()
    if cap:
        try:
            return max(1, min(int(cap), cores))
        except ValueError:
            raise NotSupportedError(f"SCIAD_HOST_THREADS={cap!r} is not a whole number; "
                                    "set it to the number of threads host kernels may use "
                                    "(1: one each)") from None
    return cores


def policy() -> tuple:
    """What `threads_for` decides by, for the keys of caches of traced
    kernels (a program traced under one policy keeps its slices)."""
    return max_threads(), MIN_SLICE_NS


def threads_for(batch: int, item_ns: float) -> int:
    """How many slices a batch of `batch` items, each about `item_ns`
    nanoseconds of work, is split into (1: not split)."""
    if batch < 2:
        return 1
    return int(max(1, min(max_threads(), batch, batch * item_ns // max(MIN_SLICE_NS, 1))))


def _setup(lib) -> None:
    lib.sciad_batch_set_inner.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.sciad_batch_set_inner.restype = ctypes.c_int
    lib.sciad_handles_take.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.sciad_handles_take.restype = None
    lib.sciad_handles_live.argtypes = []
    lib.sciad_handles_live.restype = ctypes.c_int64
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.sciad_batch_split),
                                platform="cpu")


_LIBRARY = _build.Library(SOURCE, "batch", "libsciad_batch.so", WHAT, _setup)


def library():
    """The loaded splitter (built on first use), or None where it cannot be
    built or loaded here (the reason: `unavailable()`)."""
    return _LIBRARY.get()


def unavailable() -> str | None:
    """Why calls run unsplit here (None: the splitter is built)."""
    library()
    return _LIBRARY.failed


def _capsule_pointer(capsule) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype = ctypes.c_char_p
    name.argtypes = [ctypes.py_object]
    return get(capsule, name(capsule))


def set_inner(target: str, capsule) -> int:
    """Makes the FFI handler in `capsule` (registered as `target`) an inner
    handler of the splitter; returns its slot (the same for the same name)."""
    lib = library()
    with _lock:
        if target in _slots:
            return _slots[target]
        slot = len(_slots)
        if lib is None or lib.sciad_batch_set_inner(slot, _capsule_pointer(capsule)) != 0:
            raise NotSupportedError(f"{WHAT}: cannot take {target!r} as an inner handler "
                                    f"({_LIBRARY.failed or 'no slot left'})")
        _slots[target] = slot
        return slot


#: how a call meets the handle table (`handles=`; see `csrc/batch_split.cc`)
READ, TAKE, MAKE, SOFT = 1, 2, 3, 4


def handles_available() -> bool:
    """Whether factor handles go through the handle table (the splitter is
    built): then a repeated or stale release frees nothing."""
    return library() is not None


def take_handles(handles) -> np.ndarray:
    """Ends the live entries among `handles` (a NumPy array of uint64, any
    shape) and returns the raw pointers they stood for, for the caller to
    free (0 where a handle is 0, stale or already released)."""
    lib = library()
    assert lib is not None, "take_handles: the handle table is not built"
    hs = np.ascontiguousarray(np.asarray(handles, np.uint64).ravel())
    raws = np.zeros_like(hs)
    lib.sciad_handles_take(hs.ctypes.data, hs.size, raws.ctypes.data)
    return raws


def live_handles() -> int:
    """How many handles are live: made by a program and not yet released (0
    where the handle table is not built)."""
    lib = library()
    return 0 if lib is None else int(lib.sciad_handles_live())


def split_call(target: str, args, out, batched, threads: int, has_side_effect: bool = False,
               handles: tuple[int, int] | None = None, **attrs):
    """`jax.ffi.ffi_call(target, out)(*args)`, split into `threads` slices of
    the leading batch axis of the arguments at the positions `batched` and
    of every result (run unsplit where `threads` is 1 or the splitter is not
    built). `handles`: `(argument, mode)`, how the call meets the handle
    table (`READ` or `TAKE` the handles in that argument, or `MAKE` them from
    the first result, a failed slice's as 0; or `SOFT`, no handles, a failed
    slice's results NaN; the argument is ignored there; a failed slice of
    several items runs again item by item, so that only a failed item's
    results are 0 or NaN): such a call always goes through the splitter where it is built
    (`handles_available`). `attrs`: the inner target's FFI attributes."""
    if (threads > 1 or handles is not None) and target in _slots:
        mask = sum(1 << i for i in batched)
        harg, hmode = handles if handles is not None else (-1, 0)
        ctl = np.array([_slots[target], mask, threads, harg, hmode], np.int64)
        return jax.ffi.ffi_call(TARGET, out, has_side_effect=has_side_effect)(*args, ctl, **attrs)
    return jax.ffi.ffi_call(target, out, has_side_effect=has_side_effect)(*args, **attrs)


def fold(axis_size, in_batched, args):
    """A `custom_vmap` rule's operands with the vmapped axis folded into the
    kernel's leading batch axis (an unbatched operand broadcast first): what
    every kernel taking a leading batch axis of `L` items does under
    `jax.vmap` (KLU's, CHOLMOD's, the sparse checks')."""
    out = []
    for a, batched in zip(args, in_batched):
        if not batched:
            a = jnp.broadcast_to(a, (axis_size,) + a.shape)
        out.append(a.reshape((axis_size * a.shape[1],) + a.shape[2:]))
    return out
