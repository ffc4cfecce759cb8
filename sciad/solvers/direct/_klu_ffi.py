"""KLU's compiled kernels (klujax's `klujax_cpp` extension) called through
XLA's FFI under sciad-owned names, with no Python on the per-call path.

The glue around the kernels (batching, the handle or one-call path, an
ordered free, the work dtype) is `HandleKernels`, shared with the cuDSS
kernels (`sciad.solvers.direct._cudss_ffi`); `KLUKernels` is KLU's backend of it.

klujax's Python module is not imported: it sets JAX's global configuration
(`jax_platform_name="cpu"`, x64) when imported. Its nanobind extension
`klujax_cpp` holds the FFI handlers; they are registered here, once, when
a KLU solve is first lowered, as `sciad_klu_*` CPU targets.

- Symbolic analysis (`symbolic(pattern)`): KLU's ordering and block
  structure of a pattern, made eagerly on the host at trace time (the
  pattern is static) and kept in sciad's analysis cache (`sciad._cache`),
  pinned, for the life of the process (O(n + nnz) memory each): a compiled
  program embeds the raw handle as a constant, and nothing tells when the
  last program that embeds it is gone.
- Numeric factors (`factor`): `uint64` handles to KLU numeric objects made
  by the program; whoever makes them frees them (`free`) in the same
  program, after every reader (see `sciad.primitives._linalg_run`). A handle of
  0 means "no numeric factor": a solve then factors and solves in one call
  (`solve_with_symbol`, which frees its own factor).
- Handles with generations: where sciad's C++ extension is built (the batch
  splitter's, `sciad.solvers._batch_split`), a handle is not KLU's raw
  pointer but an entry of its handle table with a generation: a release
  ends the entry, so a second release of the same handle (a failed check's
  from the host, then the program's own) or a stale one frees nothing, and
  a solve with a released handle fails instead of reading freed memory.
  Without a compiler, handles are raw pointers and there is no host release
  (`release_now` is None): a failed check then leaves its program's factors,
  a leak, never a double free.
- Batching: each kernel takes a leading batch axis (`n_lhs` matrices on
  one pattern); `jax.vmap` of these functions folds its axes into that one
  (`jax.custom_batching.custom_vmap`), so a batch of matrices is one call.

KLU computes in double precision: float32 and complex64 values are solved
in float64 / complex128 and cast back. A structurally or numerically
singular matrix (a zero pivot) fails KLU's factorization. Through the
handle table its handle is 0 (`failed`: the program judges it, naming the
node and the user's line), and a one-call solve's result is NaN (the
solve's checks judge it); without the table the call fails with the
message `FACTOR_FAILED`, which `sciad.errors` turns into
`SingularMatrixError`.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from ... import _cache
from ...config import x64_scope
from .. import _batch_split, _build
from .._indices import pattern_transpose, take

#: the text of the FFI error a failed (singular) KLU factorization raises
FACTOR_FAILED = "klu_factor/z_factor failed"

_KERNELS = ("analyze", "factor_f64", "factor_c128", "solve_with_numeric_f64",
            "solve_with_numeric_c128", "tsolve_with_numeric_f64", "tsolve_with_numeric_c128",
            "solve_with_symbol_f64", "solve_with_symbol_c128", "tsolve_with_symbol_f64",
            "tsolve_with_symbol_c128", "free_numeric", "dot_f64", "dot_c128")

#: measured costs per stored entry (ns) of one item of a batch, for how many
#: slices `_batch_split` makes: a factorization (0.53 ms for a 1,024-unknown
#: 5-point matrix of 4,992 entries), a solve with a factor per right-hand
#: side, a product
FACTOR_NS_PER_ENTRY = 100
SOLVE_NS_PER_ENTRY = 10
DOT_NS_PER_ENTRY = 2

_lock = threading.Lock()


def available() -> bool:
    """Whether klujax's compiled extension can be imported."""
    return _build.importable("klujax_cpp")


@_build.once
def _register() -> None:
    import klujax_cpp
    split = _batch_split.library() is not None
    for name in _KERNELS:
        capsule = getattr(klujax_cpp, name)()
        jax.ffi.register_ffi_target(f"sciad_klu_{name}", capsule, platform="cpu")
        if split and name != "analyze":
            _batch_split.set_inner(f"sciad_klu_{name}", capsule)


