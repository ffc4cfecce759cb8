"""`sd.function(f)`: trace once per input signature, compile with XLA, cache.

The wrapper is a `functools.partial` of a small function calling a `jax.jit`
function whose body traces `f` into a sciad graph, verifies it and lowers it.
JAX's own C++ dispatch therefore does the per-signature caching (shapes,
dtypes, static arguments), and a steady-state call costs what a `jax.jit`
call costs plus one Python frame. That frame turns errors found by run-time
checks (a singular matrix, a solver that did not converge), which leave XLA
as text, back into sciad's exceptions.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.extend.core
import jax.interpreters.ad
import jax.interpreters.batching
import jax.interpreters.mlir
import numpy as np
from jax.sharding import AxisType, PartitionSpec

from . import config
from ._traceback import api_boundary
from .errors import NotSupportedError, reraise as _reraise

JaxRuntimeError = jax.errors.JaxRuntimeError
from .graph import Graph, lower, trace_flat, verify
from .graph._trace import runtime_leaves, wrap_outputs
from .graph.passes import optimize, place_releases
from .solvers import _host

_X64 = jax.enable_x64  # JAX's x64 state object (global value + thread-local override)


def _has_runtime_checks(graph: Graph) -> bool:
    """Whether a node (or a subgraph's) is of a primitive whose lowering
    raises from run-time checks (`primitive.runtime_checks`)."""
    return any(n.primitive.runtime_checks
               or any(_has_runtime_checks(g) for g in n.subgraphs) for n in graph.nodes)


# ---------------------------------------------------------------------------
# the program as one effect-free call
#
# JAX dispatches a compiled program from C++ (about 8 us a call) only where
# its jaxpr has no effects; otherwise every call takes JAX's Python path
# (measured: 230 us against 27 us for the value of one KLU solve of 50
# unknowns). sciad's programs carry two kinds of unordered effects that ask
# nothing of dispatch: its run-time checks (`_host.CheckEffect`: kept by
# JAX's dead-code elimination) and side-effecting kernel calls (KLU's factor
# and free: never merged or dropped). Both exist for the transformations JAX
# applies inside a jaxpr, and are lowered as side-effecting HLO, which XLA
# keeps whatever JAX believes. JAX never transforms inside a lowered sciad
# program (sciad differentiates its graphs itself; `sd.to_jax` gives JAX a
# custom JVP and a linear primitive around them), so `sd.function`'s and
# `sd.to_jax`'s programs are bound as one `sciad_program` call that declares
# no effects (its lowering lowers the jaxpr, effects and all): dispatch then
# takes JAX's fast path, and JAX drops the call only where none of its
# results is read. A program with any other effect (an ordered one, one of
# the user's) is not wrapped. Under `jax.vmap` the batched program is one
# call again; under `jax.jvp` (of an `sd.function`) it is inlined.

try:  # JAX's effect of side-effecting FFI calls (no public name)
    from jax._src.ffi import FfiEffect as _FfiEffect
except ImportError:  # pragma: no cover - depends on the JAX version
    _FfiEffect = None

_ERASABLE = tuple(k for k in (getattr(_host, "CheckEffect", None), _FfiEffect)
                  if k is not None)

program_p = jax.extend.core.Primitive("sciad_program")
program_p.multiple_results = True


def _program_fun(*args, jaxpr):
    return jax.extend.core.jaxpr_as_fun(jaxpr)(*args)


def _zero_tangent(p):
    if jax.numpy.issubdtype(p.dtype, jax.numpy.inexact):
        return jax.numpy.zeros_like(p)
    return np.zeros(p.shape, jax.dtypes.float0)  # (JAX's tangent of an integer)


def _program_jvp(primals, tangents, *, jaxpr):
    tangents = tuple(_zero_tangent(p) if type(t) is jax.interpreters.ad.Zero else t
                     for p, t in zip(primals, tangents))
    return jax.jvp(functools.partial(_program_fun, jaxpr=jaxpr), tuple(primals), tangents)


def _program_batch(args, dims, *, jaxpr):
    # (an unbatched operand's axis is None: JAX's `not_mapped`; the batched
    # program is one call again)
    batched = jax.vmap(functools.partial(_program_fun, jaxpr=jaxpr), in_axes=list(dims))
    outs = _as_program(batched, args)
    return outs, [0] * len(outs)


program_p.def_impl(_program_fun)
program_p.def_abstract_eval(lambda *avals, jaxpr: jaxpr.out_avals)
jax.interpreters.mlir.register_lowering(
    program_p, jax.interpreters.mlir.lower_fun(_program_fun, multiple_results=True),
    cacheable=False)
jax.interpreters.ad.primitive_jvps[program_p] = _program_jvp
jax.interpreters.batching.primitive_batchers[program_p] = _program_batch


def _as_program(run: Callable, leaves):
    """`run(*leaves)` inside `jax.jit`'s trace: as one `sciad_program` call
    where all of its effects are sciad's own (see above), else as it is."""
    closed, shapes = jax.make_jaxpr(run, return_shape=True)(*leaves)
    if closed.effects and all(isinstance(e, _ERASABLE) for e in closed.effects):
        outs = program_p.bind(*leaves, jaxpr=closed)
    else:
        outs = jax.extend.core.jaxpr_as_fun(closed)(*leaves)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), outs)


