"""`map`: a body applied to every example of a batch, as one node.

`map[body, batched, size](*args)` applies its closed body to `size`
examples at once: operand `i` holds one value per example (a leading axis of
`size`; for a sparse matrix or a factorization a `BatchedType`) where
`batched[i]`, and one value shared by all examples otherwise. Every output
has the leading batch axis. It is lowered as `jax.vmap` of the body, so XLA
batches what it can (dense factorizations, triangular solves, Krylov
iterations) and a host call gets the whole batch in one call (SuperLU
factors and solves each matrix of the batch in that call).

It is the batch rule of the primitives whose operands are not just arrays
(sparse matrices, factorizations, matrix-free operators): `map_rule(prim)`
wraps one node of `prim` in a `map`. A batch of sparse matrices on one
pattern is so one `map[sparse.assemble]` node, its factorization one
`map[linalg.factor]` node (one symbolic analysis for the pattern, a numeric
factorization per matrix), and every solve with it, the adjoint's included,
a `map[linalg.backsolve]` reading that factor.

Rules, each a `map` itself:

- JVP: a `map` of the body's JVP; a tangent is batched where its primal is.
- VJP: a `map` of the body's per-example backward pass, reading the
  operands, the outputs and their cotangents (a one-node body uses its
  primitive's VJP rule on the given outputs, so nothing is recomputed); the
  cotangent of an operand shared by all examples is the sum over the batch
  of the per-example ones.
- batching (a `map` under another `sd.vmap`): a `map` of the `map`.

Devices: a `map` with `spmd_axis` set (`sd.vmap(..., spmd_axis_name=...)`)
is lowered as `jax.shard_map` of the `jax.vmap` over that mesh axis: each
device maps the body over its own examples, so a host call (SuperLU) runs
on every device for its share of the batch rather than gathering the batch
on one. The mesh is the one the operands are sharded over (JAX's abstract
mesh of their type), else the current one (`jax.set_mesh`, or the one
`sd.function` sets from its arguments' shardings; with no mesh at all, the
map runs on one device); the batch must divide evenly over the axis. The derivative and batch rules keep `spmd_axis`.
"""

from __future__ import annotations

import functools

import jax

from .. import _ops as ops
from ..errors import InvalidOptionError, ShapeError
from ..graph import Body, Graph, Param, Primitive, SparseType, Zero, instantiate, is_zero, lower
from ..graph import is_linear
from ..graph._autodiff import (graph_linear_outputs, is_differentiable, needs_ct, register_zeros,
                               type_of, vjp_eval, vjp_node, zeros)
from ..graph._batch import batch_graph, batch_size_of, batched_front, batched_type
from ..graph._batch import example_type, register_map_rule, to_front
from ..graph._body import inline, jvp_body, transpose_body
from ..graph._cost import Cost
from ..graph._core import Factored, Node, Var
from ..graph._serialize import register_v1_migration
from ..graph._sparsity import pad_columns, sparsity_eval, substitute, symbolic_slices, value_shape
from ..graph._trace import current_source, trace_flat
from ..graph._types import BatchedType

@functools.lru_cache(maxsize=1024)
def _single_body(prim: Primitive, params: tuple, in_types: tuple, source) -> Body:
    """The body that is one node of `prim` (its params given as sorted
    items) on operands of `in_types`, recorded at `source`; the same `Graph`
    object for the same arguments, so that nodes holding it are equal (the
    key `share_factors` shares factorizations by)."""
    ins = tuple(Var(t) for t in in_types)
    outs = tuple(Var(t) for t in prim.abstract_eval(*in_types, **dict(params)))
    node = Node(prim, ins, outs, dict(params), frozenset(), source)
    return Body.of(Graph(ins, (node,), outs, prim.name.replace(".", "_")))


def axis_param(spmd_axis: str | None) -> dict:
    """The `spmd_axis` param of a `map` node, left out at its default."""
    return {} if spmd_axis is None else {"spmd_axis": spmd_axis}