def symbolic(pattern):
    """`(raw handle, rows, cols)`: the symbolic analysis of `pattern` (made
    once per pattern per process; see the module docstring) and its entries'
    row and column indices (int32, row-major: the order of the values).
    Kept in sciad's analysis cache (`sciad._cache`), pinned: a compiled
    program embeds the raw handle."""
    _register()
    got = _cache.cached(_cache.GLOBAL, "klu symbolic", pattern, lambda: _analyze(pattern),
                        nbytes=lambda v: v[2].nbytes + v[3].nbytes
                        + SYMBOLIC_BYTES_PER_ROW * pattern.shape[0], pinned=True)
    return got[1:]


#: KLU's symbolic object's size per row (its orderings, block boundaries and
#: permutations: about five int64 arrays of n), for the cache's accounting
SYMBOLIC_BYTES_PER_ROW = 40


def _analyze(pattern):
    import klujax_cpp
    with _lock:  # (one analysis at a time: KLU's calls are not reentrant here)
        rows = np.asarray(pattern.row_index(), np.int32)
        cols = np.asarray(pattern.indices, np.int32)
        with x64_scope(), jax.ensure_compile_time_eval(), \
                jax.default_device(jax.local_devices(backend="cpu")[0]):
            raw = jax.ffi.ffi_call("sciad_klu_analyze", jax.ShapeDtypeStruct((), jnp.uint64))(
                rows, cols, np.int32(pattern.shape[1]))
            raw = int(np.asarray(raw))
        if raw == 0:
            raise RuntimeError("KLU's symbolic analysis failed (klu_analyze returned no "
                               f"object) for the pattern {pattern}.")
        keep = klujax_cpp.KLUSymbolic(raw)  # (frees the analysis when dropped)
        return keep, raw, rows, cols


def cached_patterns() -> int:
    """How many symbolic analyses the process holds."""
    return _cache.info().kinds.get("klu symbolic", _cache.KindInfo(0, 0)).entries


def _suffix(dtype) -> str:
    return "c128" if np.dtype(dtype).kind == "c" else "f64"


def _work_dtype(dtype):
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


# --- the kernels on a leading batch axis (n_lhs), behind one small interface ---


