"""One cache for what sciad derives from a sparsity pattern: symbolic
analyses, orderings, AMG hierarchies, index maps, fill estimates.

Each entry belongs to an owner (a `Pattern`, or another object it was made
for, held weakly: the owner's entries go with it) and has a kind (what it
is: "amg structure", "klu symbolic", ...), a key within the owner and kind,
and a size in bytes. All entries share one policy:

- a byte budget (`budget()`, `set_budget`; `$SCIAD_ANALYSIS_CACHE_BYTES`, or
  1 GiB): past it, the least recently used entries are dropped until the
  cache fits again (the entry just made stays);
- an optional count limit per owner and kind (`limit=`: an AMG hierarchy
  per set of values, of which an optimization makes one per step);
- `pinned` entries are never dropped: KLU's symbolic analyses, whose raw
  address a compiled program embeds (they are counted in the report);
- a dropped entry whose value is still in use elsewhere (a traced program
  holds the index maps it reads) is not made again while it lives: the
  cache keeps a weak reference to it and takes it back on the next miss
  (counted as a hit). Dropping frees nothing such a value holds, and making
  it again would hold it twice: at a million unknowns the entries in use
  outgrow the default budget, and a second program of one mesh held a
  second 424 MiB element map;
- one report (`info`: entries, bytes, hits, misses and drops per kind, and
  what libraries sciad calls keep in caches of their own) and one `clear`.

`sciad.config.analysis_cache_info()` and `clear_analysis_cache()` are the
public names; this module is the lowest layer's, so the graph (fill
estimates, COO index maps) and the solvers share it.

```python
s = cached(pattern, "amg structure", (max_coarse, max_levels),
           lambda: build_structure(...))
info()   # CacheInfo(entries=3, bytes=..., budget=..., kinds={...})
```
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable

_DEFAULT_BUDGET = 2 ** 30


class _Global:
    """The owner of entries made for no object (held for the process)."""

    def __repr__(self):
        return "<the process>"


GLOBAL = _Global()


class _Entry:
    __slots__ = ("value", "nbytes", "pinned", "tick")

    def __init__(self, value, nbytes: int, pinned: bool, tick: int):
        self.value, self.nbytes, self.pinned, self.tick = value, nbytes, pinned, tick


_lock = threading.RLock()
# owner -> {(kind, key): _Entry}
_store: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ticks = itertools.count()
_stats: dict = {}  # kind -> [hits, misses, drops]
# owner -> {(kind, key): (weak references to a dropped entry's value, its size)}
_ghosts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_external: dict = {}  # kind -> (report, clear)


def parse_bytes(value) -> int:
    """Bytes from an int or a string such as "512MiB", "2GB", "1e9"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a byte budget must be >= 0, got {value}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B?|B)?\s*", str(value))
    if m is None:
        raise ValueError(f"cannot read {value!r} as a number of bytes (e.g. 512MiB, 2GB)")
    unit = (m.group(2) or "B").upper().rstrip("B")
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
    return int(float(m.group(1)) * scale)


def si(n: int) -> str:
    """`n` bytes as text: "40.0 MiB", "512 B"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _budget_from_env() -> int:
    text = os.environ.get("SCIAD_ANALYSIS_CACHE_BYTES", "").strip()
    if not text:
        return _DEFAULT_BUDGET
    try:
        return parse_bytes(text)
    except ValueError as e:
        warnings.warn(f"SCIAD_ANALYSIS_CACHE_BYTES={text!r} is not a number of bytes ({e}); "
                      f"the analysis cache keeps its default budget of {si(_DEFAULT_BUDGET)}. "
                      "Set it to e.g. 512MiB.", RuntimeWarning, stacklevel=2)
        return _DEFAULT_BUDGET


_budget = _budget_from_env()


def budget() -> int:
    """The byte budget of the cache."""
    return _budget


def set_budget(value) -> None:
    """Sets the byte budget (an int, or a string such as "512MiB"), dropping
    least recently used entries until the cache fits."""
    global _budget
    _budget = parse_bytes(value)
    with _lock:
        _fit(keep=None)


def nbytes_of(value, depth: int = 4) -> int:
    """An estimate of the bytes `value` holds: its arrays' (NumPy, JAX,
    SciPy sparse), through tuples, lists, dicts and objects' attributes."""
    if depth < 0 or value is None:
        return 0
    n = getattr(value, "nbytes", None)
    if isinstance(n, int):
        return n
    if isinstance(value, (tuple, list)):
        return sum(nbytes_of(v, depth - 1) for v in value)
    if isinstance(value, dict):
        return sum(nbytes_of(v, depth - 1) for v in value.values())
    if hasattr(value, "data") and hasattr(value, "indices") and hasattr(value, "indptr"):
        return sum(nbytes_of(getattr(value, k), depth - 1) for k in ("data", "indices",
                                                                   "indptr"))
    fields = getattr(value, "__dict__", None)
    if fields is None and hasattr(type(value), "__slots__"):
        fields = {k: getattr(value, k, None) for k in type(value).__slots__}
    if isinstance(fields, dict):
        return sum(nbytes_of(v, depth - 1) for v in fields.values())
    return 0