def _map_factored(params) -> Factored | None:
    # A map of one solve-like node on a batch of matrices computes from a
    # batch of factorizations: `share_factors` then gives each batch of
    # matrices one map[factor] node, read by every map of solves with it
    # (the adjoint's transposed solves included). With the matrix shared by
    # the examples (a batch split over devices, see `columns_rule`), one
    # factor node, read by maps of solves: each device solves its examples.
    node = _one_node(params["body"])
    if node is None or node.primitive.factored is None:
        return None
    how = node.primitive.factored(dict(node.params))
    if how is None:
        return None
    size, ins = params["size"], tuple(v.type for v in node.inputs)
    factor_type = how.factor.abstract_eval(ins[0], **how.factor_params)
    rbody = _single_body(how.reader, tuple(sorted(how.reader_params.items())),
                         tuple(factor_type) + ins, node.source)
    axis = axis_param(params.get("spmd_axis"))
    batched = params["batched"][0]
    reader = {"body": rbody, "batched": (batched,) + tuple(params["batched"]), "size": size,
              **axis}
    if not batched:
        return Factored(how.factor, how.factor_params, map_p, reader)
    fbody = _single_body(how.factor, tuple(sorted(how.factor_params.items())), ins[:1],
                         node.source)
    return Factored(map_p, {"body": fbody, "batched": (True,), "size": size, **axis}, map_p,
                    reader)


def reader_nodes(readers) -> list:
    """The nodes that read a factorization, a `map` of one node counted as
    that node (for a factorization's `fit_to_readers`)."""
    return [(_one_node(u.params["body"]) or u) if u.primitive is map_p else u
            for u in readers]


def on_devices(readers) -> bool:
    """Whether a reader is a `map` split over devices: each device then reads
    a shared factorization, so it is read more times than it has readers."""
    return any(u.primitive is map_p and u.params.get("spmd_axis") for u in readers)


def _map_fit(params, readers, complete, escapes=False) -> dict:
    # a map of a factorization takes its params from the nodes its readers
    # map (the fit unwraps them, `reader_nodes`, and sees the maps split over
    # devices, `on_devices`); what its body makes, the map holds in the
    # enclosing graph (`_map_holds`)
    node = _one_node(params["body"])
    fit = node.primitive.fit_to_readers if node is not None else None
    if fit is None:
        return params
    new = dict(fit(dict(node.params), readers, complete,
                   escapes or params.get("spmd_axis") is not None))
    if new == dict(node.params):
        return params
    return dict(params, body=_single_body(node.primitive, tuple(sorted(new.items())),
                                          tuple(v.type for v in node.inputs), node.source))


# The body's layout counts all its inputs as per-example inputs
# (`Body.of(graph)`, no consts), not the shared ones as consts and the
# batched ones as per-example inputs: `batched`
# flags the operands in their own order (a node's operands, as its batch rule
# or its derivative's map finds them, batched and shared interleaved), and
# the body's inputs follow that order; a layout of two groups would need the
# operands, the body's inputs and `batched` permuted at every bind and
# unpermuted in every rule, for no rule that reads it.
def _map_holds(params):
    # a map of one node that holds what it makes (a factorization) holds the
    # batch of them: its body returns them, and the enclosing graph ends them
    # (not over a mesh: there each device makes its examples' own)
    node = _one_node(params["body"])
    if node is None or node.primitive.holds is None or params.get("spmd_axis") is not None:
        return None
    held = node.primitive.holds(node.params)
    if held is None:
        return None
    body = _single_body(node.primitive, tuple(sorted(held.without.items())),
                        tuple(v.type for v in node.inputs), node.source)
    return held._replace(without=dict(params, body=body))


map_p = Primitive("map", multiple_results=True, factored=_map_factored, reads_factor=True,
                  fit_to_readers=_map_fit, holds=_map_holds, params={
                      "body": Body, "batched": tuple[bool, ...], "size": int,
                      "spmd_axis": Param((str, None), default=None)})


@map_p.def_abstract_eval
def _map_shape(*in_types, body, batched, size, spmd_axis=None):
    op = "map"
    if not isinstance(body, Body):
        raise ShapeError(f"`body` must be a Body, got {body!r}.", op=op)
    if len(batched) != len(in_types) or len(body.inputs) != len(in_types):
        raise ShapeError(f"the body takes {len(body.inputs)} operands and `batched` flags "
                         f"{len(batched)}, got {len(in_types)} operands.", op=op)
    if size < 0:
        raise InvalidOptionError(f"`size` must be >= 0, got {size}.", op=op)
    for k, (t, b, v) in enumerate(zip(in_types, batched, body.inputs)):
        want = batched_type(v.type, size) if b else v.type
        if t != want:
            raise ShapeError(f"operand {k} must be {want.str_short()}, got {t.str_short()}.",
                             op=op)
    return tuple(batched_type(t, size) for t in body.out_types)


