"""Sparse products with the rows of the matrix split over the devices of a
mesh axis: each device holds its block of rows (and the matching block of
the vector), and exchanges only its halo.

- `sparse.sharded_matmul[pattern, partition, transpose]`: `A @ x` (or
  `A.T @ x`) for a square `A` and `x` of shape `(n,)`;
- `sparse.sharded_sddmm[pattern, partition]`: `data_k = u[r_k] v[c_k]`, the
  cotangent of `A` in `A @ x` (as `sparse.sddmm`, for vectors).

`partition` is a `RowPartition`: the pattern's `n` rows cut into `devices`
blocks of `n / devices` consecutive rows, device `d` holding rows (and
vector entries) `[d m, (d + 1) m)`. It is computed once per pattern, device
count and axis (`row_partition` caches it): for each device its stored
entries (padded to one length), the columns it reads that other devices
own (its *halo*), and the entries of its own block that other devices read
(what it *sends*).

Under a mesh with the partition's axis (`jax.set_mesh`, or operands
sharded over one) the products run as `jax.shard_map` over that axis,
with one of two exchanges of the halo (the partition's `exchange`):

- `ppermute`: for each distance `k` at which some device reads entries of
  the device `k` before it, one `ppermute` of a buffer of the largest such
  count; each device receives its halo (padded per distance).
- `all_gather`: each device gathers the entries it sends (`S` values, `S`
  the largest send count), and one `all_gather` gives every device all
  `devices x S` sent values, from which it takes its halo.

Then:

- `A @ x`: each device's rows' products are local, over `[x block, halo]`.
- `A.T @ x`: the reverse. Each device multiplies its rows' transposes by
  its block of `x`; the parts that fall on its own columns stay, those on
  halo columns go back through the exchange run backwards (`ppermute`s
  with the inverse permutations, or an `all_gather` of the halo parts,
  `devices x H` values), and each device adds those aimed at its columns.
- `sddmm(u, v)`: `v`'s halo as in `A @ x`, then each device's entries are
  local products.

So each is the transpose of another over the same exchange pattern, and the
derivative rules are those of `sparse.matmul` and `sparse.sddmm`. Without a
mesh (or with a mesh of one device along the axis) they compute the same
products on one device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec as P

from ..errors import NotSupportedError, ShapeError
from ..graph import Param, Primitive, SparseType, TensorType, is_linear
from ..graph._cost import Cost
from ..graph._serialize import register_param_type
from ..graph._types import Pattern
from ..solvers.iterative import _block_amg
from ..solvers._partition import RowPartition, local, row_partition
from ..solvers._indices import pattern_matmul, pattern_cols, pattern_rows, take
from ._contract import _multilinear_jvp
from ._map import _mesh_with, map_rule
from ._sparse import (_check_pattern, _dense, _same_dtype, _sparse, sparse_matmul_p,
                      sparse_sddmm_p)


def _encode_partition(p: RowPartition):
    return {"pattern": p.pattern.to_json(), "devices": p.devices, "axis": p.axis,
            "exchange": p.exchange}


def _decode_partition(d) -> RowPartition:
    return row_partition(Pattern.from_json(d["pattern"]), int(d["devices"]), str(d["axis"]),
                         str(d.get("exchange", "auto")))


register_param_type(RowPartition, "row_partition", _encode_partition, _decode_partition)


def _mesh(partition, args, op: str = "sparse.sharded_matmul"):
    """The mesh to split over, or None to compute on one device."""
    try:
        mesh = _mesh_with(partition.axis, args)
    except ShapeError:
        names = sorted(jax.sharding.get_abstract_mesh().axis_names)
        raise ShapeError(f"the row partition is over mesh axis {partition.axis!r}, but the "
                         f"mesh here has axes {names}: build the partition with one of "
                         "them.", op=op) from None
    if mesh is None or mesh.shape[partition.axis] == 1 and partition.devices == 1:
        return None
    if mesh.shape[partition.axis] != partition.devices:
        raise ShapeError(f"the row partition is over {partition.devices} devices, but mesh "
                         f"axis {partition.axis!r} has {mesh.shape[partition.axis]}; build "
                         "the partition for this mesh.", op=op)
    return mesh


def _split(partition, mesh, v):
    """`v` (rows first) laid out as the partition's rows over `mesh`."""
    spec = P(partition.axis, *([None] * (v.ndim - 1)))
    if AxisType.Explicit in mesh.axis_types:
        return jax.reshard(v, spec)
    if isinstance(mesh, jax.sharding.Mesh):
        return jax.lax.with_sharding_constraint(v, jax.sharding.NamedSharding(mesh, spec))
    return jax.lax.with_sharding_constraint(v, spec)