def _unset(*args, **kwargs):  # a Function's target until its dispatch is made
    raise AssertionError("sd.function: called before it was set up")


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


def _leaf_meshes(leaves) -> set:
    """The meshes that the values `leaves` (traced) are laid over."""
    found = [getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
             for x in jax.tree_util.tree_leaves(leaves) if hasattr(x, "shape")]
    return {m for m in found if m is not None and not m.empty}


def partitioned(leaves, mesh=None) -> bool:
    """Whether XLA partitions the program being traced over several devices:
    `jax.set_mesh` set a mesh of more than one, or its inputs (`leaves`, or
    the `mesh` found from them) lie on one. A compiled factor's release, a
    call with a side effect, has no place there (`place_releases(graph,
    hold=False)`)."""
    m = jax.sharding.get_abstract_mesh()
    if not m.empty:
        return m.size > 1
    meshes = _leaf_meshes(leaves) | ({mesh} if mesh is not None else set())
    return any(m.size > 1 for m in meshes)


class _Dispatch:
    """Where one `Function`'s calls go, and the state that decides it.

    - `by_checks`: one `jax.jit` object per `sciad.config.enable_checks`
      setting (the setting is part of the cache key), made on first use;
      `current` is the one of the current setting.
    - `global_x64`: whether JAX's x64 mode was on globally when the function
      was made. If not, calls enter JAX's scoped x64 state (`scoped`).
    - `sync`: set once a traced graph holds run-time checks (a solve that may
      find its matrix singular). Calls then wait for their results, so that a
      failed check raises from the call itself, as a sciad error, rather than
      later from whatever reads the result (JAX dispatches asynchronously; on
      a GPU the program is still running on return).
    - `entry`: the wrapper calls go through (`call` or `scoped`, bound once).
    """

    def __init__(self, owner: "Function", fn: Callable, jit_kwargs: dict):
        self.owner = owner
        self.name = getattr(fn, "__name__", "function")
        self.jit_kwargs = jit_kwargs
        self.global_x64 = bool(_X64.value)  # (inside a trace, the scoped value is on)
        self.sync = False
        self.by_checks: dict[bool, Callable] = {}
        self.current = self.jitted_for(config.enable_checks)
        self.entry = self.call if self.global_x64 else self.scoped

    def jitted_for(self, checks: bool) -> Callable:
        j = self.by_checks.get(checks)
        if j is None:
            owner = self.owner

            def body(*args, **kwargs):
                return owner._traced_body(*args, **kwargs)

            body.__name__ = body.__qualname__ = self.name
            j = self.by_checks[checks] = jax.jit(body, **self.jit_kwargs)
        return j

    def set_sync(self) -> None:
        self.sync = True
        if self.global_x64 and self.owner.func is not self.entry:
            self.owner._use(self.entry)

    def traced_without_checks(self) -> None:
        # With global x64 and no checks so far, calls go straight into JAX's
        # C++ dispatch: no Python frame of sciad's per call. (The one call
        # that then traces a new signature with checks runs without the
        # wrapper: if its check fails, the error arrives as JAX's runtime
        # error carrying sciad's message, not as the sciad exception; later
        # calls get the wrapper.)
        if self.global_x64 and not self.sync and self.owner.func is not self.current:
            self.owner._use(self.current)

    def checks_changed(self) -> None:
        self.current = self.jitted_for(config.enable_checks)
        if self.owner.func in self.by_checks.values():
            self.owner._use(self.current)

    @api_boundary
    def call(self, *args, **kwargs):
        try:
            out = self.current(*args, **kwargs)
            if self.sync:  # run-time checks: their errors surface here
                jax.block_until_ready(out)
            return out
        except Exception as e:  # a run-time check's error arrives as
            _reraise(e)          # JaxRuntimeError or ValueError

    @api_boundary
    def scoped(self, *args, **kwargs):
        # Swapping the thread-local value directly costs ~0.3 us; the
        # `jax.enable_x64` context manager ~2 us.
        prev = _X64.swap_local(True)
        try:
            out = self.current(*args, **kwargs)
            if self.sync:
                jax.block_until_ready(out)
            return out
        except Exception as e:
            _reraise(e)
        finally:
            _X64.set_local(prev)


