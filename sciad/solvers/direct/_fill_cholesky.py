"""A sparse Cholesky factorization on a kept structure, and its derivatives'
kernels, on the host (`csrc/fill_cholesky.cc`, built on first use).

The structure is the selected inverse's (`_selinv._analysis`: the minimum
degree ordering `perm` of `A + A^T` and the fill `S` of the ordered matrix),
so a pattern pays one symbolic analysis for both. Every array is on the
factor's layout: `n` diagonal entries, then the strictly lower entries of
`S` in CSC order (`Layout`). A matrix's symmetric part on that layout is
the scatter-add of its values, halved off the diagonal, to their `slot`s.

The kernels, each on one example of float64 arrays (the callers loop over
batches), each writing its result into `out=` where given:

- `chol(an, e) -> (l, status)`: `L L^T = E`; `status` 0, else `j + 1` where
  the pivot of ordered column `j` is not positive.
- `tangent(an, l, e)`: `X` with `tril(X L^T + L X^T) = E` (`dL` for `dA = E`).
- `adjoint(an, l, x)`: that linear map's transpose.
- `symprod(an, x, y)`: `tril(X Y^T + Y X^T)`; `symmul(an, c, y)`:
  `(C + C^T) Y` on the layout (`C` lower). Each is the other's transpose.
- `trisolve(an, l, b, transpose)`: `L^-1 b` or `L^-T b`, `b` of shape `(n, m)`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from pathlib import Path

import numpy as np

from ...errors import NotSupportedError
from .._build import Library
from ._selinv import _analysis

SOURCE = Path(__file__).parent.parent / "csrc" / "fill_cholesky.cc"

_P = ctypes.POINTER

#: the largest workspace a layout keeps between kernel calls (bytes); larger
#: ones are made for each call, where their page faults are a small part of
#: the kernel's time
KEEP_WORKSPACE_BYTES = 512 << 20


class _Super(ctypes.Structure):
    """`struct Super` of `csrc/fill_cholesky.cc`: the layout's supernodes."""

    _fields_ = [("n", ctypes.c_int64), ("ns", ctypes.c_int64),
                *((name, _P(ctypes.c_int64)) for name in
                  ("Sp", "Si", "first", "rptr", "ridx", "poff", "uptr", "pairs")),
                ("maxrows", ctypes.c_int64)]