def sharded_product(partition, data, b, transpose: bool, op: str):
    """For a Krylov loop run in global view on vectors split as the
    partition's rows: `(matvec, b, split, each_device)`, with `matvec(x) =
    op(A) x` the sharded product (a `shard_map`, halo exchange only), `b`
    laid out over the devices, `split(v)` that lays out another vector so,
    and `each_device(fn, values)` that runs a check on every device (see
    `each_device`); None without a mesh to split over (the loop then runs
    on one device)."""
    mesh = _mesh(partition, (data, b), op)
    if mesh is None:
        return None
    if AxisType.Explicit in mesh.axis_types:
        raise NotSupportedError(
            f"a sharded Krylov solve runs over a mesh with automatic axes; mesh axis "
            f"{partition.axis!r} is explicit (the Krylov loop's operators do not take "
            "explicitly sharded vector types yet): make the mesh with "
            "`axis_types=(jax.sharding.AxisType.Auto,)`.", op=op)
    laid = _by_device(partition, data)
    name = "matmul_t" if transpose else "matmul"

    def matvec(x):
        return _split(partition, mesh, local(name, partition, mesh, laid, x))

    def split(v):
        return _split(partition, mesh, v)

    return matvec, split(b), split, functools.partial(each_device, mesh)


def each_device(mesh, fn, values: dict):
    """`fn(values)` (a dict of arrays, to a scalar token) run on every
    device of `mesh`, on replicated `values`: a `shard_map` over all its
    axes, where a host call runs once per device."""
    names = list(values)
    vals = [jnp.asarray(v) for v in values.values()]
    if AxisType.Explicit in mesh.axis_types:
        vals = [jax.reshard(v, P()) for v in vals]

    def per_device(*vs):
        return fn(dict(zip(names, vs)))

    return jax.shard_map(per_device, mesh=mesh, in_specs=(P(),) * len(vals), out_specs=P(),
                         check_vma=False)(*vals)


def _by_device(partition, data):
    """The data vector laid out `(devices, L)` (padding entries read position 0)."""
    return data[partition.arrays["entries"].ravel()].reshape(partition.devices, -1)


# ---------------------------------------------------------------------------
# primitives


sharded_matmul_p = Primitive("sparse.sharded_matmul", params={
    "pattern": Pattern, "partition": RowPartition, "transpose": Param(bool, default=False)})
sharded_sddmm_p = Primitive("sparse.sharded_sddmm", params={
    "pattern": Pattern, "partition": RowPartition})


def _check_partition(pattern, partition, op):
    if not isinstance(partition, RowPartition) or partition.pattern != pattern:
        raise ShapeError(f"`partition` must be the RowPartition of the node's pattern "
                         f"{pattern} (`row_partition(pattern, devices, axis)`), got "
                         f"{partition!r}.", op=op)


@sharded_matmul_p.def_abstract_eval
def _matmul_shape(a, x, *, pattern, partition, transpose=False):
    op = "sparse.sharded_matmul"
    a = _sparse(a, op, "`a`")
    _check_pattern(a, pattern, op)
    _check_partition(pattern, partition, op)
    x = _dense(x, op, "`x`")
    dtype = _same_dtype(a, x, op)
    n = a.shape[0]
    if x.shape != (n,):
        raise ShapeError(f"cannot multiply {a.str_short()} by {x.str_short()}: the sharded "
                         f"product takes a vector of shape ({n},).", op=op)
    return TensorType((n,), dtype)


@sharded_matmul_p.def_impl
def _matmul_impl(data, x, *, pattern, partition, transpose=False):
    mesh = _mesh(partition, (data, x))
    if mesh is None:
        return pattern_matmul(pattern, data, x, transpose)
    return local("matmul_t" if transpose else "matmul", partition, mesh,
                  _by_device(partition, data), x)


sharded_matmul_p.def_jvp(_multilinear_jvp(sharded_matmul_p))


@sharded_matmul_p.def_transpose
def _matmul_transpose(ct, a, x, *, pattern, partition, transpose=False):
    assert not (is_linear(a) and is_linear(x)), "sparse.sharded_matmul: both operands linear"
    if is_linear(x):
        return None, sharded_matmul_p.bind(a, ct, pattern=pattern, partition=partition,
                                           transpose=not transpose)
    u, v = (x, ct) if transpose else (ct, x)
    return sharded_sddmm_p.bind(u, v, pattern=pattern, partition=partition), None


@sharded_matmul_p.def_cost
def _matmul_cost(node, body):
    return Cost(2.0 * node.params["pattern"].nnz)


