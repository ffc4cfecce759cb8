"""cuDSS's kernels as the "cudss" record calls them: the FFI handlers of
`csrc/cudss_ffi.cc` (built by `_cudss_build`, registered as `sciad_cudss_*`
CUDA targets), behind the interface of `_klu_ffi.HandleKernels`.

- Analysis: `analyze(pattern, assume)` hands the CSR structure to the
  extension once per pattern and matrix type (a host object whose address
  every call carries as its `pattern` attribute, kept in sciad's analysis
  cache, `sciad._cache`, as "cudss pattern", pinned: a compiled program
  embeds the address);
  cuDSS's reordering and symbolic factorization run in the first
  factorization of each pooled cuDSS data object and are kept with it
  (see the C++ source's header).
- Matrix types: `assume="spd"` factors with cuDSS's Cholesky
  (`CUDSS_MTYPE_SPD`), `"symmetric"` with LDL^T (`CUDSS_MTYPE_SYMMETRIC`),
  real matrices only; anything else, complex matrices included, with LU
  (`CUDSS_MTYPE_GENERAL`). A solve with a 0 handle (no factor kept: one
  solve) factors with LU.
- Transposed solves read the same factor (cuDSS >= 1.0's
  `CUDSS_SOLVE_MODE_TRANSPOSE`): no second factorization. Should a cuDSS
  build refuse that mode for some matrix type or setting, the fallback
  `SCIAD_CUDSS_TRANSPOSE=refactor` (or `KERNELS.transpose = "refactor"`)
  solves `A^T x = b` by factoring the transpose in the call that solves
  (its values gathered in the program onto the transposed pattern).
- Values are solved in float64 / complex128 (float32 cast up and back), as
  KLU's; no mixed-precision mode yet.
- Batches (`jax.vmap`): one call for the batch, in cuDSS's uniform-batch
  mode (`CUDSS_CONFIG_UBATCH_SIZE`): one analysis per pattern and batch
  size, one factorization and one solve call for the batch's matrices.
  `SCIAD_CUDSS_BATCH=0` factors each example in a data object of its own
  instead (pooled, each analysed once); so does the process after cuDSS
  refuses a batch factorization (`KERNELS.batch_status()` says why).

A factorization that fails (a zero pivot, a Cholesky breakdown) is a value:
its handle is 0 (`failed`), which the program judges with the node and the
user's line; a one-call solve of such a matrix is NaN.

The handlers read handles back from the device (a copy of 8 bytes per
matrix) and synchronize their stream before returning; see the C++ source.
"""

from __future__ import annotations

import ctypes
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np

from ... import _cache
from . import _cudss_build
from ._klu_ffi import HandleKernels

_HANDLERS = ("factor", "solve", "factor_solve", "free")

#: cuDSS's `cudssMatrixType_t` for sciad's `assume` (real matrices)
MTYPES = {None: 0, "symmetric": 1, "spd": 3}


def gpu_backend() -> bool:
    """Whether JAX's default backend is an NVIDIA GPU."""
    try:
        if jax.default_backend() != "gpu":
            return False
        device = jax.devices()[0]
        client = getattr(device, "client", None)  # (a private attribute in some versions)
        version = getattr(client, "platform_version", None)
        if version is None:  # (then the device's own name: "NVIDIA H100 80GB HBM3")
            return "nvidia" in str(getattr(device, "device_kind", "")).lower()
        return "cuda" in str(version).lower()
    except RuntimeError:
        return False


def _barrier() -> None:
    """Waits until every program dispatched so far on the GPUs has run:
    a program on each device, after them in its queue, and its result."""
    for device in jax.local_devices():
        if device.platform == "gpu":
            jax.block_until_ready(_tick(jax.device_put(np.int32(0), device)))


@jax.jit
def _tick(x):
    return x + 1