def _stat(kind: str) -> list:
    return _stats.setdefault(kind, [0, 0, 0])


def _weak(value):
    """A way back to `value` that does not keep it alive: a function that
    gives it while it lives (else None), or None where it cannot be held
    weakly. A tuple is held through weak references to its items (small
    immutable ones, numbers, strings, None and tuples of them, kept)."""
    def small(v):
        return v is None or isinstance(v, (bool, int, float, str)) or (
            isinstance(v, tuple) and all(small(x) for x in v))

    def ref(v):
        if small(v):
            return lambda: v
        try:
            return weakref.ref(v)
        except TypeError:
            return None

    if not isinstance(value, tuple):
        return ref(value)
    refs = [ref(v) for v in value]
    if any(r is None for r in refs):
        return None
    kept = [small(v) for v in value]  # (and not `value` itself: that would keep it)

    def back():
        items = [r() for r in refs]
        alive = all(x is not None or k for x, k in zip(items, kept))
        return tuple(items) if alive else None

    return back


def _revived(owner, kind: str, key):
    """`(value, nbytes)` of the dropped entry `(kind, key)` of `owner` where
    its value still lives (the lock held), else None."""
    per = _ghosts.get(owner)
    ghost = None if per is None else per.pop((kind, key), None)
    if ghost is None:
        return None
    back, nbytes = ghost
    value = back()
    return None if value is None else (value, nbytes)


def cached(owner, kind: str, key, make: Callable[[], object], *, nbytes=None,
           pinned: bool = False, limit: int | None = None):
    """The entry `(kind, key)` of `owner` (`GLOBAL`: none), made by `make()`
    where there is none (outside the lock: two threads may both make it; the
    first kept wins). `nbytes`: its size (an int, or a function of the value;
    default `nbytes_of`); `pinned`: never dropped; `limit`: at most this many
    entries of `kind` for `owner` (the least recently used dropped)."""
    with _lock:
        per = _store.get(owner)
        e = None if per is None else per.get((kind, key))
        if e is not None:
            e.tick = next(_ticks)
            _stat(kind)[0] += 1
            return e.value
        alive = _revived(owner, kind, key)
        if alive is not None:  # (dropped, but in use elsewhere: taken back)
            _stat(kind)[0] += 1
            e = _store.setdefault(owner, {})[(kind, key)] = _Entry(alive[0], alive[1], pinned,
                                                                   next(_ticks))
            _fit(keep=e)
            return alive[0]
        _stat(kind)[1] += 1
    value = make()
    size = nbytes(value) if callable(nbytes) else nbytes_of(value) if nbytes is None \
        else int(nbytes)
    with _lock:
        per = _store.setdefault(owner, {})
        e = per.get((kind, key))
        if e is not None:  # (made meanwhile by another thread)
            return e.value
        e = per[(kind, key)] = _Entry(value, size, pinned, next(_ticks))
        if limit is not None:
            _drop_oldest([(x.tick, owner, k, x) for k, x in per.items()
                          if k[0] == kind and not x.pinned and x is not e],
                         lambda count, held: count + 1 > limit)
        _fit(keep=e)
    return value


def _entries():
    """`(tick, owner, key, entry)` of every entry (the lock held)."""
    return [(e.tick, owner, k, e) for owner, per in list(_store.items())
            for k, e in per.items()]


def _drop_oldest(candidates, over: Callable[[int, int], bool]) -> None:
    """Drops `candidates` (`(tick, owner, key, entry)`), the least recently
    used first, while `over(count, bytes)` of those left holds (the lock
    held)."""
    left = sorted(candidates, key=lambda t: t[0])
    count, held = len(left), sum(t[3].nbytes for t in left)
    for _, owner, k, e in left:
        if not over(count, held):
            break
        per = _store.get(owner)
        if per is not None and per.get(k) is e:
            del per[k]
            _stat(k[0])[2] += 1
            back = _weak(e.value)
            if back is not None:
                _ghosts.setdefault(owner, {})[k] = (back, e.nbytes)
        count, held = count - 1, held - e.nbytes