class HandleKernels:
    """A compiled sparse direct solver whose numeric factors are `uint64`
    handles the program makes and frees (KLU here; cuDSS in
    `sciad.solvers.direct._cudss_ffi`): what a record (`sciad.solvers.direct._klu.HandleSolver`)
    calls, and the shared glue around a backend's four kernels.

    A backend implements, on a leading batch axis of `L` matrices on one
    pattern (`state`: its analysis of the pattern, `analyze`):
    `_factor_call(state, kind, ax)` (`(L, nnz)` -> `(L,)` handles),
    `_solve_call(state, kind, transpose, h, ax, b)` (`b`: `(L, n, k)`),
    `_factor_solve_call(state, kind, transpose, ax, b)` (factors, solves and
    frees in one call: a 0 handle) and `_free_call(h)` (`(L,)` -> `(L,)`
    int32). This class folds `jax.vmap`'s axes into that one
    (`custom_vmap`), casts to the work dtype, picks the handle or the
    one-call path, and orders a free after the values it must wait for.

    ```python
    h = KERNELS.factor(pattern, a)              # a: (nnz,) values
    x = KERNELS.solve(pattern, h, a, b, False)  # b: (n,) or (n, k)
    tok = KERNELS.free(h, after=[x])
    ```
    """

    name = "klu"
    #: how `solve` takes `transpose`: "native" (the backend's transposed solve
    #: with the same factor) or "refactor" (the transpose factored in the call
    #: that solves: a fallback for a backend without a transposed solve)
    transpose = "native"

    def unavailable(self) -> str | None:
        """Why the kernels cannot run here (None: they can)."""
        return None

    def register(self) -> None:
        """Registers the kernels as FFI targets (once)."""

    def analyze(self, pattern, assume=None, dtype=None):
        """The backend's analysis of `pattern` for a matrix of `dtype` with the
        structure `assume` (hashable; kept per process)."""
        raise NotImplementedError

    def kind(self, dtype) -> str:
        return _suffix(dtype)

    def work_dtype(self, dtype):
        """The dtype the kernels compute in."""
        return _work_dtype(dtype)

    def _factor_call(self, state, kind, ax):
        raise NotImplementedError

    def _solve_call(self, state, kind, transpose, h, ax, b):
        raise NotImplementedError

    def _factor_solve_call(self, state, kind, transpose, ax, b):
        raise NotImplementedError

    def _free_call(self, h):
        raise NotImplementedError

    # (the custom_vmap functions, made once per analysis, kind and direction)

    @functools.cached_property
    def _fns(self) -> dict:
        return {}

    def _factor_fn(self, state, kind: str):
        key = ("factor", state, kind, _batch_split.policy())
        f = self._fns.get(key)
        if f is not None:
            return f

        @custom_vmap
        def f(ax):  # ax: (L, nnz) -> handles (L,)
            return self._factor_call(state, kind, ax)

        @f.def_vmap
        def _rule(axis_size, in_batched, ax):
            (axf,) = _batch_split.fold(axis_size, in_batched, [ax])
            return f(axf).reshape(axis_size, -1), True

        return self._fns.setdefault(key, f)

    def _solve_fn(self, state, kind: str, transpose: bool, numeric: bool):
        key = ("solve", state, kind, transpose, numeric, _batch_split.policy())
        f = self._fns.get(key)
        if f is not None:
            return f

        def with_numeric(h, ax, b):
            return self._solve_call(state, kind, transpose, h, ax, b)

        def with_symbol(h, ax, b):
            return self._factor_solve_call(state, kind, transpose, ax, b)

        @custom_vmap
        def f(h, ax, b):  # h: (L,), ax: (L, nnz), b: (L, n, k) -> x like b
            if numeric:  # (known at trace time: no conditional to compile)
                return with_numeric(h, ax, b)
            # (all handles made here, or none: a 0 handle is never read)
            return jax.lax.cond(jnp.all(h != 0), with_numeric, with_symbol, h, ax, b)

        @f.def_vmap
        def _rule(axis_size, in_batched, h, ax, b):
            hf, axf, bf = _batch_split.fold(axis_size, in_batched, [h, ax, b])
            return f(hf, axf, bf).reshape((axis_size, -1) + b.shape[-2:]), True

        return self._fns.setdefault(key, f)

    def _free_fn(self):
        f = self._fns.get("free")
        if f is not None:
            return f

        @custom_vmap
        def f(h):  # h: (L,) -> an int32 token
            # (zero whatever the kernel writes, which may be nothing, but
            # not foldable: XLA keeps a float product with 0, as it is NaN
            # for an infinite factor, so a value that adds it waits for the
            # free)
            r = jnp.sum(self._free_call(h)).astype(jnp.float32)
            return (r * 0.0).astype(jnp.int32)

        @f.def_vmap
        def _rule(axis_size, in_batched, h):
            (hf,) = _batch_split.fold(axis_size, in_batched, [h])
            return f(hf), False

        return self._fns.setdefault("free", f)

    # --- one matrix: what the record calls (jax.vmap batches them) ---

    def factor(self, pattern, a, assume=None):
        """The numeric factorization of the matrix with values `a` (`(nnz,)`)
        on `pattern`: a `uint64` handle (a scalar), to be freed with `free`.
        `assume` ("symmetric", "spd" or None): the structure a backend may
        factor for (KLU ignores it). A factorization that failed is a 0
        handle where `failed` says so, else the call fails."""
        if pattern.shape[0] == 0:  # (no unknowns: nothing to factor)
            return jnp.zeros((), jnp.uint64)
        self.register()
        ax = a.astype(self.work_dtype(a.dtype))
        state = self.analyze(pattern, assume, ax.dtype)
        return self._factor_fn(state, self.kind(ax.dtype))(ax[None])[0]

    def failed(self, pattern, handle):
        """Whether the factorization that made `handle` failed (a boolean
        array of its shape), or None where a failure fails the call instead."""
        return None

    def solve(self, pattern, handle, a, b, transpose: bool, numeric: bool = False,
              assume=None):
        """`A x = b` (`A^T x = b` if `transpose`, never conjugated) for the
        matrix with values `a` on `pattern`, `b` of shape `(n,)` or `(n, k)`:
        with the numeric factor `handle`, or, where it is 0, factoring in the
        same call (for `assume`, as `factor`; `numeric`: the caller knows
        `handle` is not 0)."""
        if pattern.shape[0] == 0:
            return b
        if transpose and self.transpose == "refactor":  # (A^T, factored in the call)
            at = take(a, pattern_transpose(pattern))
            return self.solve(pattern.transposed()[0], jnp.zeros((), jnp.uint64), at, b, False)
        self.register()
        work = self.work_dtype(np.result_type(a.dtype, b.dtype))
        ax = a.astype(work)
        bb = b.astype(work)
        vec = bb.ndim == 1
        bb = bb[:, None] if vec else bb
        if bb.shape[1] == 0:  # (no right-hand sides: no kernel call)
            return b
        state = self.analyze(pattern, assume, work)
        x = self._solve_fn(state, self.kind(work), bool(transpose), bool(numeric))(
            jnp.asarray(handle, jnp.uint64)[None], ax[None], bb[None])[0]
        x = x[:, 0] if vec else x
        return x.astype(b.dtype)

    def free(self, handle, after=()):
        """Frees the numeric factor `handle` once every array in `after` is
        computed; returns an int32 zero token (the call is side-effecting, so
        it runs even where the token is unused; a value that adds the token
        is computed after the free).

        The order is a data dependency XLA cannot fold away: the handle is
        read back from `[handle, handle]` at an index computed from the first
        entry of every array in `after` (XLA dropped an
        `optimization_barrier` whose other results were unused, and freed
        the factor before its solve ran)."""
        # (registered first: a free traced before any factor, as a kept
        # factor's swap traces it, must already go through the handle
        # table, which is set up with the targets)
        self.register()
        h = jnp.asarray(handle, jnp.uint64)
        firsts = [jnp.real(x.ravel()[0]).astype(jnp.float64)
                  for x in jax.tree_util.tree_leaves(after)
                  if isinstance(x, (jax.Array, jax.core.Tracer, np.ndarray)) and x.size]
        if firsts:
            h = _after(h, functools.reduce(jnp.add, firsts))
        return self._free_fn()(h.reshape(-1))  # (a batch's handles: a map's, handed out)


