"""The disk level of a memory budget: a checkpointed scan's carries in a file.

A `TwoLevel` schedule (`_schedules`) writes the carry at the start of each
segment of the loop to disk and reads them back, last first, for the
segments' backward passes (`replay_on_disk`). Each run of the program opens
a *store* of its own (`begin`): a file without a name
(`tempfile.TemporaryFile`: `O_TMPFILE` on Linux), so that nothing is left
in the directory whatever happens to the process, and two runs of one
program (threads) never share one. The program reaches its store through
host calls (`sciad_host_call`, side-effecting) that pass a token on, so that
each reads what the one before it did:

- `begin` opens the store and gives its number;
- `write(store, slot, token, *carry)` copies the carry and hands it to the
  store's thread, which writes it while the program runs on (at most one
  write in flight: a second waits for the first);
- `read(store, slot, token, ahead)` gives slot `slot` back (read ahead by
  the store's thread when it was asked for before) and starts reading slot
  `ahead`;
- `end(store, token)` closes the store (the file goes with it).

A check in the loop that fails ends the store before it raises (the store
is in the run's `Site.held`), as does a failed write or read, and an error
of the store's thread is raised by the next call. The bytes read are the
bytes written (each array's own buffer: `os.pwritev` / `os.preadv`).
Under `jax.vmap` the host calls see leading batch axes, which the store
keeps with the arrays.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import StorageError, runtime_error_text
from ..solvers._host import host_call


class Store:
    """One run's carries on disk: slot `j` holds the arrays written last
    to it, at a fixed offset of the file (slots are all one size)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.file = tempfile.TemporaryFile(dir=directory)
        self.fd = self.file.fileno()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="sciad-disk")
        self.layout: tuple | None = None  # ((shape, dtype), ...) of a slot's arrays
        self.slot_bytes = 0
        self.writing = None  # the write in flight (a future)
        self.ahead = None  # (slot, future) read ahead
        self.closed = False

    # -- the store's thread

    def _put(self, slot: int, arrays) -> None:
        views = [memoryview(a).cast("B") for a in arrays]
        offset = slot * self.slot_bytes
        while views:
            done = os.pwritev(self.fd, views, offset)
            offset += done
            while views and done >= len(views[0]):
                done -= len(views[0])
                views.pop(0)
            if views and done:
                views[0] = views[0][done:]

    def _get(self, slot: int) -> list:
        buf = bytearray(self.slot_bytes)
        view, offset, end = memoryview(buf), slot * self.slot_bytes, 0
        while end < len(buf):
            n = os.preadv(self.fd, [view[end:]], offset + end)
            if n == 0:
                raise OSError(f"slot {slot} ends {len(buf) - end} bytes short of its size")
            end += n
        out, k = [], 0
        for shape, dtype in self.layout:
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            out.append(np.frombuffer(buf, dtype, count=size // dtype.itemsize,
                                     offset=k).reshape(shape))
            k += size
        return out

    # -- the program's calls

    def write(self, slot: int, arrays) -> None:
        self._settle()
        arrays = [np.array(a, copy=True, order="C") for a in arrays]  # (the callback's
        layout = tuple((a.shape, a.dtype) for a in arrays)  # buffers are XLA's)
        if self.layout is None:
            self.layout = layout
            self.slot_bytes = sum(a.nbytes for a in arrays)
        elif layout != self.layout:
            raise OSError(f"slot {slot}'s arrays are {layout}, the store's {self.layout}")
        self.writing = self.pool.submit(self._put, slot, arrays)

    def read(self, slot: int, ahead: int) -> list:
        self._settle()  # (the write in flight may be this slot's)
        if self.layout is None:
            raise OSError(f"slot {slot} is read before anything was written")
        if self.ahead is not None and self.ahead[0] == slot:
            arrays = self.ahead[1].result()
        else:
            arrays = self._get(slot)
        self.ahead = (ahead, self.pool.submit(self._get, ahead)) if ahead >= 0 else None
        return arrays

    def _settle(self) -> None:
        if self.writing is not None:
            writing, self.writing = self.writing, None
            writing.result()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.file.close()


_STORES: dict[int, Store] = {}
_LOCK = threading.Lock()
_NUMBERS = itertools.count(1)


def open_stores() -> int:
    """How many stores are open (runs in flight, or ended without `end`)."""
    with _LOCK:
        return len(_STORES)


def _text(site, message: str) -> str:
    """The text of a `StorageError` raised from the host (`Site.fail`'s)."""
    op, source = (site.op, site.source) if site is not None else ("scan", None)
    return runtime_error_text(StorageError, message, op=op, source=source)


def _store(number, site) -> Store:
    with _LOCK:
        store = _STORES.get(int(np.ravel(number)[0]))
    if store is None:
        raise RuntimeError(_text(
            site, "a checkpointed loop's disk store was closed while the loop ran (a failed "
            "check elsewhere in the program ended it); run the gradient again."))
    return store


def release(number) -> None:
    """Closes the stores numbered in `number` (idempotent: a `Site.held`
    release, run before a failed check raises)."""
    for n in np.unique(np.ravel(np.asarray(number))).tolist():
        with _LOCK:
            store = _STORES.pop(int(n), None)
        if store is not None:
            store.close()


release.idempotent = True