@map_p.def_impl
def _map_impl(*args, body, batched, size, spmd_axis=None, site=None):
    f = lower(body, site.held if site is not None else ())
    in_axes = tuple(0 if b else None for b in batched)
    axis = spmd_axis
    mesh = None if axis is None else _mesh_with(axis, args)
    if mesh is None:
        return _mapped(f, in_axes, size, args)
    from jax.sharding import AxisType, PartitionSpec as P

    n = mesh.shape[axis]
    if size % n:
        raise ShapeError(f"a batch of {size} examples cannot be split evenly over the "
                         f"{n} devices of mesh axis {axis!r}; make the batch a multiple "
                         f"of {n}.", op="vmap")

    def local(*a):
        return _mapped(f, in_axes, size // n, a)

    specs = tuple(P(axis) if b else P() for b in batched)
    if AxisType.Explicit in mesh.axis_types:
        # Over a mesh with explicit axes an operand's type holds its layout,
        # which must be the one shard_map is given: split along the batch, or
        # whole on every device. (Over automatic axes shard_map reshards.)
        args = [jax.tree_util.tree_map(lambda x: jax.reshard(x, spec), a)
                for a, spec in zip(args, specs)]
    return tuple(jax.shard_map(local, mesh=mesh, in_specs=specs,
                               out_specs=P(axis), check_vma=False)(*args))


def _mapped(f, in_axes, size: int, args) -> tuple:
    """`f` over the examples: `jax.vmap`, or one example after another in one
    loop (`jax.lax.map`) where an implementation has no JAX batching rule
    (JAX's `spsolve`). A batch of one runs `f` once, unbatched (a batched
    host call costs more than a plain one)."""
    tm = jax.tree_util.tree_map
    if size == 1:
        outs = f(*[a if ax is None else tm(lambda x: x[0], a) for a, ax in zip(args, in_axes)])
        return tuple(tm(lambda x: x[None], o) for o in outs)
    try:
        return tuple(jax.vmap(lambda *a: tuple(f(*a)), in_axes=in_axes, axis_size=size)(*args))
    except Exception as e:  # (sciad's lowering wraps the failing node's error)
        if not isinstance(e, NotImplementedError) and not isinstance(
                e.__cause__, NotImplementedError):
            raise
    shared = [a for a, ax in zip(args, in_axes) if ax is None]
    per = [a for a, ax in zip(args, in_axes) if ax is not None]

    def one(xs):
        it, sh = iter(xs), iter(shared)
        return tuple(f(*[next(sh) if ax is None else next(it) for ax in in_axes]))

    return tuple(jax.lax.map(one, tuple(per)))


def _leaves(a) -> list:
    return list(a) if isinstance(a, tuple) else [a]


def _mesh_with(axis: str, args):
    """The mesh that has `axis`: the one the operands are sharded over, else
    the one set with `jax.set_mesh`; None where no mesh is known at all (the
    program runs on one device, as if on a mesh of one)."""
    meshes = [getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
              for a in args for x in _leaves(a)]
    meshes.append(jax.sharding.get_abstract_mesh())
    meshes = [m for m in meshes if m is not None and not m.empty]
    for m in meshes:
        if axis in m.axis_names:
            return m
    if not meshes:
        return None
    names = sorted({n for m in meshes for n in m.axis_names})
    raise ShapeError(f"`spmd_axis_name={axis!r}` names a mesh axis, but the mesh here has "
                     f"axes {names}: name one of them, or shard the arguments over a mesh "
                     f"with axis {axis!r} (`sd.function(..., in_shardings="
                     f"NamedSharding(mesh, P({axis!r})))`).", op="vmap")


def _one_node(body: Graph):
    """The node of a body that is one node applied to the body's inputs,
    else None."""
    if len(body.nodes) != 1:
        return None
    node = body.nodes[0]
    if tuple(node.inputs) != tuple(body.inputs) or tuple(node.outputs) != tuple(body.outputs):
        return None
    return node


# The derivatives of a map are the body's per-example derivative graphs,
# batched: each of their nodes by its own batch rule, so a solve in them
# becomes a map of one solve again, which shares the forward map's factors.


@map_p.def_jvp
def _map_jvp(primals, tangents, *, body, batched, size, spmd_axis=None):
    nz = [not is_zero(t) and is_differentiable(v.type) for t, v in zip(tangents, body.inputs)]
    jg, out_nz = jvp_body(body, nz)
    dims = [0 if b else None for b in batched]
    args = list(primals) + [instantiate(t) for t, z in zip(tangents, nz) if z]
    res = [batched_front(o, d, size) for o, d in
           batch_graph(jg, args, dims + [d for d, z in zip(dims, nz) if z], spmd_axis)]
    n = len(body.outputs)
    it = iter(res[n:])
    return tuple(res[:n]), tuple(next(it) if z else Zero(type_of(o).update())
                                 for o, z in zip(res[:n], out_nz))


@map_p.def_vjp
def _map_vjp(primals, outs, cts, *, body, batched, size, spmd_axis=None):
    from ._sparse import gather  # (here: _sparse imports this module)

    n_in, n_out = len(body.inputs), len(body.outputs)
    # (an operand the reverse pass holds fixed gets no cotangent formed)
    diff = [is_differentiable(v.type) and needs_ct(p) for v, p in zip(body.inputs, primals)]
    ct_nz = [not is_zero(c) for c in cts]
    node = _one_node(body)

    def backward(*a):
        p, o, c = a[:n_in], a[n_in:n_in + n_out], iter(a[n_in + n_out:])
        full = [next(c) if z else Zero(v.type.update()) for v, z in zip(body.outputs, ct_nz)]
        if node is not None:  # the rule on the given outputs: nothing recomputed
            in_cts = vjp_node(node.primitive, list(p), list(o), full, dict(node.params), node,
                              diff)
        else:
            _, bwd = vjp_eval(body, list(p), diff)
            in_cts = bwd(full)
        res = []
        for v, ct, d, b in zip(body.inputs, in_cts, diff, batched):
            if not d:
                continue
            ct = instantiate(ct if ct is not None else Zero(v.type.update()))
            if not b and isinstance(v.type, SparseType):
                ct = gather(ct)  # its data, summed over the batch below
            res.append(ct)
        return res

    types = (list(body.in_types) + list(body.out_types)
             + [t for t, z in zip(body.out_types, ct_nz) if z])
    g, _, _ = trace_flat(backward, tuple(types), name=f"{body.name}_vjp")
    dims = [0 if b else None for b in batched] + [0] * (n_out + sum(ct_nz))
    res = iter(batch_graph(g, [*primals, *outs, *[c for c, z in zip(cts, ct_nz) if z]], dims,
                           spmd_axis))
    return _operand_cts(body, diff, batched, res, size)


def _operand_cts(body, wanted, batched, res, size) -> tuple:
    """The operands' cotangents from a batched backward body's results `res`
    (`(value, batch_dim)` for each `wanted` operand): a batched operand's
    with the batch in front, a shared one's summed over the examples."""
    from ._sparse import assemble  # (here: _sparse imports this module)

    out = []
    for v, w, b in zip(body.inputs, wanted, batched):
        if not w:
            out.append(None)
            continue
        ct, cd = next(res)
        if b:
            ct = batched_front(ct, cd, size)
        else:  # shared by the examples: the sum of their cotangents
            ct = ops.sum(ct, axis=cd) if cd is not None else ct * size
            if isinstance(v.type, SparseType):
                ct = assemble(ct, v.type.pattern)
        out.append(ct)
    return tuple(out)


@map_p.def_linearity
def _map_linearity(linear, *, body, batched, size, spmd_axis=None):
    return graph_linear_outputs(body, linear)


@map_p.def_transpose
def _map_transpose(cts, *args, body, batched, size, spmd_axis=None):
    # a map of the body's per-example transpose; the cotangent of a linear
    # operand shared by the examples is the sum of theirs
    from ._sparse import gather  # (here: _sparse imports this module)

    linear = [is_linear(a) for a in args]
    given = [not is_zero(c) for c in cts]
    g = transpose_body(body, linear, given, name=f"{body.name}_transpose")
    shared_sparse = [isinstance(v.type, SparseType) and not b
                     for v, b, f in zip(body.inputs, batched, linear) if f]
    if any(shared_sparse):  # their data, summed over the batch below
        g, _, _ = trace_flat(lambda *a: [gather(c) if s else c for c, s in
                                         zip(inline(g, a), shared_sparse)],
                             tuple(g.in_types), name=g.name)
    operands = [a for a in args if not is_linear(a)] + [c for c, z in zip(cts, given) if z]
    dims = [0 if b else None for a, b in zip(args, batched) if not is_linear(a)]
    res = iter(batch_graph(g, operands, dims + [0] * sum(given), spmd_axis))
    return _operand_cts(body, linear, batched, res, size)


def map_rule(prim: Primitive):
    """The batch rule that maps `prim` over the batch: one `map` node whose
    body is one node of `prim` on one example's operands. For primitives
    whose operands are not only arrays, and whose implementation JAX can
    vmap."""
    def rule(args, dims, spmd_axis=None, **params):
        size = batch_size_of(args, dims)
        operands = [a if d is None else to_front(a, d) for a, d in zip(args, dims)]
        types = tuple(type_of(a) if d is None else example_type(type_of(o))
                      for a, o, d in zip(args, operands, dims))
        if prim is map_p:  # a map of a map: the outer one splits the batch over devices
            params.pop("spmd_axis", None)
        body = _single_body(prim, tuple(sorted(params.items())), types, current_source())
        outs = list(map_p.bind(*operands, body=body, batched=tuple(d is not None for d in dims),
                               size=size, **axis_param(spmd_axis)))
        if prim.multiple_results:
            return outs, [0] * len(outs)
        return outs[0], 0
    rule.maps = True
    return rule


map_p.def_batch(map_rule(map_p))


def _zeros_batched(t: BatchedType):
    # a batch of zeros of a non-array type: the zero of one example, for all

    body, _, _ = trace_flat(lambda: [zeros(t.inner)], (), name="zeros")
    (out,) = map_p.bind(body=Body.of(body), batched=(), size=t.size)
    return out


def _register():
    register_zeros(BatchedType, _zeros_batched)
    register_map_rule(map_rule)


_register()


# Sparsity: the body interpreted once, each example's slices of the batched
# operands as symbolic columns (`symbolic_slices`): example `b`'s outputs
# depend on what the body reads of the shared operands and on the elements
# of example `b` it reads.


@map_p.def_sparsity
def _map_sparsity(outs, *deps, body, batched, size, spmd_axis=None):
    n = deps[0].columns
    sliced = [d for d, b in zip(deps, batched) if b]
    shapes = [value_shape(v.type) for v, b in zip(body.inputs, batched) if b]
    x_in, x_rows = symbolic_slices(sliced, size, shapes, n)
    K = int(sum(d.size for d in x_in))
    it = iter(x_in)
    res = sparsity_eval(body, [next(it) if b else pad_columns(d, K)
                               for d, b in zip(deps, batched)])
    return [substitute(r.matrix, n, x_rows, size) for r in res]


@map_p.def_cost
def _map_cost(node, body):
    b = body(node.params["body"])
    n = node.params["size"]
    return Cost(n * b.flops, n * b.peak, f"{n} examples")



def columns_rule(prim: Primitive):
    """The batch rule of an op `op(*mats, b)` linear in its last operand, a
    vector `(n,)` or a block of columns `(n, k)`, that takes blocks of any
    width: with the matrices shared, a batch of `b`s is one op on the block
    of all their columns (a batch of right-hand sides against one matrix:
    one factorization, one multi-column solve); with batched matrices, a
    `map` (`map_rule`). A batch split over devices (`spmd_axis`) is a `map`
    too, so that each device solves its own examples; with the matrices
    shared, `share_factors` then factors them once, and the maps read that
    factorization (`_map_factored`)."""
    fallback = map_rule(prim)

    def rule(args, dims, spmd_axis=None, **params):
        if spmd_axis is not None or any(d is not None for d in dims[:-1]):
            return fallback(args, dims, spmd_axis=spmd_axis, **params)
        b, d = args[-1], dims[-1]
        shape = type_of(b).shape
        size = shape[d]
        cols = ops.moveaxis(b, d, 1)  # (n, B) or (n, B, k)
        if len(shape) == 2:
            return prim.bind(*args[:-1], cols, **params), 1
        n, k = cols.shape[0], cols.shape[2]
        x = prim.bind(*args[:-1], ops.reshape(cols, (n, size * k)), **params)
        return ops.reshape(x, (type_of(x).shape[0], size, k)), 1
    rule.maps = True
    return rule


# version-1 files: the body was a plain graph (its operands all per-example
# inputs; `batched` says which vary)
register_v1_migration("map", lambda p: {**p, "body": Body.of(p["body"])})