def _setup(lib) -> None:
    i64, f64, n = _P(ctypes.c_int64), _P(ctypes.c_double), ctypes.c_int64
    sup = _P(_Super)
    lib.sciad_chol.restype = ctypes.c_int
    lib.sciad_chol.argtypes = [sup, f64, f64, f64]
    for name in ("sciad_chol_tangent", "sciad_chol_adjoint", "sciad_fill_symprod",
                 "sciad_fill_symmul"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [sup, f64, f64, f64, f64]
    lib.sciad_fill_closed.restype = ctypes.c_int
    lib.sciad_fill_closed.argtypes = [n, i64, i64, i64, i64, i64]
    lib.sciad_fill_trisolve.restype = None
    lib.sciad_fill_trisolve.argtypes = [n, i64, i64, f64, ctypes.c_int, n, f64]


LIBRARY = Library(SOURCE, "fill_cholesky", "libsciad_fill_cholesky.so",
                  "sciad's sparse Cholesky factorization", _setup)


def library():
    """The loaded kernels; `NotSupportedError` where they cannot be built."""
    lib = LIBRARY.get()
    if lib is None:
        raise NotSupportedError(f"sciad's sparse Cholesky kernels could not be built here "
                                f"({LIBRARY.failed}); they need a C++ compiler on first use.")
    return lib


class Layout:
    """The factor's layout for one pattern (kept in sciad's analysis cache):
    `perm` (original index `i` is ordered `perm[i]`), `Sp`, `Si` (the fill,
    CSC), `size` (`n + nnz(S)`), each slot's `rows` and `cols` (ordered),
    `slot`: for each entry of `A`, the slot holding it or its mirror, and
    `weight` (1 on the diagonal, else 1/2): the symmetric part on the layout
    is the scatter-add of `weight * A`'s values to `slot`; `supernodes`
    (`_supernodes`), which the kernels work on; and one kept workspace of
    the kernels (`workspace`)."""

    __slots__ = ("n", "perm", "Sp", "Si", "size", "rows", "cols", "slot", "weight",
                 "supernodes", "_super", "_work", "_lock")

    def __init__(self, pattern):
        an = _analysis(pattern)
        n = pattern.shape[0]
        self.n, self.perm = n, an.perm
        self.Sp, self.Si = np.ascontiguousarray(an.Sp), np.ascontiguousarray(an.Si)
        nnz = self.Si.size
        self.size = n + nnz
        col_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.Sp))
        self.rows = np.concatenate([np.arange(n, dtype=np.int64), self.Si])
        self.cols = np.concatenate([np.arange(n, dtype=np.int64), col_of])
        r = an.perm[np.asarray(pattern.rows, np.int64)]
        c = an.perm[np.asarray(pattern.indices, np.int64)]
        hi, lo = np.maximum(r, c), np.minimum(r, c)
        slot = np.where(r == c, r, 0)
        off = r != c
        if nnz:
            at = np.minimum(np.searchsorted(an.key, hi[off] + n * lo[off]), nnz - 1)
            if not np.array_equal(an.key[at], hi[off] + n * lo[off]):
                raise RuntimeError("sciad's sparse Cholesky: an entry outside the fill")
            slot[off] = n + at
        self.slot = slot
        self.weight = np.where(r == c, 1.0, 0.5)
        lib = LIBRARY.get()
        if lib is not None:  # (the kernels' loops take the fill's closure for granted)
            status = closed(n, self.Sp, self.Si)
            if status:
                raise RuntimeError(f"sciad's sparse Cholesky: the fill is not closed at "
                                   f"column {-status - 1}")
        self.supernodes = _supernodes(n, self.Sp, self.Si)
        sn = self.supernodes
        self._super = _Super(n, sn["first"].size - 1, _ptr(self.Sp), _ptr(self.Si),
                             *(_ptr(sn[k]) for k in ("first", "rptr", "ridx", "poff", "uptr",
                                                     "pairs")),
                             int(sn["maxrows"]))
        self._work = None
        self._lock = threading.Lock()

    @property
    def work_size(self) -> int:
        """The kernels' workspace: three buffers of panels, in doubles."""
        return 3 * int(self.supernodes["poff"][-1])

    @property
    def keeps_workspace(self) -> bool:
        """Whether a workspace is kept between calls (`KEEP_WORKSPACE_BYTES`)."""
        return 8 * self.work_size <= KEEP_WORKSPACE_BYTES

    @property
    def nbytes(self) -> int:
        """Its arrays' bytes, with the workspace it keeps (where it keeps one)."""
        arrays = [getattr(self, k) for k in self.__slots__ if isinstance(getattr(self, k),
                                                                         np.ndarray)]
        kept = 8 * self.work_size if self.keeps_workspace else 0
        return sum(a.nbytes for a in arrays + list(self.supernodes.values())) + kept

    @contextlib.contextmanager
    def workspace(self):
        """A workspace for one kernel call: the one this layout keeps when no
        other call holds it, else a new one (kept afterwards if the slot is
        free and it is at most `KEEP_WORKSPACE_BYTES`). Buffers this size made
        afresh on every call cost their page faults each time: a third of a
        kernel's time at 65,536 unknowns."""
        with self._lock:
            work, self._work = self._work, None
        if work is None:
            work = np.empty(self.work_size)
        try:
            yield work
        finally:
            if self.keeps_workspace:
                with self._lock:
                    if self._work is None:
                        self._work = work

    def flops(self) -> float:
        """About the factorization's multiply-adds: `sum_k |col k|^2`."""
        return float(np.sum((np.diff(self.Sp) + 1.0) ** 2))


