"""`"cholmod"`: sparse Cholesky (`A = L L^T`) by CHOLMOD (SuiteSparse), for
real symmetric positive definite matrices, on the host: the factor is held
there like SuperLU's (`sciad.solvers.direct._sparse_direct`: a handle in the program,
the checks and the iterative refinement of every solve in its host calls).

CHOLMOD comes with cvxopt (`pip install "sciad[cholmod]"`; cvxopt is GPL-3
licensed, so it is an optional extra of this Apache-2.0 library), whose
`cvxopt.cholmod` module is the only maintained wheel of it on the package
index. Its supernodal factorization, with AMD's ordering, needs half the
flops of an LU of the same matrix and runs its supernodes through BLAS:
measured on the flagship's 2-D matrices (`bench/inverse_poisson.py`'s, the
numeric factorization alone, one BLAS thread, medians of 9), CHOLMOD
against SuperLU in the symmetric mode sciad runs it in:

- N = 128 (16,384 unknowns): 16.8 ms against 50.0 ms;
- N = 256 (65,536 unknowns): 50.2 ms against 193 ms.

The symbolic analysis (ordering, supernodes: 27 ms at N = 256) is made once
per pattern and reused: CHOLMOD factors new values into an analyzed factor
object, so each of the last `MAX_PATTERNS` patterns keeps up to
`SPARE_FACTORS` of them that no live factor holds, and a factorization takes
one before it analyzes again. A spare holds the memory of the last numeric
factor made in it between calls (the flagship's process at N = 256 held
about 60 MB more than with SuperLU): the price of not analyzing again
(cvxopt has no call that frees the numeric part alone).

A matrix that is not positive definite makes the factorization break down:
`NotPositiveDefiniteError`, as the dense `"cholesky"` says it.

"auto" picks it for a real sparse matrix tagged (or assumed) spd, when
cvxopt is installed: from `OVER_KLU` unknowns (with more than 3 entries a
row) on the CPU, and at every size where KLU does not run.
"""

from __future__ import annotations

import threading

import numpy as np

from ... import _cache
from ...errors import InvalidOptionError, NotPositiveDefiniteError, StructureError
from . import _sparse_direct
from ._splu import SuperLU

#: the fewest unknowns for which "auto" prefers it to KLU (a matrix with more
#: than 3 entries a row; KLU's compiled path has no host round trip, which
#: wins on small matrices): on the flagship's 2-D matrices, the gradient
#: (`bench/inverse_poisson.py --direct-solver`) at 1,024 unknowns took
#: 1.42 ms against KLU's 1.05, at 4,096 4.47 ms against 8.33
OVER_KLU = 2_500

#: analyzed factor objects kept per pattern for later factorizations (each
#: holds its last numeric factor's memory too: cvxopt cannot free it alone)
SPARE_FACTORS = 1
#: patterns whose analyses are kept (the least recently factored dropped;
#: sciad's analysis cache may drop them sooner, within its byte budget)
MAX_PATTERNS = 8


def available() -> bool:
    """Whether cvxopt's CHOLMOD can be imported."""
    try:
        import cvxopt.cholmod  # noqa: F401
    except ImportError:
        return False
    return True


class _Pattern:
    """One pattern's lower triangle as CHOLMOD reads it: `select` picks the
    pattern's values (row-major) in CHOLMOD's column-major order; `matrix`
    (a `cvxopt.spmatrix`) takes each factorization's values in place."""

    def __init__(self, pattern):
        import cvxopt

        rows = np.asarray(pattern.rows, np.int64)
        cols = np.asarray(pattern.indices, np.int64)
        low = np.flatnonzero(cols <= rows)
        self.select = low[np.lexsort((rows[low], cols[low]))]
        n = pattern.shape[0]
        self.matrix = cvxopt.spmatrix(
            cvxopt.matrix(np.zeros(self.select.size)), cvxopt.matrix(rows[self.select]),
            cvxopt.matrix(cols[self.select]), (n, n))
        self.spares: list = []
        self.lock = threading.Lock()


def _prepared(pattern) -> _Pattern:
    """The pattern's `_Pattern`, kept in sciad's analysis cache (at most
    `MAX_PATTERNS` patterns' at a time; each counted at its lower
    triangle's values and indices, and a spare factor's at least as much)."""
    return _cache.cached(_cache.GLOBAL, "cholmod analysis (cvxopt)", pattern,
                         lambda: _Pattern(pattern), limit=MAX_PATTERNS,
                         nbytes=lambda p: (8 + 8 + 8) * p.select.size * (1 + SPARE_FACTORS))


def spare_factors(pattern) -> int:
    """How many analyzed factor objects `pattern` keeps now (for tests)."""
    return len(_prepared(pattern).spares)


