"""`primitive_from_jax(fn, name)`: existing JAX code as one sciad node.

The node's shape rule is `jax.eval_shape` of `fn`, its implementation `fn`
itself, and its derivatives come from JAX's own AD of `fn`: the JVP rule
emits a companion node `<name>.jvp` (computing `jax.jvp(fn)`), the VJP rule a
companion node `<name>.vjp` (computing `jax.vjp(fn)`). Its batch rule is
JAX's batching of `fn` the same way: one companion node `<name>.vmap`
(computing `jax.vmap(fn)`, the batch axis first). The companions are made
the same way, on first use, so derivatives of any order, of batched nodes
and batches of derivatives work.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from ..errors import RegistrationError
from ..graph import Primitive, TensorType, Zero, instantiate, is_differentiable, lookup_primitive
from ..graph._autodiff import type_of
from ..graph._batch import to_front
from ..graph._source import user_source


def _types_of(tree) -> tuple:
    return tuple(TensorType(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(tree))


def _split(args, diff):
    """Positions `diff` of `args` are differentiated; returns a function
    rebuilding the full argument list from those."""
    def merge(d):
        full = list(args)
        for i, v in zip(diff, d):
            full[i] = v
        return full
    return merge


def primitive_from_jax(fn: Callable, name: str, *, multiple_results: bool = False
                       ) -> Primitive:
    """Wraps a JAX function of arrays as a sciad primitive.

    **Arguments:**

    - `fn`: a function of JAX arrays (positional arguments only) returning an
      array, or a tuple of arrays with `multiple_results=True`. It must be
      traceable by `jax.jit` and differentiable by JAX.
    - `name`: the primitive's registered name (the printed op).

    **Returns:**

    The `Primitive`; `p(*args)` adds one node. Its JVP and VJP are JAX's AD of
    `fn`, emitted as the companion nodes `<name>.jvp` and `<name>.vjp`; under
    `sd.vmap` it is one `<name>.vmap` node, `jax.vmap(fn)`.

    ```python
    p = sd.primitive_from_jax(lambda x: jnp.cumsum(jnp.sin(x)), "cumsin")
    sd.vmap(p)(np.ones((100, 3)))  # one node: cumsin.vmap, jax.vmap of the function
    ```
    """
    if not callable(fn):
        raise RegistrationError(f"`fn` must be a JAX function, got {fn!r}.",
                                op="primitive_from_jax")
    # `fn` takes arrays only: the primitive and its companions declare no params
    p = Primitive(name, multiple_results=multiple_results, params={},
                  _source=user_source())
    p.jax_fn = fn

    @p.def_abstract_eval
    def _shape(*in_types):
        with jax.enable_x64(True):
            out = jax.eval_shape(fn, *[jax.ShapeDtypeStruct(t.shape, t.dtype)
                                       for t in in_types])
        types = _types_of(out)
        if multiple_results:
            return types
        if not isinstance(out, jax.ShapeDtypeStruct):
            raise RegistrationError(
                f"`fn` returned {jax.tree_util.tree_structure(out)}, not one array; pass "
                "`multiple_results=True` for a tuple of arrays.", op=name)
        return types[0]

    p.def_impl(fn)

    @p.def_jvp
    def _jvp(primals, tangents):
        diff = [i for i, x in enumerate(primals) if is_differentiable(type_of(x))]
        comp = _companion(p, "jvp", len(primals), tuple(diff))
        res = comp.bind(*primals, *[instantiate(tangents[i]) for i in diff])
        n = len(res) // 2
        outs, touts = tuple(res[:n]), tuple(res[n:])
        touts = tuple(t if is_differentiable(type_of(o)) else Zero(type_of(o).update())
                      for o, t in zip(outs, touts))
        return (outs, touts) if multiple_results else (outs[0], touts[0])

    @p.def_vjp
    def _vjp(primals, outs, cts):
        outs = tuple(outs) if multiple_results else (outs,)
        cts = tuple(cts) if multiple_results else (cts,)
        diff = [i for i, x in enumerate(primals) if is_differentiable(type_of(x))]
        comp = _companion(p, "vjp", len(primals), tuple(diff))
        ct_vals = [instantiate(c) if is_differentiable(type_of(o)) else
                   np.zeros(type_of(o).shape, type_of(o).dtype)
                   for o, c in zip(outs, cts)]
        res = comp.bind(*primals, *ct_vals)
        res = tuple(res)
        out: list = [None] * len(primals)
        for i, r in zip(diff, res):
            out[i] = r
        return tuple(out)

    @p.def_batch
    def _batch(args, dims):
        batched = tuple(i for i, d in enumerate(dims) if d is not None)
        comp = _companion(p, "vmap", len(args), batched)
        res = comp.bind(*[a if d is None else to_front(a, d) for a, d in zip(args, dims)])
        res = tuple(res)
        return (res, (0,) * len(res)) if multiple_results else (res[0], 0)

    return p


def _companion(p: Primitive, kind: str, n_in: int, diff: tuple[int, ...]) -> Primitive:
    """The primitive computing JAX's JVP, VJP or batching of `p.jax_fn`, made
    once. `diff`: the positions differentiated, or batched (at axis 0)."""
    name = f"{p.name}.{kind}" + ("" if len(diff) == n_in else
                                 "[" + ",".join(map(str, diff)) + "]")
    found = lookup_primitive(name)
    if found is not None:
        return found
    fn = p.jax_fn
    multi = p.multiple_results

    def as_tuple(out):
        return tuple(out) if multi else (out,)

    if kind == "jvp":
        def comp_fn(*args):
            primals, tans = args[:n_in], args[n_in:]
            merge = _split(primals, diff)
            out, tout = jax.jvp(lambda *d: fn(*merge(d)), tuple(primals[i] for i in diff),
                                tuple(tans))
            return as_tuple(out) + as_tuple(tout)
    elif kind == "vmap":
        def comp_fn(*args):
            in_axes = tuple(0 if i in diff else None for i in range(n_in))
            return as_tuple(jax.vmap(fn, in_axes=in_axes)(*args))
    else:
        def comp_fn(*args):
            primals, cts = args[:n_in], args[n_in:]
            merge = _split(primals, diff)
            _, pullback = jax.vjp(lambda *d: fn(*merge(d)), *[primals[i] for i in diff])
            return tuple(pullback(tuple(cts) if multi else cts[0]))

    return primitive_from_jax(comp_fn, name, multiple_results=True)