@custom_vmap
def _after(h, s):
    """`h`, read once `s` is computed: a data dependency XLA cannot fold away
    (an `optimization_barrier` whose other results are unused, it dropped)."""
    return jnp.stack([h, h])[jnp.any(s != s).astype(jnp.int32)]


@_after.def_vmap
def _after_rule(axis_size, in_batched, h, s):
    # (batched only where `h` is: under `jax.vmap` of a program that factors
    # outside the batch, as `jax.jacfwd`'s, whose solves are batched, the one
    # factor is freed once, not once per example)
    return _after(h, s), in_batched[0]


class KLUKernels(HandleKernels):
    """KLU's kernels (klujax's `klujax_cpp`), on the CPU."""

    def unavailable(self) -> str | None:
        if not available():
            return "klujax's compiled extension is not installed (`pip install klujax`)"
        return None

    def register(self) -> None:
        _register()

    def analyze(self, pattern, assume=None, dtype=None):
        return pattern  # (`symbolic(pattern)`: made and kept per pattern)

    def failed(self, pattern, handle):
        # (through the handle table, a failed factorization's handle is 0)
        if pattern.shape[0] == 0 or not _batch_split.handles_available():
            return None
        return handle == 0

    def _factor_call(self, pattern, kind, ax):
        raw, rows, cols = symbolic(pattern)
        return _batch_split.split_call(
            f"sciad_klu_factor_{kind}", (rows, cols, ax, np.uint64(raw)),
            jax.ShapeDtypeStruct(ax.shape[:1], jnp.uint64), batched=(2,),
            threads=_batch_split.threads_for(ax.shape[0], FACTOR_NS_PER_ENTRY * pattern.nnz),
            has_side_effect=True,  # (never merged with another: one free each)
            handles=(-1, _batch_split.MAKE))

    def _solve_call(self, pattern, kind, transpose, h, ax, b):
        raw, _, _ = symbolic(pattern)
        return _batch_split.split_call(
            f"sciad_klu_{'t' if transpose else ''}solve_with_numeric_{kind}",
            (np.uint64(raw), h, b), jax.ShapeDtypeStruct(b.shape, b.dtype), batched=(1, 2),
            threads=_batch_split.threads_for(b.shape[0],
                                             SOLVE_NS_PER_ENTRY * pattern.nnz * b.shape[-1]),
            handles=(1, _batch_split.READ))

    def _factor_solve_call(self, pattern, kind, transpose, ax, b):
        raw, rows, cols = symbolic(pattern)
        return _batch_split.split_call(
            f"sciad_klu_{'t' if transpose else ''}solve_with_symbol_{kind}",
            (rows, cols, ax, b, np.uint64(raw)), jax.ShapeDtypeStruct(b.shape, b.dtype),
            batched=(2, 3),
            threads=_batch_split.threads_for(ax.shape[0], FACTOR_NS_PER_ENTRY * pattern.nnz),
            handles=(-1, _batch_split.SOFT))  # (a singular matrix: NaN, judged by the checks)

    @property
    def release_now(self):
        """The host release of a failed check (`_release_from_host`), where
        handles go through the handle table; else None (a raw pointer
        cannot tell a second release from a first)."""
        self.register()
        return self._release_from_host if _batch_split.handles_available() else None

    def _release_from_host(self, handles) -> None:
        """Frees the numeric factors `handles` (a NumPy array of any shape)
        from the host: a failed check's, whose raise stops the program before
        its own frees run. A handle that is 0, or already released (by the
        program, or by another check of it that failed at the same time), is
        skipped by the handle table."""
        import klujax_cpp

        raws = [r for r in _batch_split.take_handles(handles).tolist() if r]
        if raws:
            klujax_cpp.KLUNumeric(raws).close()

    _release_from_host.idempotent = True  # (see `sciad.graph.Holding`)

    def _free_call(self, h):
        return _batch_split.split_call(
            "sciad_klu_free_numeric", (h,), jax.ShapeDtypeStruct(h.shape, jnp.int32),
            batched=(0,), threads=1, has_side_effect=True, handles=(0, _batch_split.TAKE))


