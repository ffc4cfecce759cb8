"""The host level of a memory budget: a checkpointed scan's carries in an
accelerator's pinned host memory.

A `TwoLevel` schedule with `host=True` (`_schedules`) keeps the carry at
the start of each segment of the loop in host memory and takes them back,
last first, for the segments' backward passes (`replay_in_host_memory`).
The carries are the stacked outputs of a `lax.scan` whose step puts its
carry in JAX's `pinned_host` memory space (`jax.device_put` with
`jax.memory.Space.Host`); the backward loop takes slice `j` and puts it
back in device memory. XLA's host offloading turns these into copies
between the two memories, with the stacked array allocated in host memory:
the pattern of JAX's own offloaded remat residuals. On the CPU both spaces
are the process's memory and the puts are no-ops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._schedules import checkpoint_runs


def _to_device(kept, j, axis: int):
    """Slice `j` of `kept` (in host memory) along `axis`, put in device memory."""
    return jax.device_put(jax.lax.dynamic_index_in_dim(kept, j, axis, keepdims=False),
                          jax.memory.Space.Device)


@jax.custom_batching.custom_vmap
def _row(kept, j):
    """Row `j` of `kept` (in host memory), put in device memory."""
    return _to_device(kept, j, 0)


@_row.def_vmap
def _row_vmap(axis_size, in_batched, kept, j):
    # (JAX batches a dynamic slice of a batched array as a gather, which
    # refuses an operand in host memory beside its device indices: the
    # row is sliced along the second axis instead, or, where each example
    # has its own row, example by example)
    kept_b, j_b = in_batched
    if not kept_b:
        kept = jnp.broadcast_to(kept, (axis_size,) + kept.shape)
    if not j_b:
        return _to_device(kept, j, 1), True
    return jax.lax.map(lambda a: _row(*a), (kept, j)), True


def replay_in_host_memory(schedule, length: int, index, advance, backward_of, start, acc0,
                          ct_xs):
    """The backward pass of a scan of `length >= 1` steps on a `TwoLevel`
    schedule with `host=True`: a forward sweep keeping the carry at each
    segment's start but the last's in host memory (row `j` for segment
    `j`), the last segment's backward pass from the sweep's carry, then
    each segment's, last first, from its carry brought back. Arguments as
    `_disk.replay_on_disk`'s. Returns `(acc, ct_xs)`."""
    L = schedule.segment
    m, last = schedule.segments(length)
    inner = schedule.inner()
    host = jax.memory.Space.Host

    def offset(lo):
        return lambda t: index(lo + t)

    def sweep(carry, j):
        kept = tuple(jax.device_put(c, host) for c in carry)
        carry = jax.lax.fori_loop(j * L, (j + 1) * L, lambda t, c: advance(index(t), c), carry)
        return carry, kept

    carry, kept = jax.lax.scan(sweep, tuple(start), jnp.arange(m - 1, dtype=jnp.int32))
    acc, ct_xs = backward_of(checkpoint_runs(inner, last), offset((m - 1) * L), carry,
                             acc0, ct_xs)
    runs = checkpoint_runs(inner, L)

    def back(i, state):
        acc, ct_xs = state
        j = m - 2 - i
        carry = tuple(_row(k, j) for k in kept)
        return backward_of(runs, offset(j * L), carry, acc, ct_xs)

    return jax.lax.fori_loop(0, m - 1, back, (tuple(acc), ct_xs))