def _failing(number, site, doing: str, err: BaseException):
    release(number)
    return RuntimeError(_text(
        site, f"{doing} a checkpointed loop's carry on disk failed ({type(err).__name__}: "
        f"{err}). The disk level writes to the budget's `disk` directory: free space there, "
        "give another directory, or a RAM-only `sd.MemoryBudget`."))


def _lead(args, ranks) -> tuple:
    """The leading (batch) axes of host-call arguments of unbatched ranks
    `ranks` (`jax.vmap` adds them, size 1 where an argument is unbatched)."""
    return np.broadcast_shapes(*(np.shape(a)[:np.ndim(a) - r] for a, r in zip(args, ranks)))


def begin(directory: str, site):
    """Opens a store in `directory` for this run; returns its number (an
    int64 scalar of the program)."""

    def host():
        try:
            store = Store(directory)
        except OSError as e:
            raise _failing(0, site, "opening a file for", e) from None
        n = next(_NUMBERS)
        with _LOCK:
            _STORES[n] = store
        return (np.asarray(n, np.int64),)

    (number,) = host_call(host, (jax.ShapeDtypeStruct((), jnp.int64),), effect=True)
    return number


def write(number, slot, token, carry, site):
    """Writes `carry` (a tuple of arrays) to slot `slot`; returns a token."""
    ranks = (0, 0, 0) + tuple(jnp.ndim(c) for c in carry)

    def host(number, slot, token, *arrays):
        store = _store(number, site)
        try:
            store.write(int(np.ravel(slot)[0]), arrays)
        except OSError as e:
            raise _failing(number, site, "writing", e) from None
        return (np.zeros(_lead((number, slot, token, *arrays), ranks), np.int32),)

    (token,) = host_call(host, (jax.ShapeDtypeStruct((), jnp.int32),), number,
                         jnp.asarray(slot, jnp.int32), token, *carry, effect=True)
    return token


def read(number, slot, ahead, token, carry_types, site):
    """Slot `slot`'s carry (arrays of `carry_types`) and a token; reads slot
    `ahead` next, in the background (none where it is negative)."""
    results = tuple(jax.ShapeDtypeStruct(tuple(t.shape), t.dtype) for t in carry_types) + (
        jax.ShapeDtypeStruct((), jnp.int32),)

    def host(number, slot, ahead, token):
        store = _store(number, site)
        try:
            arrays = store.read(int(np.ravel(slot)[0]), int(np.ravel(ahead)[0]))
        except OSError as e:
            raise _failing(number, site, "reading", e) from None
        lead = np.broadcast_shapes(_lead((number, slot, ahead, token), (0, 0, 0, 0)),
                                   *(a.shape[:a.ndim - len(t.shape)]
                                     for a, t in zip(arrays, carry_types)))
        return tuple(np.broadcast_to(a, lead + tuple(t.shape))
                     for a, t in zip(arrays, carry_types)) + (np.zeros(lead, np.int32),)

    out = host_call(host, results, number, jnp.asarray(slot, jnp.int32),
                    jnp.asarray(ahead, jnp.int32), token, effect=True)
    return tuple(out[:-1]), out[-1]


def end(number, token):
    """Closes the store; returns a token."""

    def host(number, token):
        release(number)
        return (np.zeros(_lead((number, token), (0, 0)), np.int32),)

    (token,) = host_call(host, (jax.ShapeDtypeStruct((), jnp.int32),), number, token,
                         effect=True)
    return token


def replay_on_disk(schedule, length: int, index, advance, backward_of, start, number,
                   carry_types, acc0, ct_xs, site):
    """The backward pass of a scan of `length >= 1` steps on a `TwoLevel`
    schedule, with the store `number` (`begin`): a forward sweep writing the
    carry at each segment's start but the last's (slot `j` for segment
    `j`), the last segment's backward pass from the sweep's carry, then
    each segment's, last first, from its carry read back.
    `index(t)`: the slice of the per-step inputs the `t`-th step reads;
    `advance(k, carry) -> carry`; `backward_of(runs, index, start, acc,
    ct_xs) -> (acc, ct_xs)` runs `_replay.replay` on one segment. Returns
    `(acc, ct_xs, token)`, the token `end`'s."""
    from ._schedules import checkpoint_runs

    L = schedule.segment
    m, last = schedule.segments(length)
    inner = schedule.inner()

    def offset(lo):
        return lambda t: index(lo + t)

    def sweep(j, state):
        carry, token = state
        token = write(number, j, token, carry, site)
        carry = jax.lax.fori_loop(j * L, (j + 1) * L, lambda t, c: advance(index(t), c), carry)
        return carry, token

    token = jnp.zeros((), jnp.int32)
    carry, token = jax.lax.fori_loop(0, m - 1, sweep, (tuple(start), token))
    acc, ct_xs = backward_of(checkpoint_runs(inner, last), offset((m - 1) * L), carry,
                             acc0, ct_xs)
    runs = checkpoint_runs(inner, L)

    def back(i, state):
        acc, ct_xs, token = state
        j = m - 2 - i
        carry, token = read(number, j, j - 1, token, carry_types, site)
        acc, ct_xs = backward_of(runs, offset(j * L), carry, acc, ct_xs)
        return acc, ct_xs, token

    acc, ct_xs, token = jax.lax.fori_loop(0, m - 1, back, (acc, ct_xs, token))
    return acc, ct_xs, end(number, token)