class CudssKernels(HandleKernels):
    """The cuDSS FFI kernels (CUDA only)."""

    name = "cudss"

    def __init__(self):
        self._lock = threading.Lock()
        self._registered = False
        #: "native" (cuDSS's transposed solve, the same factor) or "refactor"
        self.transpose = os.environ.get("SCIAD_CUDSS_TRANSPOSE", "native")

    def unavailable(self) -> str | None:
        if not gpu_backend():
            try:
                where = jax.default_backend()
            except RuntimeError:
                where = "none"
            return (f"it runs on an NVIDIA GPU only, and JAX's default backend is {where!r} "
                    f"(to get it: a CUDA GPU, {_cudss_build.INSTALL})")
        try:
            _cudss_build.library()
        except Exception as e:  # (NotSupportedError: no extra, no compiler, a failed build)
            return str(e)
        return None

    def register(self) -> None:
        if self._registered:
            return
        with self._lock:
            if not self._registered:
                lib = _cudss_build.library()
                for name in _HANDLERS:
                    fn = getattr(lib, f"sciad_cudss_{name}")
                    jax.ffi.register_ffi_target(f"sciad_cudss_{name}", jax.ffi.pycapsule(fn),
                                                platform="CUDA")
                self._registered = True

    def analyze(self, pattern, assume=None, dtype=None):
        real = dtype is None or np.dtype(dtype).kind != "c"
        mtype = MTYPES.get(assume, 0) if real else 0  # (complex: LU)

        def make():
            lib = _cudss_build.library()
            offsets = np.ascontiguousarray(pattern.indptr, np.int32)
            cols = np.ascontiguousarray(pattern.indices, np.int32)
            return int(lib.sciad_cudss_pattern(pattern.shape[0], pattern.nnz,
                                               offsets.ctypes.data, cols.ctypes.data, mtype))

        with self._lock:  # (one C++ object per pattern and type: a second make would leak)
            return _cache.cached(_cache.GLOBAL, "cudss pattern", (pattern, mtype), make,
                                 nbytes=4 * (pattern.shape[0] + 1 + pattern.nnz), pinned=True)

    def failed(self, pattern, handle):
        # (a factorization cuDSS reports as failed writes a 0 handle)
        if pattern.shape[0] == 0:
            return None
        return handle == 0

    def kind(self, dtype) -> str:
        return np.dtype(dtype).name

    def _factor_call(self, raw, kind, ax):
        call = jax.ffi.ffi_call("sciad_cudss_factor",
                                jax.ShapeDtypeStruct(ax.shape[:1], jnp.uint64),
                                has_side_effect=True)  # (never merged with another: one free each)
        return call(ax, pattern=np.uint64(raw))

    def _solve_call(self, raw, kind, transpose, h, ax, b):
        bt = jnp.swapaxes(b, 1, 2)  # (each column contiguous: cuDSS's column-major)
        call = jax.ffi.ffi_call("sciad_cudss_solve", jax.ShapeDtypeStruct(bt.shape, bt.dtype))
        return jnp.swapaxes(call(h, ax, bt, pattern=np.uint64(raw), transpose=bool(transpose)),
                            1, 2)

    def _factor_solve_call(self, raw, kind, transpose, ax, b):
        bt = jnp.swapaxes(b, 1, 2)
        call = jax.ffi.ffi_call("sciad_cudss_factor_solve",
                                jax.ShapeDtypeStruct(bt.shape, bt.dtype))
        return jnp.swapaxes(call(ax, bt, pattern=np.uint64(raw), transpose=bool(transpose)),
                            1, 2)

    def _free_call(self, h):
        call = jax.ffi.ffi_call("sciad_cudss_free", jax.ShapeDtypeStruct(h.shape, jnp.int32),
                                has_side_effect=True)
        return call(h)

    def live_factors(self) -> int:
        """Numeric factors made and not yet freed, in this process, once the
        programs already dispatched have run (JAX runs them asynchronously:
        a program's outputs can be ready before its last free has run)."""
        lib = _cudss_build.library()
        _barrier()
        return int(lib.sciad_cudss_live_factors())

    def release_now(self, handles) -> None:
        """Releases the factors `handles` (a NumPy array of any shape) from
        the host: a failed check's, whose raise stops the program before its
        own frees run. Handles released already (their generation is gone)
        are ignored, so a free that runs after all does no harm."""
        h = np.ascontiguousarray(np.asarray(handles, np.uint64).ravel())
        if h.size:
            _cudss_build.library().sciad_cudss_release(h.ctypes.data, h.size)

    release_now.idempotent = True  # (see `sciad.graph.Holding`)

    def batch_status(self) -> tuple[bool, str]:
        """(whether uniform-batch mode is on, why not where it is off)."""
        why = ctypes.create_string_buffer(256)
        on = bool(_cudss_build.library().sciad_cudss_batch_status(why, len(why)))
        return on, why.value.decode()

    def set_batch(self, on: bool) -> None:
        """Turns uniform-batch mode on or off for the factorizations that run
        from now on (programs already dispatched may still be running)."""
        _cudss_build.library().sciad_cudss_set_batch(1 if on else 0)

    def batch_fallbacks(self) -> int:
        """How many batch solves ran one example at a time (each factored
        again): members read apart from their batch, or a batch solve cuDSS
        refused."""
        return int(_cudss_build.library().sciad_cudss_batch_fallbacks())

    live = live_factors

    def pooled(self, pattern, assume=None, dtype=None) -> int:
        """How many analysed cuDSS data objects the pattern holds (all devices)."""
        raw = self.analyze(pattern, assume, dtype)
        return int(_cudss_build.library().sciad_cudss_pooled(raw))


#: the cuDSS kernels (one per process)
KERNELS = CudssKernels()