#: KLU's kernels, as the "klu" record calls them
KERNELS = KLUKernels()
factor = KERNELS.factor
solve = KERNELS.solve
free = KERNELS.free


def _dot_fn(pattern, kind: str, transpose: bool, policy):
    """The product kernel's call for `pattern`, kept in the analysis cache."""
    return _cache.cached(pattern, "klu products", (kind, transpose, policy),
                         lambda: _make_dot_fn(pattern, kind, transpose, policy), nbytes=0)


def _make_dot_fn(pattern, kind: str, transpose: bool, policy):
    _, rows, cols = symbolic(pattern)
    if transpose:
        rows, cols = cols, rows

    @custom_vmap
    def f(ax, x):  # ax: (L, nnz), x: (L, n, k) -> op(A) x like x
        return _batch_split.split_call(
            f"sciad_klu_dot_{kind}", (rows, cols, ax, x), jax.ShapeDtypeStruct(x.shape, x.dtype),
            batched=(2, 3),
            threads=_batch_split.threads_for(x.shape[0], DOT_NS_PER_ENTRY * pattern.nnz
                                             * x.shape[-1]))

    @f.def_vmap
    def _rule(axis_size, in_batched, ax, x):
        axf, xf = _batch_split.fold(axis_size, in_batched, [ax, x])
        return f(axf, xf).reshape((axis_size, -1) + x.shape[-2:]), True

    return f


def dot(pattern, a, x, transpose: bool = False):
    """`A x` (`A^T x` if `transpose`) for the matrix with values `a` on
    `pattern` (square), `x` of shape `(n,)` or `(n, k)`: one compiled
    kernel call (klujax's), no gather or scatter for XLA to compile."""
    if pattern.shape[0] == 0:
        return jnp.zeros(x.shape, np.result_type(a.dtype, x.dtype))
    _register()
    out = np.result_type(a.dtype, x.dtype)
    work = _work_dtype(out)
    xx = x.astype(work)
    vec = xx.ndim == 1
    xx = xx[:, None] if vec else xx
    f = _dot_fn(pattern, _suffix(work), bool(transpose), _batch_split.policy())
    y = f(a.astype(work)[None], xx[None])[0]
    return (y[:, 0] if vec else y).astype(out)