class Function(functools.partial):
    """A sciad function compiled per input signature. See `sciad.function`.

    It is a `functools.partial` of its own `jax.jit` object when JAX's x64
    mode is on globally and no traced graph holds run-time checks: a call
    then runs no Python frame of sciad's. Otherwise it is a partial of one
    small method around that `jax.jit` object (`_Dispatch.call` or
    `.scoped`), which enters JAX's scoped x64 state (unless x64 is on
    globally), waits for results of graphs with run-time checks and re-raises
    their failures as sciad errors. (Before the first trace, and once a graph
    with checks was traced, the wrapper is used.) `_dispatch` holds the state
    that decides which.

    `sciad.config.enable_checks` is part of the cache key: there is one
    `jax.jit` object per setting, and the function switches to the one of
    the current setting when it changes.
    """

    def __new__(cls, fn: Callable, *, static_argnums: int | Sequence[int] = (),
                static_argnames: str | Sequence[str] = (), in_shardings=None,
                out_shardings=None):
        static_argnums = _as_tuple(static_argnums)
        static_argnames = _as_tuple(static_argnames)
        shardings = {k: v for k, v in (("in_shardings", in_shardings),
                                       ("out_shardings", out_shardings)) if v is not None}
        self = super().__new__(cls, _unset)
        dispatch = _Dispatch(self, fn, dict(static_argnums=static_argnums,
                                            static_argnames=static_argnames, **shardings))
        self._use(dispatch.entry)
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self._shardings = (in_shardings, out_shardings)
        self.graphs: list[Graph] = []  # one per traced signature, in order
        self._dispatch = dispatch
        config.watch_checks(self)
        return self

    def _checks_changed(self) -> None:  # called by `config` (see watch_checks)
        self._dispatch.checks_changed()

    def _use(self, func: Callable) -> None:
        """Makes calls go to `func` (the partial's function)."""
        functools.partial.__setstate__(self, (func, (), {}, self.__dict__))

    def _split(self, args, kwargs):
        static = {i % len(args) for i in self.static_argnums} if args else set()
        dyn_kw = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        static_kw = {k: v for k, v in kwargs.items() if k in self.static_argnames}
        return static, dyn_kw, static_kw

    def trace(self, *args, **kwargs) -> Graph:
        """The verified graph of `f` for these arguments' signature."""
        static, dyn_kw, static_kw = self._split(args, kwargs)
        fn = functools.partial(self.fn, **static_kw) if static_kw else self.fn
        graph, _, _ = trace_flat(fn, args, dyn_kw, static_argnums=tuple(static),
                                 name=getattr(self.fn, "__name__", None))
        verify(graph)
        return graph

    def _traced_body(self, *args, **kwargs):
        # Runs under jax.jit's tracing, once per new signature.
        if not _X64.value:
            # Only reachable if JAX's global x64 mode was on when this function
            # was created and has been switched off since: the inputs were
            # already cast to 32 bits, so refuse rather than compute in float32.
            raise NotSupportedError(
                "JAX's x64 mode was on when this sd.function was created and is off "
                "now; create the sd.function again after changing "
                "`jax_enable_x64`.", op="sd.function")
        static, dyn_kw, static_kw = self._split(args, kwargs)
        fn = functools.partial(self.fn, **static_kw) if static_kw else self.fn
        graph, _, out_tree = trace_flat(fn, args, dyn_kw, static_argnums=tuple(static),
                                        name=getattr(self.fn, "__name__", None))
        verify(graph)
        self.graphs.append(graph)
        dyn = (tuple(a for i, a in enumerate(args) if i not in static), dyn_kw)
        # Derivative graphs repeat primal work (each rule recomputes what it
        # needs) and carry dead and trivial nodes: clean them up before XLA.
        lowered = optimize(graph)
        if _has_runtime_checks(lowered):
            self._dispatch.set_sync()
        else:
            self._dispatch.traced_without_checks()
        leaves = runtime_leaves(dyn)
        mesh = self._mesh(leaves)
        if partitioned(leaves, mesh):
            # (XLA partitions the program over the devices its inputs lie
            # on: a release, a call with a side effect, has no place there,
            # so the compiled solves factor in their own calls instead)
            lowered = place_releases(lowered, hold=False)
        run = lower(lowered)
        if mesh is not None and AxisType.Explicit in mesh.axis_types:
            # JAX's explicit sharding types every value with its layout and
            # asks each operation for one; sciad's programs run with the
            # compiler choosing layouts (automatic axes) and hand back whole
            # results, which `out_shardings` then lays out.
            run = jax.sharding.auto_axes(run, out_sharding=PartitionSpec())
        if mesh is None:
            outs = _as_program(run, leaves)
        else:
            with jax.sharding.use_abstract_mesh(mesh):
                outs = run(*leaves)
        return jax.tree_util.tree_unflatten(out_tree, wrap_outputs(outs, graph.out_types))

    def _mesh(self, leaves):
        """The device mesh that the arguments (or the given shardings) lay the
        computation over, if there is one and `jax.set_mesh` set none: batched
        nodes split over one of its axes (`sd.vmap(..., spmd_axis_name=...)`)
        find it while lowering, as they find `jax.set_mesh`'s."""
        if not jax.sharding.get_abstract_mesh().empty:
            return None
        found = [getattr(getattr(s, "mesh", None), "abstract_mesh", None)
                 for s in jax.tree_util.tree_leaves(self._shardings)]
        meshes = {m for m in found if m is not None and not m.empty} | _leaf_meshes(leaves)
        return meshes.pop() if len(meshes) == 1 else None

    def lower(self, *args, **kwargs):
        """JAX's `Lowered` for these arguments (`.as_text()` shows StableHLO)."""
        with config.x64_scope():
            return self._dispatch.current.lower(*args, **kwargs)

    @property
    def trace_count(self) -> int:
        """How many signatures have been traced and compiled so far."""
        return len(self.graphs)

    def __repr__(self) -> str:
        return f"<sciad.function {getattr(self.fn, '__qualname__', self.fn)!r}>"


