"""Banded LU factorization with partial pivoting in the program, for sparse
matrices whose pattern is a narrow band (after a reverse Cuthill-McKee
ordering where the given one is not): sciad's `csrc/band_lu.cc`, XLA FFI
handlers built on first use with the system compiler (`sciad.solvers._build`),
on the CPU.

The stiff integrators factor their iteration matrices (`M - c J`; Radau's
real and complex ones) many times, and solve with each factor in every
Newton iteration. A method of lines in one space dimension gives a banded
Jacobian: the 1,024-state Brusselator's has 2 sub- and 2 superdiagonals.
There the banded LU (LAPACK's unblocked `gbtf2` arithmetic, rows
contiguous) does `n kl (kl + ku)` multiply-adds and no symbolic work: its
factorization is 4-5x faster than KLU's general sparse LU, and its solve of
one right-hand side (compiled for each band width up to 4 and 4) 3-5x
(`bench/band.py`). Its factor is two plain
arrays (the band and the pivots), so a loop keeps it in its state with no
handle to free, and `jax.vmap` batches it as any array.

`Band.of(pattern)` decides: the band of the pattern as it is, or of its
reverse Cuthill-McKee ordering (`scipy.sparse.csgraph`), where its storage
`n (2 kl + ku + 1)` is at most `STORAGE` times the pattern's entries and
`kl + ku <= MAX_WIDTH`; None otherwise (a 2-D stencil's band is as wide as
a row of its grid: the general sparse LU is the right tool there).

```python
band = Band.of(pattern)                  # None where the band is not narrow
lu = band.factor(values)                 # values on the pattern; float64 or complex128
x = band.solve(lu, b)                    # b: (n,) or (n, k); trans=1: A^T, 2: A^H
```
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _build

SOURCE = Path(__file__).parent.parent / "csrc" / "band_lu.cc"
WHAT = "sciad's banded LU"
#: a band is used where its storage is at most this many times the
#: pattern's entries, and `kl + ku` at most `MAX_WIDTH`
STORAGE, MAX_WIDTH = 8, 64


def _setup(lib) -> None:
    for kind in ("f64", "c128"):
        for op in ("factor", "solve"):
            name = f"sciad_band_{op}_{kind}"
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)),
                                        platform="cpu")


_LIBRARY = _build.Library(SOURCE, "band", "libsciad_band.so", WHAT, _setup)


def usable(dtype) -> bool:
    """Whether banded factors are made here for values of `dtype`: real or
    complex floats (float32 and complex64 computed in double precision), on
    the CPU, with the extension built."""
    if np.dtype(dtype).kind not in "fc":
        return False
    return _build.on_cpu() and _LIBRARY.get() is not None


class Factor(NamedTuple):
    """A banded LU factor: the band (`(n, 2 kl + ku + 1)`) and the pivots."""

    lu: jax.Array
    piv: jax.Array


class Band:
    """The band of a pattern in an ordering (see the module docstring)."""

    def __init__(self, n: int, kl: int, ku: int, perm, positions):
        self.n, self.kl, self.ku = n, kl, ku
        self.width = 2 * kl + ku + 1
        #: the ordering (None: the pattern's own): row and column `a` of the
        #: banded matrix are `perm[a]` of the pattern's
        self.perm = perm
        self.inverse = None if perm is None else np.argsort(perm)
        #: where each stored entry of the pattern goes in the flat band
        self.positions = positions

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def of(pattern) -> "Band | None":
        """The band of `pattern` (square) as it is, or reordered by reverse
        Cuthill-McKee where that is narrow; None where neither is."""
        n = pattern.shape[0]
        if n == 0 or pattern.shape[1] != n:
            return None
        rows = np.repeat(np.arange(n), np.diff(np.asarray(pattern.indptr)))
        cols = np.asarray(pattern.indices)
        best = _fit(n, rows, cols, None, pattern.nnz)
        if best is None:
            import scipy.sparse as sp
            from scipy.sparse.csgraph import reverse_cuthill_mckee

            A = sp.csr_matrix((np.ones(pattern.nnz), cols, np.asarray(pattern.indptr)),
                              shape=(n, n))
            perm = np.asarray(reverse_cuthill_mckee((A + A.T).tocsr(), symmetric_mode=True))
            best = _fit(n, rows, cols, perm, pattern.nnz)
        return best

    def factor(self, values) -> Factor:
        """The LU factor of the matrix with `values` (`(nnz,)`, on the
        pattern) in this band."""
        _registered()
        work = _work_dtype(values.dtype)
        kind = "c128" if work == jnp.complex128 else "f64"
        # (the band zeroed and the values placed by the kernel)
        lu, piv, _ = jax.ffi.ffi_call(
            f"sciad_band_factor_{kind}",
            (jax.ShapeDtypeStruct((self.n, self.width), work),
             jax.ShapeDtypeStruct((self.n,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)),
            vmap_method="broadcast_all")(values.astype(work), jnp.asarray(self.positions),
                                         kl=np.int64(self.kl), ku=np.int64(self.ku))
        return Factor(lu, piv)

    def solve(self, factor: Factor, b, trans: int = 0):
        """`A x = b` (`trans=1`: `A^T x = b`; 2: `A^H x = b`) with `factor`,
        `b` of shape `(n,)` or `(n, k)`, in `b`'s dtype (or the factor's,
        where it is complex and `b` real)."""
        _registered()
        work = factor.lu.dtype
        out = jnp.result_type(b.dtype, work) if work == jnp.complex128 else b.dtype
        vec = b.ndim == 1
        bb = (b[:, None] if vec else b).astype(work)
        if self.perm is not None:
            bb = bb[self.perm]
        kind = "c128" if work == jnp.complex128 else "f64"
        x = jax.ffi.ffi_call(f"sciad_band_solve_{kind}", jax.ShapeDtypeStruct(bb.shape, work),
                             vmap_method="broadcast_all")(
            factor.lu, factor.piv, bb, kl=np.int64(self.kl), ku=np.int64(self.ku),
            trans=np.int64(trans))
        if self.perm is not None:
            x = x[self.inverse]
        x = x[:, 0] if vec else x
        return x.astype(out)


def _registered() -> None:
    """The handlers registered (the extension built and loaded), or
    `NotSupportedError` saying why it could not be."""
    if _LIBRARY.get() is None:
        from ...errors import NotSupportedError
        raise NotSupportedError(f"{WHAT} could not be built here: {_LIBRARY.failed}")


def _work_dtype(dtype):
    return jnp.complex128 if np.dtype(dtype).kind == "c" else jnp.float64


def _fit(n, rows, cols, perm, nnz):
    """The `Band` of the entries `(rows, cols)` in the ordering `perm`, or
    None where it is too wide."""
    if perm is not None:
        inverse = np.argsort(perm)
        rows, cols = inverse[rows], inverse[cols]
    kl = int(max(0, np.max(rows - cols, initial=0)))
    ku = int(max(0, np.max(cols - rows, initial=0)))
    width = 2 * kl + ku + 1
    if kl + ku > MAX_WIDTH or n * width > STORAGE * max(nnz, n) or n * width >= 2 ** 31:
        return None
    # (int32: the kernel's placing of the values reads them, x64 or not)
    positions = (rows.astype(np.int64) * width + (cols - rows + kl)).astype(np.int32)
    positions.setflags(write=False)
    return Band(n, kl, ku, perm, positions)