@sharded_sddmm_p.def_abstract_eval
def _sddmm_shape(u, v, *, pattern, partition):
    op = "sparse.sharded_sddmm"
    _check_partition(pattern, partition, op)
    u, v = _dense(u, op, "`u`"), _dense(v, op, "`v`")
    dtype = _same_dtype(u, v, op)
    n = pattern.shape[0]
    if u.shape != (n,) or v.shape != (n,):
        raise ShapeError(f"needs `u` and `v` of shape ({n},), got {u.str_short()} and "
                         f"{v.str_short()}.", op=op)
    return SparseType(pattern, dtype)


@sharded_sddmm_p.def_impl
def _sddmm_impl(u, v, *, pattern, partition):
    mesh = _mesh(partition, (u, v))
    if mesh is None:
        return take(u, pattern_rows(pattern), sorted_indices=True) * take(v, pattern_cols(pattern))
    laid = local("sddmm", partition, mesh, u, v)        # (devices, L)
    return laid.ravel()[partition.position]


sharded_sddmm_p.def_jvp(_multilinear_jvp(sharded_sddmm_p))


@sharded_sddmm_p.def_transpose
def _sddmm_transpose(ct, u, v, *, pattern, partition):
    assert not (is_linear(u) and is_linear(v)), "sparse.sharded_sddmm: both operands linear"
    if is_linear(u):
        return sharded_matmul_p.bind(ct, v, pattern=pattern, partition=partition), None
    return None, sharded_matmul_p.bind(ct, u, pattern=pattern, partition=partition,
                                       transpose=True)


@sharded_sddmm_p.def_cost
def _sddmm_cost(node, body):
    return Cost(float(node.params["pattern"].nnz))


# batching: a map of the product (JAX vmaps the shard_map); sparsity: that of
# the unsharded product (the partition does not change what reads what)
sharded_matmul_p.def_batch(map_rule(sharded_matmul_p))
sharded_sddmm_p.def_batch(map_rule(sharded_sddmm_p))


@sharded_matmul_p.def_sparsity
def _matmul_sparsity(outs, a, x, *, pattern, partition, transpose=False):
    return sparse_matmul_p.sparsity_rule(outs, a, x, pattern=pattern, transpose=transpose)


@sharded_sddmm_p.def_sparsity
def _sddmm_sparsity(outs, u, v, *, pattern, partition):
    return sparse_sddmm_p.sparsity_rule(outs, u, v, pattern=pattern)


# ---------------------------------------------------------------------------
# block-Jacobi with a local AMG V-cycle per device (`sciad.solvers.iterative._block_amg`)


def block_amg(partition, data, after, transpose: bool, op: str):
    """`v -> M^-1 v` for the block-Jacobi preconditioner of the matrix with
    values `data` whose blocks are the partition's devices' diagonal
    blocks, each approximately inverted by one V-cycle of its own AMG
    hierarchy (set up on the host once per values). Under a mesh each
    device applies its own block's cycle to its rows (`shard_map`, no
    communication); without one, `jax.vmap` over the blocks computes the
    same."""
    bs = _block_amg.block_structure(partition.pattern, partition.devices)
    a0 = _block_amg.block_values(bs, data)
    index = tuple(tuple(jnp.asarray(x) for x in lv) for lv in bs.index)
    D, m = partition.devices, partition.block

    def one(arrays, index, a0, v):
        return _block_amg.vcycle(bs, arrays, index, a0, v, transpose=transpose)

    mesh = _mesh(partition, (data, after), op)
    if mesh is None:
        arrays = _block_amg.setup(data, bs, after)
        return lambda v: jax.vmap(one)(arrays, index, a0, v.reshape(D, m)).reshape(-1)

    spec = P(partition.axis)

    # each device makes its own block's hierarchy (one host call for all
    # blocks ran on every device of the mesh)
    def setup_here(a0, *after):
        k = jax.lax.axis_index(partition.axis)
        return tuple(x[None] for x in _block_amg.setup_block(bs, k, a0[0], *after))

    ordered = () if after is None or not jnp.size(after) else (_split(partition, mesh, after),)
    arrays = jax.shard_map(setup_here, mesh=mesh, in_specs=(spec,) * (1 + len(ordered)),
                           out_specs=spec, check_vma=False)(a0, *ordered)

    def per_device(arrays, index, a0, v):
        first = functools.partial(jax.tree_util.tree_map, lambda x: x[0])
        return one(first(arrays), first(index), a0[0], v)

    run = jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    return lambda v: _split(partition, mesh, run(arrays, index, a0, v))
