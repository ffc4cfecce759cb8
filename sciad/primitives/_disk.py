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
- (a store of small carries, below `ASYNC_BYTES`, writes and reads in the
  host call: a hand-off costs more);
- `end(store, token)` closes the store (the file goes with it).

A check in the loop that fails ends the store before it raises (the store
is in the run's `Site.held`), as does a failed write or read, and an error
of the store's thread is raised by the next call. The bytes read are the
bytes written (each array's own buffer: `os.pwritev` / `os.preadv`).
Under `jax.vmap` the host calls see leading batch axes, which the store
keeps with the arrays.
"""

from __future__ import annotations

import functools
import itertools
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import StorageError, runtime_error_text
from ..solvers._host import host_call, lead_axes
from ._schedules import checkpoint_runs


#: a store whose slots are smaller than this writes and reads in the host
#: call itself: handing a copy to the store's thread and waiting for it
#: takes about 0.1 ms, more than copying it (measured: 2,856 calls of a
#: 1.6 KB carry took 0.45 s handed off and 0.12 s in the calls; a 0.8 MB
#: carry's 570 calls saved 0.18 s handed off)
ASYNC_BYTES = 256 * 2 ** 10


class Store:
    """One run's carries on disk. An entry is one example's carry (a batch
    of `batch` examples under `jax.vmap`, else one) in one slot, at a fixed
    offset of the file: entry `(j, b)` at `(j * batch + b) * entry_bytes`."""

    def __init__(self, directory: str):
        self.file = tempfile.TemporaryFile(dir=directory)
        self.fd = self.file.fileno()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="sciad-disk")
        self.layout: tuple | None = None  # ((shape, dtype), ...) of an entry's arrays
        self.batch = 0
        self.entry_bytes = 0
        self.writing = None  # the write in flight (a future)
        self.ahead = None  # (slots, future) read ahead
        self.closed = False

    def _offset(self, slot: int, b: int) -> int:
        return (slot * self.batch + b) * self.entry_bytes

    # -- the store's thread

    def _put(self, entries) -> None:
        for slot, b, arrays in entries:
            views = [memoryview(a).cast("B") for a in arrays]
            offset = self._offset(slot, b)
            while views:
                done = os.pwritev(self.fd, views, offset)
                offset += done
                while views and done >= len(views[0]):
                    done -= len(views[0])
                    views.pop(0)
                if views and done:
                    views[0] = views[0][done:]

    def _get(self, slots, layout) -> list:
        out = [np.zeros((len(slots),) + tuple(shape), dtype) for shape, dtype in layout]
        buf = bytearray(self.entry_bytes)
        view = memoryview(buf)
        for b, slot in enumerate(slots):
            if slot < 0:  # (an example whose loop is done: its results are dropped)
                continue
            offset, end = self._offset(slot, b), 0
            while end < len(buf):
                n = os.preadv(self.fd, [view[end:]], offset + end)
                if n == 0:
                    raise OSError(f"slot {slot} ends {len(buf) - end} bytes short of its size")
                end += n
            k = 0
            for a, (shape, dtype) in zip(out, layout):
                size = int(np.prod(shape, dtype=np.int64))
                a[b] = np.frombuffer(buf, dtype, count=size, offset=k).reshape(shape)
                k += size * dtype.itemsize
        return out

    # -- the program's calls

    def write(self, slots, when, arrays) -> None:
        """Writes example `b` of `arrays` (each `(batch, ...)`) to slot
        `slots[b]` where `when[b]`."""
        self._settle()
        layout = tuple((a.shape[1:], a.dtype) for a in arrays)
        if self.layout is None:
            self.layout, self.batch = layout, len(slots)
            self.entry_bytes = sum(int(np.prod(s, dtype=np.int64)) * d.itemsize
                                   for s, d in layout)
        elif layout != self.layout or len(slots) != self.batch:
            raise OSError(f"{len(slots)} carries of {layout} written to a store of "
                          f"{self.batch} of {self.layout}")
        # (the store's thread gets copies: the callback's buffers are XLA's; a
        # small store writes here, where a hand-off would cost more)
        small = self._small()
        own = np.ascontiguousarray if small else functools.partial(np.array, order="C")
        entries = [(int(j), b, [own(a[b]) for a in arrays])
                   for b, (j, w) in enumerate(zip(slots, when)) if w]
        if not entries:
            return
        if small:
            self._put(entries)
        else:
            self.writing = self.pool.submit(self._put, entries)

    def _small(self) -> bool:
        return self.entry_bytes * self.batch < ASYNC_BYTES

    def read(self, slots, ahead, layout) -> list:
        """Example `b` of slot `slots[b]` (zeros where negative), each array
        `(batch, ...)`; reads slots `ahead` next, in the background."""
        self._settle()  # (the write in flight may be one of these)
        key = tuple(int(j) for j in slots)
        if any(j >= 0 for j in key) and (self.layout is None or len(key) != self.batch):
            raise OSError(f"{len(key)} carries read from a store of {self.batch}")
        if self.ahead is not None and self.ahead[0] == key:
            arrays = self.ahead[1].result()
        else:
            arrays = self._get(key, layout)
        nxt = tuple(int(j) for j in ahead)
        self.ahead = (nxt, self.pool.submit(self._get, nxt, layout)) \
            if any(j >= 0 for j in nxt) and not self._small() else None
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


def held_store(directory: str, site) -> tuple:
    """Opens this run's store in `directory` (`begin`) for a loop lowered at
    `site`: `(number, held)`, `held` the run's `Site.held` with the store
    added, so that a check in the loop that fails closes it."""
    number = begin(directory, site.bare if site is not None else None)
    return number, (*(site.held if site is not None else ()), (number, release))


def _flat(x, lead) -> np.ndarray:
    """A host call's per-example argument as a flat `(prod(lead),)` array."""
    return np.broadcast_to(np.asarray(x), lead).ravel()


def write(number, slot, token, carry, site, when=True):
    """Writes `carry` (a tuple of arrays) to slot `slot` where `when`;
    returns a token."""
    ranks = (0, 0, 0, 0) + tuple(jnp.ndim(c) for c in carry)
    shapes = [tuple(jnp.shape(c)) for c in carry]

    def host(number, slot, when, token, *arrays):
        store = _store(number, site)
        lead = lead_axes((number, slot, when, token, *arrays), ranks)
        k = int(np.prod(lead, dtype=np.int64))
        flat = [np.broadcast_to(a, lead + s).reshape((k,) + s) for a, s in zip(arrays, shapes)]
        try:
            store.write(_flat(slot, lead), _flat(when, lead), flat)
        except OSError as e:
            raise _failing(number, site, "writing", e) from None
        return (np.zeros(lead, np.int32),)

    (token,) = host_call(host, (jax.ShapeDtypeStruct((), jnp.int32),), number,
                         jnp.asarray(slot, jnp.int32), jnp.asarray(when, jnp.bool_), token,
                         *carry, effect=True)
    return token


def read(number, slot, ahead, token, carry_types, site):
    """Slot `slot`'s carry (arrays of `carry_types`; zeros where `slot` is
    negative) and a token; reads slot `ahead` next, in the background (none
    where it is negative)."""
    layout = tuple((tuple(t.shape), np.dtype(t.dtype)) for t in carry_types)
    results = tuple(jax.ShapeDtypeStruct(s, d) for s, d in layout) + (
        jax.ShapeDtypeStruct((), jnp.int32),)

    def host(number, slot, ahead, token):
        store = _store(number, site)
        lead = lead_axes((number, slot, ahead, token), (0, 0, 0, 0))
        try:
            arrays = store.read(_flat(slot, lead), _flat(ahead, lead), layout)
        except OSError as e:
            raise _failing(number, site, "reading", e) from None
        return tuple(a.reshape(lead + s) for a, (s, _) in zip(arrays, layout)) + (
            np.zeros(lead, np.int32),)

    out = host_call(host, results, number, jnp.asarray(slot, jnp.int32),
                    jnp.asarray(ahead, jnp.int32), token, effect=True)
    return tuple(out[:-1]), out[-1]


def end(number, token):
    """Closes the store; returns a token."""

    def host(number, token):
        release(number)
        return (np.zeros(lead_axes((number, token), (0, 0)), np.int32),)

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
