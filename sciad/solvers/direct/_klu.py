"""`"klu"`: sparse LU by KLU (SuiteSparse), compiled into the program through
XLA's FFI (`sciad.solvers.direct._klu_ffi`): a factorization and its solves run
without Python, on the CPU only.

The symbolic analysis (ordering, block triangular form) is made once per
pattern, at trace time, and kept for the process; the numeric factor is a
`uint64` handle the program makes and frees itself. The factor value
(`linalg.factor`'s) is `(handle,)`:

- a handle made by the program (`linalg.factor` with `uses` counted: all
  its readers are in the program that makes it) is freed by the
  `linalg.release` node that `place_releases` puts after its last reader
  (the factor's `holds`, see `sciad.graph.Holding`), and from the host by a
  check of the program that fails first;
- otherwise (the factor leaves the program: returned by `sd.linalg.factor`,
  saved for a backward pass in another program, or a single solve) the
  handle is 0 and no numeric factor exists: each solve factors and solves in
  one call (`solve_with_symbol`), which frees what it made. So no handle
  outlives the program that made it, and none crosses programs or threads.

Checks run in the program (`sciad.primitives._linalg_run`), with KLU's own
compiled sparse product (`product`, klujax's `dot` kernel: XLA's gathers and
scatters compiled into every checked program cost more than the whole
factorization of a small matrix): non-finite values and a zero row or
column before the factorization, the backward error of every solve. Only
where a measure is off does the program call the host: there a SuperLU
factor of the matrix refines the solution (KLU's threshold pivoting, which
keeps a diagonal pivot down to 1e-3 of its column's largest entry, is not
always backward stable), estimates the condition number and judges
(`_sparse_direct.repair`). A zero pivot fails the factorization in the
kernel, which raises `SingularMatrixError` (its text is recognized by
`sciad.errors`; it names the solver, not the user's line).

"auto" picks it over "splu" for sparse matrices when JAX's default backend
is the CPU, up to `MAX_AUTO` = 12,000 unknowns (any size for at most 3
entries a row), and "splu" above. KLU orders with AMD and factors without
supernodes: where fill is small it wins; on 2-D meshes beyond ~10^4
unknowns SuperLU's supernodes win. Paired against SciPy's splu with a
hand-written adjoint (`bench/inverse_poisson.py`, gradient ratios): the
2-D flagship at N = 64 (4,096 unknowns) klu 0.79, at N = 128 klu 1.20
against sciad's splu 0.88, at N = 256 klu 1.51 against 1.20; a 3-D 7-point Laplacian at 22^3
(`bench/scalable.py`): klu 655 ms, SciPy 1272 ms. Measured in one compiled
program, the median of `factor + 2 solves` on this 2-core CPU under load (a
load average of 7-8: differences under 2x are noise), klu / splu:

- 1-D tridiagonal, n = 1000: 0.45 / 1.1 ms; n = 100,000: 33 / 224 ms
- 2-D 5-point (inverse_poisson's matrix), N = 64: 9.2 / 11.8 ms (a second
  run: 12.9 / 7.2); N = 128: 104 / 159 ms; N = 256: 860 / 552 ms
- 3-D 7-point, 16^3: 112 / 237 ms; 32^3: 34 / 46 s
- a batch of 64 matrices of n = 1024 (2-D, 32^2): 192 / 608 ms

and (load average 1-3; `bench/inverse_poisson.py` and `bench/batch.py` measure
the same cases against their peers): 50 backward-Euler steps with one
n = 512 matrix, value and gradient: klu 2.8 ms, splu 6.5 ms, SciPy's splu with
a hand-written adjoint 3.1 ms; 64 matrices of n = 1024, one solve each: klu
66 ms, klujax's `solve` 55 ms (its kernel call alone: 37-60 ms; the rest is
the checks klujax does not make: a zero row or column before the
factorization, the backward error of each solve).
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from ...errors import (InvalidOptionError, NotSupportedError, SingularMatrixError,
                       register_kernel_error)
from . import _klu_ffi, _sparse_direct
from .._indices import pattern_matmul
from .._linear import AbstractDirectSolver

register_kernel_error(
    _klu_ffi.FACTOR_FAILED, SingularMatrixError,
    "solver 'klu': the matrix is singular: KLU's factorization found a zero pivot. Check "
    "the matrix for a null space (a missing boundary condition, a disconnected part).",
    op="linalg.factor")
register_kernel_error(
    "a solve was given no factor", SingularMatrixError,
    "solver 'klu': the matrix is singular: KLU's factorization found a zero pivot (and "
    "`throw=False` let its solves run). Check the matrix for a null space.",
    op="linalg.backsolve")
# (XLA's SPMD partitioner, on a program holding compiled factors that it
# partitions where sciad did not see it would: `sd.function` and `sd.to_jax`
# hold none when their inputs lie on several devices or `jax.set_mesh` set a
# mesh (`place_releases(hold=False)`); a mesh found another way, or a kernel
# call of sciad's inside the user's own partitioned code, still reaches it)
register_kernel_error(
    "Side-effect HLO must have sharding", NotSupportedError,
    "XLA partitioned a program that makes compiled sparse factors (solver 'klu', or 'cudss') "
    "over several devices in a way sciad could not see from its inputs. Lay the inputs on the "
    "mesh (`jax.device_put(x, NamedSharding(mesh, P('batch')))`) or set it "
    "(`jax.set_mesh(mesh)`), or split the batch over the devices yourself: "
    "`sd.function(sd.vmap(f, spmd_axis_name='batch'), in_shardings=NamedSharding(mesh, "
    "P('batch')))` (see 'Batching and devices')",
    op="linalg.factor")


def _on_cpu() -> bool:
    try:
        return jax.default_backend() == "cpu"
    except RuntimeError:
        return False


class HandleSolver(AbstractDirectSolver):
    """A sparse direct solver compiled into the program whose factor is
    `(handle,)`, a `uint64` (0: no numeric factor; each solve factors), made
    and freed by its kernels `kernels` (a `_klu_ffi.HandleKernels`): KLU's
    here, cuDSS's in `sciad.solvers.direct._cudss`. See the module docstring for
    when a handle is made and freed."""

    matrices = frozenset({"sparse"})
    sparse = True
    where = "device"
    frees_factor = True

    @property
    def kernels(self):
        raise NotImplementedError

    def factor_layout(self, n, dtype, pattern):
        return (((), np.uint64),)

    def factor(self, a, *, pattern=None, uses=None, assume=None, report=None):
        # a numeric factor only where the caller frees it (`uses` counted)
        if uses is None:
            return (jax.numpy.zeros(a.shape[:-1], np.uint64),)
        return (self.kernels.factor(pattern, a, assume),)

    def failed(self, factor, *, pattern=None):
        """Whether the factorization failed (a boolean array), for the
        program to judge; None where a failure stops the program instead."""
        return self.kernels.failed(pattern, factor[0])

    def release(self, factor, after) -> None:
        """Frees the numeric factor `factor` (made with `uses` counted) once
        the values `after` are computed."""
        self.kernels.free(factor[0], after)

    @property
    def release_now(self):
        # (the kernels' host release: a failed check's. cuDSS's handles carry
        # a generation, so a second release is ignored (`idempotent`); KLU's
        # do not, so only a check the program's frees wait for calls it)
        return getattr(self.kernels, "release_now", None)

    def solve(self, factor, a, b, *, pattern=None, transpose=False, numeric=False, **checks):
        return self.kernels.solve(pattern, factor[0], a, b, transpose, numeric)

    def product(self, pattern):
        # (XLA's gather and scatter; KLU has a compiled one)
        return functools.partial(pattern_matmul, pattern)

    def rcond(self, factor, a, *, pattern=None):
        # (SuperLU's estimate on the host, in double precision as KLU factors)
        real = np.finfo(np.dtype(a.dtype)).dtype
        wide = np.complex128 if np.dtype(a.dtype).kind == "c" else np.float64
        return _sparse_direct.rcond_unfactored(pattern, a.astype(wide)).astype(real)

    def factor_flops(self, n, fill):
        return fill.flops


class KLU(HandleSolver):
    """Sparse LU by KLU, compiled (CPU only): the factor is `(handle,)`, a
    `uint64` (0: no numeric factor; each solve factors).

    ```python
    x = sd.linalg.solve(A, b, solver="klu")   # A sparse, on the CPU
    ```
    """

    name = "klu"
    kernels = _klu_ffi.KERNELS
    breakdown = (SingularMatrixError,
                 "solver 'klu': the matrix is singular: KLU's factorization found a zero "
                 "pivot. Check the matrix for a null space (a missing boundary condition, a "
                 "disconnected part).", {"rcond": 0.0})

    def rejects(self, *, matrix, dtype, tags, shown=""):
        why = super().rejects(matrix=matrix, dtype=dtype, tags=tags, shown=shown)
        if why is not None:
            return why
        if not _klu_ffi.available():
            return InvalidOptionError, (
                "solver 'klu' needs klujax's compiled extension (`pip install klujax`); "
                "use 'splu' instead.")
        if not _on_cpu():
            return InvalidOptionError, (
                f"solver 'klu' runs on the CPU only, and JAX's default backend is "
                f"{jax.default_backend()!r}; use 'splu' (SuperLU on the host) or 'spsolve' "
                "(in the program) instead.")
        return None

    def preference(self, *, matrix, tags, dtype):
        if matrix != "sparse" or not _on_cpu() or not _klu_ffi.available():
            return None
        return 2.0  # (above splu's 1.0)

    def preference_for(self, pattern, *, matrix, tags, dtype):
        s = self.preference(matrix=matrix, tags=tags, dtype=dtype)
        if s is not None and pattern is not None and not _small_enough(pattern):
            return 0.5  # (below splu's)
        return s

    def product(self, pattern):
        return functools.partial(_klu_ffi.dot, pattern)


#: the most unknowns for which "auto" picks klu (a matrix with more than 3
#: entries a row; see the module docstring)
MAX_AUTO = 12_000


def _small_enough(pattern) -> bool:
    """Where klu was measured faster than splu (see the module docstring)."""
    n = pattern.shape[0]
    return pattern.nnz <= 3 * n or n <= MAX_AUTO