def function(fn: Callable | None = None, *, static_argnums: int | Sequence[int] = (),
             static_argnames: str | Sequence[str] = (), in_shardings=None,
             out_shardings=None):
    """Compiles `fn` through sciad's graph and XLA, caching per signature.

    **Arguments:**

    - `fn`: a function of arrays (pytrees in and out) written with
      `sciad.numpy` and primitives.
    - `static_argnums` / `static_argnames`: arguments passed as Python values
      (hashable); each distinct value is its own signature.
    - `in_shardings` / `out_shardings`: how the arguments and results are laid
      out over devices, passed to `jax.jit` as they are (a
      `jax.sharding.NamedSharding` per argument, a pytree prefix, or one for
      all). With `sd.vmap(..., spmd_axis_name=...)` inside, each device then
      computes its own examples of the batch.

    **Returns:**

    A callable taking NumPy or JAX arrays and returning JAX arrays with
    NumPy's dtypes (float64 stays float64). `.trace(*args)` returns the graph,
    `.graphs` the graphs traced so far. Usable as a decorator, with or
    without arguments.

    **Example:**

    ```python
    import numpy as np, sciad as sd, sciad.numpy as snp

    f = sd.function(lambda x: snp.sum(snp.sin(x) ** 2))
    float(f(np.array([0.0, 1.0])))            # 0.7080734182735712 (traced and compiled once)
    float(f(np.array([1.0, 2.0])))            # 1.5348952287053772 (the same program)
    f.trace_count                             # 1
    ```
    """
    kw = dict(static_argnums=static_argnums, static_argnames=static_argnames,
              in_shardings=in_shardings, out_shardings=out_shardings)
    if fn is None:
        return lambda f: Function(f, **kw)
    return Function(fn, **kw)