def _fit(keep) -> None:
    """Drops the least recently used unpinned entries (but `keep`) until the
    cache is within its budget (the lock held)."""
    entries = _entries()
    fixed = sum(e.nbytes for *_, e in entries if e.pinned or e is keep)
    _drop_oldest([t for t in entries if not (t[3].pinned or t[3] is keep)],
                 lambda count, held: held + fixed > _budget)


def trim(kind: str, *, max_entries: int, max_bytes: int, room: int = 0) -> None:
    """Drops the least recently used entries of `kind` (any owner's) until
    fewer than `max_entries` remain and `room` more bytes fit within
    `max_bytes` beside them: room made before a large entry is built."""
    with _lock:
        _drop_oldest([t for t in _entries() if t[2][0] == kind and not t[3].pinned],
                     lambda count, held: count >= max_entries or held + room > max_bytes)


def forget(owner, kind: str | None = None) -> None:
    """Drops `owner`'s entries (of `kind` only, where given), pinned ones too."""
    with _lock:
        for store in (_store, _ghosts):
            per = store.get(owner)
            for k in [k for k in (per or ()) if kind is None or k[0] == kind]:
                del per[k]


def register_external(kind: str, report: Callable[[], dict], clear: Callable[[], None]):
    """A cache a library sciad calls keeps itself (sparsax's CHOLMOD
    analyses and factors): `report()` gives `{"entries": int, "bytes": int
    or None}`, `clear()` empties it; `info` and `clear` include it."""
    _external[kind] = (report, clear)


@dataclass(frozen=True)
class KindInfo:
    """One kind of entry: how many there are and their bytes (`pinned`:
    of those, never dropped), and how often one was found, made, dropped."""

    entries: int
    bytes: int
    pinned: int = 0
    hits: int = 0
    misses: int = 0
    drops: int = 0


@dataclass(frozen=True)
class CacheInfo:
    """The analysis cache as `sciad.config.analysis_cache_info()` reports it:
    totals, the budget, each kind's figures, and the caches libraries keep
    themselves (`external`: `{"entries": ..., "bytes": ... or None}`)."""

    entries: int
    bytes: int
    budget: int
    kinds: dict = field(default_factory=dict)
    external: dict = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"analysis cache: {self.entries} entries, {si(self.bytes)} of a "
                 f"{si(self.budget)} budget"]
        for kind, k in sorted(self.kinds.items()):
            lines.append(f"  {kind:<28} {k.entries:>5} entries {si(k.bytes):>10}"
                         f"{' (pinned)' if k.pinned else '':<9}  hits {k.hits}, made "
                         f"{k.misses}, dropped {k.drops}")
        for kind, d in sorted(self.external.items()):
            b = d.get("bytes")
            lines.append(f"  {kind:<28} {d.get('entries', 0):>5} entries "
                         f"{si(b) if b is not None else 'n/a':>10}  (kept by the library)")
        return "\n".join(lines)


def info() -> CacheInfo:
    """The cache's entries, bytes and statistics (see `CacheInfo`)."""
    with _lock:
        kinds: dict = {}
        for per in list(_store.values()):
            for (kind, _), e in per.items():
                c = kinds.setdefault(kind, [0, 0, 0])
                c[0] += 1
                c[1] += e.nbytes
                c[2] += e.nbytes if e.pinned else 0
        out = {}
        for kind in set(kinds) | set(_stats):
            n, b, p = kinds.get(kind, (0, 0, 0))
            h, m, d = _stats.get(kind, (0, 0, 0))
            out[kind] = KindInfo(n, b, p, h, m, d)
    external = {}
    for kind, (report, _) in list(_external.items()):
        try:
            external[kind] = dict(report())
        except Exception as e:  # (a library that cannot say: shown, not raised)
            external[kind] = {"entries": 0, "bytes": None, "error": str(e)}
    return CacheInfo(sum(k.entries for k in out.values()), sum(k.bytes for k in out.values()),
                     _budget, out, external)


def clear(kind: str | None = None, *, pinned: bool = False) -> None:
    """Drops every entry (of `kind` only, where given; pinned ones only where
    `pinned`: a compiled program may still read them) and empties the
    libraries' own caches (all, or the one named `kind`)."""
    with _lock:
        for per in list(_store.values()):
            for k in [k for k, e in per.items()
                      if (kind is None or k[0] == kind) and (pinned or not e.pinned)]:
                del per[k]
        for per in list(_ghosts.values()):
            for k in [k for k in per if kind is None or k[0] == kind]:
                del per[k]
    for name, (_, clear_fn) in list(_external.items()):
        if kind is None or kind == name:
            clear_fn()
