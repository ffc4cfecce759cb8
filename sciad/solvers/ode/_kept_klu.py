"""KLU factors of a stiff integrator's iteration matrix kept over steps, in
the program: BDF's and Radau's sparse Newton systems on the CPU without a
host call.

A BDF or Radau loop factors its iteration matrix (`M - c J`, or Radau's
two) once and solves with it in every Newton iteration of many steps,
factoring again only where the step size or the Jacobian moved. With
SuperLU on the host (`sciad.solvers.ode._ode`) each of those solves is a
Python call from the compiled loop: measured on the 1,024-state
Brusselator, the host calls were about two thirds of BDF's forward time.
Here the factor is a KLU numeric object (`sciad.solvers.direct._klu_ffi`)
whose handle the loop carries; each solve is one compiled call.

The handle's lifetime is the loop's, and must be right under every
transform that runs the loop:

- `swap(need, handle, values)` replaces the kept factor where `need`: it
  frees the old one and factors `values`, else it returns `handle`. In one
  integration that is a `lax.cond`: the free runs before the new factor's
  first solve, and after every solve with the old one (those are earlier
  iterations of the loop, which XLA runs one after another).
- Under `jax.vmap` (a batch of integrations: `sd.vmap`'s map node, or a
  user's `jax.vmap` of `sd.to_jax`), JAX would turn that `cond` into a
  `select` that runs both branches for every example: examples that keep
  their factor would have it freed. Its batching rule is branch-free
  instead: every example factors its values (one batched call), keeps the
  new factor where `need`, and the call then frees, per example, whichever
  of the old and new factors it does not keep. A batched `while_loop` also
  runs its body for examples already done and discards their results: the
  callers fold each enclosing loop's condition into `need`, so such an
  example never swaps.
- `release(handle, after)`: frees the last factor once `after` (the loop's
  results) is computed, and returns an int32 zero that cannot be folded
  away; the caller adds it to the status its result is judged by, so a
  failed integration's check runs after the free: nothing is left behind
  by a failed call.

A handle of 0 is "no factor" (the start, and a singular matrix, whose KLU
factorization fails): a solve with it factors and solves in one call,
which gives NaN for a singular matrix, as SuperLU's path does; Newton then
fails and the step is retried shorter. Freeing 0 frees nothing. This needs
the handle table of sciad's C++ extension (a failed factorization is a 0
handle there, and a stale handle is refused rather than read): without it,
or off the CPU, the integrators keep SuperLU on the host (`usable`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from .. import _batch_split
from ..direct import _klu_ffi


def usable(dtype) -> bool:
    """Whether the loops can keep KLU factors here: KLU's kernels run here
    (`jac="klu"`'s test: klujax on the CPU), through the handle table, for
    real values (KLU's work dtype is float64; float32 values are solved in it
    and cast back)."""
    from ..nonlinear._jacobian_klu import usable as klu_runs

    return np.dtype(dtype).kind == "f" and klu_runs() and _batch_split.handles_available()


def none():
    """The handle of no factor."""
    return jnp.zeros((), jnp.uint64)


@functools.lru_cache(maxsize=64)
def _swapper(pattern):
    kernels = _klu_ffi.KERNELS

    @custom_vmap
    def swap(need, handle, values):
        def renew():
            token = kernels.free(handle)  # (the old factor's solves are all done)
            return kernels.factor(pattern, values) + token.astype(jnp.uint64)

        return jax.lax.cond(need, renew, lambda: handle)

    @swap.def_vmap
    def _rule(axis_size, in_batched, need, handle, values):
        need, handle, values = (x if b else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x))
                                for x, b in zip((need, handle, values), in_batched))
        made = jax.vmap(lambda v: kernels.factor(pattern, v))(values)
        kept = jnp.where(need, made, handle)
        token = kernels.free(jnp.where(need, handle, made))
        return kept + token.astype(jnp.uint64), True

    return swap


def swap(pattern, need, handle, values):
    """The handle of a KLU factor of the matrix with `values` on `pattern`
    where `need`, the old one freed; `handle` itself elsewhere (see the
    module docstring)."""
    return _swapper(pattern)(need, handle, values)


def solve(pattern, handle, values, b, transpose: bool = False):
    """`A x = b` (`A^T x = b` if `transpose`) with the kept factor `handle`
    of `A` (values `values`); a 0 handle factors and solves in one call (NaN
    where `A` is singular)."""
    return _klu_ffi.KERNELS.solve(pattern, handle, values, b, transpose)


def release(handle, after):
    """Frees the kept factor `handle` once every array in `after` is
    computed; returns an int32 zero that depends on the free (see the
    module docstring)."""
    return _klu_ffi.KERNELS.free(handle, after=after)