class _Factor:
    """A CHOLMOD factor of `A` (symmetric, so also of `A^T`), as
    `sciad.solvers.direct._sparse_direct` holds a SuperLU one: `solve(b, trans)` and
    `nnz`. Dropped, it hands its analyzed factor object back to its
    pattern's spares."""

    __slots__ = ("factor", "prepared", "nnz")

    def __init__(self, factor, prepared: _Pattern, nnz: int):
        self.factor, self.prepared, self.nnz = factor, prepared, nnz

    def solve(self, b: np.ndarray, trans: str = "N") -> np.ndarray:
        import cvxopt
        import cvxopt.cholmod as chm

        if np.iscomplexobj(b):  # (a real matrix: the parts apart)
            return self.solve(b.real) + 1j * self.solve(b.imag)
        x = cvxopt.matrix(np.asarray(b, np.float64))
        chm.solve(self.factor, x)
        return np.asarray(x).reshape(b.shape).astype(b.dtype, copy=False)

    def __del__(self):
        try:
            spares = self.prepared.spares
            with self.prepared.lock:
                if len(spares) < SPARE_FACTORS:
                    spares.append(self.factor)
        except Exception:  # (at interpreter exit: the module's globals may be gone)
            pass


def factorize(pattern, d: np.ndarray):
    """The CHOLMOD factor of the spd matrix with values `d` on `pattern`
    (`_sparse_direct`'s `factorize`), None where it breaks down (the matrix
    is not positive definite)."""
    import cvxopt
    import cvxopt.cholmod as chm

    p = _prepared(pattern)
    with p.lock:
        f = p.spares.pop() if p.spares else None
        a = p.matrix
        a.V = cvxopt.matrix(np.asarray(d[p.select], np.float64))
        if f is None:
            f = chm.symbolic(a, uplo="L")
        try:
            chm.numeric(a, f)
        except ArithmeticError:  # (not positive definite: f stays usable)
            if len(p.spares) < SPARE_FACTORS:
                p.spares.append(f)
            return None
    # (CHOLMOD does not say its factor's size: at least the matrix's lower
    # triangle, which the host store's memory bound counts)
    return _Factor(f, p, int(p.select.size))


class CholmodChoice:
    """What the two "cholmod" records share (this host one, and the compiled
    one of `sciad.solvers.direct._cholmod_ffi`): the name, what they factor, when
    "auto" picks them, their refusals and breakdown. A record says whether
    it can run here (`available()`) and what it needs (`needs`)."""

    name = "cholmod"
    dtype_kinds = "f"
    symmetric_adjoint = True
    breakdown = (NotPositiveDefiniteError,
                 "CHOLMOD's Cholesky factorization broke down: the matrix is not positive "
                 "definite. Solve with solver='splu' if it is only symmetric.", {})
    needs = ""

    def available(self) -> bool:
        raise NotImplementedError

    def preference(self, *, matrix, tags, dtype):
        if matrix != "sparse" or "spd" not in tags or np.dtype(dtype).kind != "f" \
                or not self.available():
            return None
        return 1.5  # (above splu's 1.0, below klu's 2.0 where klu is measured faster)

    def preference_for(self, pattern, *, matrix, tags, dtype):
        s = self.preference(matrix=matrix, tags=tags, dtype=dtype)
        if s is not None and pattern is not None and pattern.shape[0] >= OVER_KLU \
                and pattern.nnz > 3 * pattern.shape[0]:
            return 2.5  # (above klu's 2.0: measured faster there)
        return s

    def factor_flops(self, n, fill):
        return fill.flops / 2  # (Cholesky: half an LU's of the same fill)

    def rejects(self, *, matrix, dtype, tags, shown=""):
        why = super().rejects(matrix=matrix, dtype=dtype, tags=tags, shown=shown)
        if why is not None:
            return why
        if "spd" not in tags:
            return StructureError, (
                "solver 'cholmod' factors symmetric positive definite matrices: tag the "
                "matrix spd (`tags={'spd'}`) or pass assume='spd', or use 'splu'.")
        if not self.available():
            return InvalidOptionError, (
                f"solver 'cholmod' needs {self.needs} here; use 'splu' instead.")
        return None


class Cholmod(CholmodChoice, SuperLU):
    """Sparse Cholesky by CHOLMOD (cvxopt's) on the host, for a real sparse
    matrix tagged (or assumed) spd: the factor is `(handle,)`, an int32,
    held, solved and estimated as SuperLU's (the record it specializes).
    "cholmod" where sparsax's compiled kernels are not installed (see
    `sciad.solvers.direct._cholmod_ffi`).

    ```python
    A = sd.sparse.coo_matrix((vals, (rows, cols)), shape=(n, n), tags={"spd"})
    x = sd.linalg.solve(A, b, solver="cholmod")   # pip install "sciad[cholmod]"
    ```
    """

    needs = "cvxopt's CHOLMOD (`pip install cvxopt`, GPL-3 licensed)"

    def available(self) -> bool:
        return available()

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        return _sparse_direct.factor(pattern, a, uses=uses, assume=assume, report=report,
                                     factorize=factorize)