def _supernodes(n: int, Sp: np.ndarray, Si: np.ndarray) -> dict:
    """The supernodes of the fill (`struct Super` in `csrc/fill_cholesky.cc`):
    column `j + 1` joins `j`'s when `j`'s rows below it are `j + 1` and
    `j + 1`'s (the fill being closed, when `j` has one more row than `j + 1`
    and its first is `j + 1`). Each supernode's panel rows (its columns,
    then its last column's rows), their offsets, and for each supernode `J`
    the earlier ones `K` with rows in it (`pairs`, a row each: `K`, its
    panel's offset, rows, width and first row's place in `ridx`, then `a`
    and `b`): `K`'s rows in `J` are a run `a .. b` of `K`'s panel rows
    (found on `K`'s last column, whose rows are the panel's below its
    columns)."""
    count = np.diff(Sp)
    join = np.zeros(n, bool)
    if n > 1 and Si.size:
        head = np.where(count[:-1] > 0, Si[np.minimum(Sp[:n - 1], Si.size - 1)], -1)
        join[1:] = (count[:-1] == count[1:] + 1) & (head == np.arange(1, n))
    first = np.append(np.flatnonzero(~join), n).astype(np.int64)
    ns = first.size - 1
    width = np.diff(first)
    last = first[1:] - 1
    below = count[last] if ns else np.zeros(0, np.int64)
    m = width + below
    rptr = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
    poff = np.concatenate([[0], np.cumsum(m * width)]).astype(np.int64)
    owner = np.repeat(np.arange(ns, dtype=np.int64), width)  # (each column's supernode)
    # each panel's rows: its columns, then its last column's rows
    k_of = np.repeat(np.arange(ns, dtype=np.int64), m)
    at = np.arange(rptr[-1], dtype=np.int64) - rptr[k_of]   # (position in the panel)
    own = at < width[k_of]
    ridx = first[k_of] + at
    kb = k_of[~own]
    ridx[~own] = Si[Sp[last[kb]] + at[~own] - width[kb]]
    # the pairs (K, J): K's rows below its columns, grouped by their supernode J
    rows_k, pos_k = k_of[~own], at[~own]
    j_of = owner[ridx[~own]]
    new = np.ones(rows_k.size, bool)
    new[1:] = (rows_k[1:] != rows_k[:-1]) | (j_of[1:] != j_of[:-1])
    starts = np.flatnonzero(new)
    uk, uj, ua = rows_k[starts], j_of[starts], pos_k[starts]
    ub = pos_k[np.append(starts[1:], rows_k.size)[:starts.size] - 1] + 1
    order = np.lexsort((uk, uj))
    uk, uj, ua, ub = uk[order], uj[order], ua[order], ub[order]
    uptr = np.concatenate([[0], np.cumsum(np.bincount(uj, minlength=ns))]).astype(np.int64)
    pairs = np.stack([uk, poff[uk], m[uk], width[uk], rptr[uk], ua, ub], axis=1)
    return {"first": first, "rptr": rptr, "ridx": ridx.astype(np.int64), "poff": poff,
            "uptr": uptr, "pairs": np.ascontiguousarray(pairs, np.int64),
            "maxrows": np.int64(m.max() if ns else 0)}


def layout(pattern) -> Layout:
    from ... import _cache

    return _cache.cached(pattern, "sparse cholesky", None, lambda: Layout(pattern),
                         nbytes=lambda a: a.nbytes)


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(_P(ctypes.c_int64 if a.dtype == np.int64 else ctypes.c_double))


def closed(n: int, Sp: np.ndarray, Si: np.ndarray) -> int:
    """`sciad_fill_closed` of the fill `Sp`, `Si` (int64, CSC): 0 where it is
    closed, else `-(j + 1)` for the first column `j` missing a row. Reads
    the fill's row structure (per row the positions of its entries, by
    column, and each position's column), made here for the check alone."""
    Rq = np.argsort(Si, kind="stable").astype(np.int64)
    Rp = np.concatenate([[0], np.cumsum(np.bincount(Si, minlength=n))]).astype(np.int64)
    col = np.repeat(np.arange(n, dtype=np.int64), np.diff(Sp))
    return int(library().sciad_fill_closed(n, *(_ptr(a) for a in (Sp, Si, Rp, Rq, col))))


def _f64(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float64)


def _out(an: Layout, out) -> np.ndarray:
    if out is None:
        return np.empty(an.size)
    if out.shape != (an.size,) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"`out` must be a contiguous float64 vector of {an.size} entries")
    return out


def chol(an: Layout, e: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """`(l, status)`; `l` written into `out` where given."""
    lib = library()
    e, out = _f64(e), _out(an, out)
    with an.workspace() as work:
        status = lib.sciad_chol(ctypes.byref(an._super), _ptr(e), _ptr(out), _ptr(work))
    return out, int(status)


def _binary(name: str):
    def kernel(an: Layout, x: np.ndarray, y: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray:
        lib = library()
        x, y, out = _f64(x), _f64(y), _out(an, out)
        with an.workspace() as work:
            getattr(lib, name)(ctypes.byref(an._super), _ptr(x), _ptr(y), _ptr(out),
                               _ptr(work))
        return out
    kernel.__name__ = name
    return kernel


tangent = _binary("sciad_chol_tangent")
adjoint = _binary("sciad_chol_adjoint")
symprod = _binary("sciad_fill_symprod")
symmul = _binary("sciad_fill_symmul")


def trisolve(an: Layout, l: np.ndarray, b: np.ndarray, transpose: bool) -> np.ndarray:
    """`L^-1 b` (`L^-T b` with `transpose`), `b` of shape `(n, m)`."""
    lib = library()
    l = _f64(l)
    x = np.array(np.asarray(b, np.float64).T, order="C")   # (m vectors, one after another)
    lib.sciad_fill_trisolve(an.n, _ptr(an.Sp), _ptr(an.Si), _ptr(l), int(transpose),
                            x.shape[0], _ptr(x))
    return x.T
