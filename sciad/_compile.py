"""Calls that trace a user's function into one node, compiled once per
function and options: shared by the public modules that take a function and
its `args` (`sciad.optimize`'s roots, `sciad.ode`'s integrations).

- `_split_args`: `args`' leaves split into values (the node's operands) and
  static objects (a problem description, a callable), and how to put them
  back together;
- `compiled_call`: `inline(fun, *leading, args)` outside a trace, as an
  `sd.function` made once per `fun`, options and static objects (`cached`),
  its arrays moved to the device once (`to_device`).

Below the public API: it imports the graph and `sd.function`, never
`optimize` or `ode`.
"""

from __future__ import annotations

import weakref
from typing import Callable

import jax
import numpy as np

from . import config
from ._function import function
from .graph import SparseArray, Tracer
from .graph._trace import is_value_leaf

_tree = jax.tree_util

#: per function (weakly held): its compiled calls, by key
_CACHE: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


def cached(f: Callable, key, build: Callable):
    """`build(fref)` for `f` and `key`, made once and kept in `_CACHE` while
    `f` lives (`fref()` gives `f`: the cache must not keep it alive); made
    every time for an `f` that is not weakly referenceable or hashable."""
    try:
        table = _CACHE.setdefault(f, {})
        fref = weakref.ref(f)
    except TypeError:
        return build(lambda: f)
    entry = table.get(key)
    if entry is None:
        entry = table[key] = build(fref)
    return entry


def to_device(args: tuple) -> tuple:
    """NumPy arrays in `args` moved to the device once, not at every call."""
    with config.x64_scope():
        return _tree.tree_map(
            lambda a: jax.device_put(a) if isinstance(a, np.ndarray) else a, args,
            is_leaf=is_value_leaf)


def _is_array(x) -> bool:
    """A leaf of `args` that is a value (an operand of the node), not a static
    object the residual reads (a problem description, a callable)."""
    return isinstance(x, (np.ndarray, np.generic, jax.Array, Tracer, SparseArray, int, float,
                          complex, bool))


def _split_args(args):
    """`args`' leaves: the values (operands) and the static objects, and how
    to put them back together."""
    leaves, treedef = _tree.tree_flatten(args, is_leaf=is_value_leaf)
    dynamic = [i for i, a in enumerate(leaves) if _is_array(a)]
    static = {i: a for i, a in enumerate(leaves) if not _is_array(a)}

    def rebuild(values):
        full = dict(static)
        full.update(zip(dynamic, values))
        return _tree.tree_unflatten(treedef, [full[i] for i in range(len(leaves))])

    return [leaves[i] for i in dynamic], static, rebuild


def compiled_call(inline: Callable, fun: Callable, leading: tuple, args, *, key, name: str):
    """`inline(fun, *leading, args)` (a call that traces `fun` into a node)
    outside a trace: compiled once per `fun`, `key` (the options) and the
    static objects in `args` (by identity, held by the cache entry so that
    an id is not reused meanwhile), then called on `leading` and `args`'
    values."""
    values, static, rebuild = _split_args(args)

    def build(fref):
        def solve(*a):
            return inline(fref(), *a[:len(leading)], rebuild(list(a[len(leading):])))

        solve.__name__ = f"{name}_{getattr(fun, '__name__', 'fun')}"
        return function(solve), static

    fn, _ = cached(fun, (key, tuple((i, id(a)) for i, a in static.items())), build)
    return fn(*leading, *to_device(tuple(values)))
