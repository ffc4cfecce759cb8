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
import numpy as np
from jax.sharding import AxisType, PartitionSpec as P

from ..errors import InvalidOptionError, NotSupportedError, ShapeError
from ..graph import Param, Primitive, SparseType, TensorType, is_linear
from ..graph._cost import Cost
from ..graph._serialize import register_param_type
from ..graph._types import Pattern
from ..solvers import _block_amg
from ..solvers._indices import pattern_matmul, pattern_cols, pattern_rows, take
from ._contract import _multilinear_jvp
from ._map import _mesh_with, map_rule
from ._sparse import (_check_pattern, _dense, _same_dtype, _sparse, sparse_matmul_p,
                      sparse_sddmm_p)


class RowPartition:
    """How the rows of a square sparsity pattern split over `devices`
    devices of mesh axis `axis`, and how the halo travels (`exchange`, see
    the module docstring). Static and hashable by (pattern, devices, axis,
    exchange); build it with `row_partition`.

    Per device `d` (arrays of shape `(devices, ...)`, padded):

    - `entries[d]`: the data positions of its rows' entries (`L` each,
      padded with position 0 and `mask` 0);
    - `local_rows[d]`: each entry's row within the block;
    - `local_cols[d]`: each entry's column in the extended vector
      `[x block (m), halo (H)]`;
    - `send[d]`: the positions within its block of the entries it sends
      (`S` each);
    - `halo_from[d]`: for each halo slot, its place in the flattened
      `devices x S` gathered sends;
    - `back_from[d]`, `back_to[d]`, `back_mask[d]`: for the transpose, the
      places in the flattened `devices x H` gathered halo parts that fall on
      this device's columns, and the positions within its block;
    - `pp_send{k}[d]`: for each shift `k` in `shifts`, the positions within
      its block of the entries device `(d + k) % devices` reads from it;
    - `pp_from[d]`: for each halo slot, its place in the concatenated
      buffers received over the shifts.
    """

    def __init__(self, pattern: Pattern, devices: int, axis: str, exchange: str = "auto"):
        n, ncols = pattern.shape
        if n != ncols or devices < 1 or n % devices:
            raise ShapeError(f"a row partition needs a square matrix whose {n} rows split "
                             f"evenly over {devices} devices, got shape {pattern.shape}; "
                             f"pad the problem to a multiple of {devices} rows.",
                             op="sparse.row_partition")
        if exchange not in EXCHANGES:
            raise InvalidOptionError(f"`exchange` must be one of {EXCHANGES}, got "
                                     f"{exchange!r}.", op="sparse.row_partition")
        self.pattern, self.devices, self.axis = pattern, int(devices), str(axis)
        m = self.block = n // devices
        indptr = np.asarray(pattern.indptr, np.int64)
        cols = np.asarray(pattern.indices, np.int64)
        rows = np.repeat(np.arange(n), np.diff(indptr))
        owner = cols // m
        starts = indptr[np.arange(devices + 1) * m]
        halos = []          # per device: sorted global halo columns
        for d in range(devices):
            c = cols[starts[d]:starts[d + 1]]
            halos.append(np.unique(c[owner[starts[d]:starts[d + 1]] != d]))
        sends = [np.unique(np.concatenate([h[h // m == d] for h in halos] + [np.zeros(0, int)]))
                 for d in range(devices)]
        L = max(1, int(np.max(np.diff(starts))))
        H = max(1, max(h.size for h in halos))
        S = max(1, max(s.size for s in sends))
        self.halo_size, self.send_size, self.entries_size = H, S, L
        entries = np.zeros((devices, L), np.int64)
        mask = np.zeros((devices, L))
        local_rows = np.zeros((devices, L), np.int64)
        local_cols = np.zeros((devices, L), np.int64)
        send = np.zeros((devices, S), np.int64)
        halo_from = np.zeros((devices, H), np.int64)
        for d in range(devices):
            k = np.arange(starts[d], starts[d + 1])
            entries[d, :k.size], mask[d, :k.size] = k, 1.0
            local_rows[d, :k.size] = rows[k] - d * m
            c = cols[k]
            own = owner[k] == d
            lc = np.where(own, c - d * m, 0)
            lc[~own] = m + np.searchsorted(halos[d], c[~own])
            local_cols[d, :k.size] = lc
            send[d, :sends[d].size] = sends[d] - d * m
            for j, g in enumerate(halos[d]):
                e = g // m
                halo_from[d, j] = e * S + int(np.searchsorted(sends[e], g))
        back = [[] for _ in range(devices)]   # (flat place, position) per owner
        for d in range(devices):
            for j, g in enumerate(halos[d]):
                back[g // m].append((d * H + j, g % m))
        K = max(1, max(len(b) for b in back))
        back_from = np.zeros((devices, K), np.int64)
        back_to = np.zeros((devices, K), np.int64)
        back_mask = np.zeros((devices, K))
        for d, b in enumerate(back):
            if b:
                back_from[d, :len(b)], back_to[d, :len(b)] = np.array(b).T
                back_mask[d, :len(b)] = 1.0
        # ppermute: for each shift k, device e sends to (e + k) % devices the
        # entries of its block that device reads, in one buffer of the
        # largest such count; the received buffers, concatenated, hold each
        # device's halo
        shifts, sizes, pp_send = [], [], []
        for k in range(1, devices):
            need = [h[h // m == (d - k) % devices] for d, h in enumerate(halos)]
            size = max(len(v) for v in need)
            if size:
                buf = np.zeros((devices, size), np.int64)
                for d, v in enumerate(need):
                    e = (d - k) % devices
                    buf[e, :v.size] = v - e * m
                shifts.append(k)
                sizes.append(size)
                pp_send.append(buf)
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        pp_from = np.zeros((devices, H), np.int64)
        for d in range(devices):
            for j, g in enumerate(halos[d]):
                e = g // m
                k = (d - e) % devices
                i = shifts.index(k)
                need = halos[d][halos[d] // m == e]
                pp_from[d, j] = offsets[i] + int(np.searchsorted(need, g))
        self.shifts, self.shift_sizes = tuple(shifts), tuple(sizes)
        if exchange == "auto":
            exchange = "ppermute" if sum(sizes) < devices * S else "all_gather"
        self.exchange = exchange
        # where each data position sits in the (devices, L) layout
        self.position = (np.repeat(np.arange(devices), np.diff(starts)) * L
                         + (np.arange(cols.size) - np.repeat(starts[:-1], np.diff(starts))))
        self.arrays = {"entries": entries, "mask": mask, "local_rows": local_rows,
                       "local_cols": local_cols, "send": send, "halo_from": halo_from,
                       "back_from": back_from, "back_to": back_to, "back_mask": back_mask,
                       "pp_from": pp_from}
        self.arrays.update({f"pp_send{k}": b for k, b in zip(shifts, pp_send)})
        for a in self.arrays.values():
            a.setflags(write=False)
        self.halo_counts = tuple(int(h.size) for h in halos)

    def _key(self):
        return (self.pattern, self.devices, self.axis, self.exchange)

    def __eq__(self, other) -> bool:
        return isinstance(other, RowPartition) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return (f"rows/{self.devices}@{self.axis!r}<halo={max(self.halo_counts, default=0)}, "
                f"{self.exchange}={self.received()}>")

    __repr__ = __str__

    def received(self, transpose: bool = False) -> int:
        """How many values each device receives per product, against `n`
        for gathering the whole vector. `all_gather`: every device's sends,
        `devices x S` (the halo parts for the transpose, `devices x H`);
        `ppermute`: one buffer per shift, the largest count any device sends
        that far (the same both ways)."""
        if self.exchange == "ppermute":
            return int(sum(self.shift_sizes))
        return self.devices * (self.halo_size if transpose else self.send_size)


@functools.lru_cache(maxsize=64)
def row_partition(pattern: Pattern, devices: int, axis: str,
                  exchange: str = "auto") -> RowPartition:
    """The `RowPartition` of `pattern` over `devices` devices of mesh axis
    `axis`, computed once per (pattern, devices, axis, exchange).

    `exchange`: how the halo travels. `"all_gather"`: one `all_gather` of
    what each device sends (every device receives all of it); `"ppermute"`:
    one `ppermute` per distance between devices that read each other's
    entries (each device receives its halo, padded per distance); `"auto"`
    (default): the one that moves fewer values (`received()`)."""
    return RowPartition(pattern, devices, axis, exchange)


def _encode_partition(p: RowPartition):
    return {"pattern": p.pattern.to_json(), "devices": p.devices, "axis": p.axis,
            "exchange": p.exchange}


def _decode_partition(d) -> RowPartition:
    return row_partition(Pattern.from_json(d["pattern"]), int(d["devices"]), str(d["axis"]),
                         str(d.get("exchange", "auto")))


register_param_type(RowPartition, "row_partition", _encode_partition, _decode_partition)

EXCHANGES = ("auto", "all_gather", "ppermute")


# ---------------------------------------------------------------------------
# the exchanges (inside shard_map: one device's block)


def _halo(a, x_block, axis, partition):
    """This device's halo values of `x` (what the others send it)."""
    if partition.exchange == "ppermute":
        D = partition.devices
        bufs = [jax.lax.ppermute(x_block[a[f"pp_send{k}"]], axis,
                                 [(e, (e + k) % D) for e in range(D)])
                for k in partition.shifts]
        return jnp.concatenate(bufs)[a["pp_from"]]
    sent = jax.lax.all_gather(x_block[a["send"]], axis, tiled=True)   # (devices * S,)
    return sent[a["halo_from"]]


def _halo_back(a, parts, m, axis, partition):
    """The transpose of `_halo`: this device's halo parts `parts` (H,) sent
    to their owners, and the parts others computed for this device's
    entries added up, as a block of `m`."""
    if partition.exchange == "ppermute":
        D = partition.devices
        recv = jax.ops.segment_sum(parts, a["pp_from"], int(sum(partition.shift_sizes)))
        out, start = jnp.zeros((m,), parts.dtype), 0
        for k, size in zip(partition.shifts, partition.shift_sizes):
            back = jax.lax.ppermute(recv[start:start + size], axis,
                                    [((e + k) % D, e) for e in range(D)])
            out = out + jax.ops.segment_sum(back, a[f"pp_send{k}"], m)
            start += size
        return out
    sent = jax.lax.all_gather(parts, axis, tiled=True)                 # (devices * H,)
    back = sent[a["back_from"]] * a["back_mask"].astype(sent.dtype)
    return jax.ops.segment_sum(back, a["back_to"], m)


def _local(name, partition, mesh, *operands):
    """Runs the block function `name` under `jax.shard_map` over the
    partition's axis of `mesh`."""
    arrays = list(partition.arrays.values())
    if AxisType.Explicit in mesh.axis_types:
        operands = [jax.reshard(x, P(partition.axis)) for x in operands]
        if jax.sharding.get_abstract_mesh().axis_names:  # (under `jax.set_mesh`: typed too)
            arrays = [jax.reshard(jnp.asarray(a), P(partition.axis)) for a in arrays]
    return _runner(name, partition, mesh)(*arrays, *operands)


@functools.lru_cache(maxsize=256)
def _runner(name, partition, mesh):
    """The `shard_map` of block function `name` (one per partition, mesh and
    kind, so that eager calls reuse one compiled program)."""
    axis, m, fn = partition.axis, partition.block, _BLOCKS[name]
    names = tuple(partition.arrays)

    def block(*args):
        a = {k: v[0] for k, v in zip(names, args[:len(names)])}
        return fn(a, m, axis, partition, *args[len(names):])

    specs = (P(axis),) * (len(names) + 2)
    return jax.jit(jax.shard_map(block, mesh=mesh, in_specs=specs, out_specs=P(axis),
                                 check_vma=False))


def _block_matmul(a, m, axis, partition, vals, x):
    vals = vals[0] * a["mask"].astype(vals.dtype)
    ext = jnp.concatenate([x, _halo(a, x, axis, partition)])
    return jax.ops.segment_sum(vals * ext[a["local_cols"]], a["local_rows"], m)


def _block_matmul_t(a, m, axis, partition, vals, x):
    vals = vals[0] * a["mask"].astype(vals.dtype)
    parts = jax.ops.segment_sum(vals * x[a["local_rows"]], a["local_cols"],
                                m + a["halo_from"].shape[0])
    return parts[:m] + _halo_back(a, parts[m:], m, axis, partition)


def _block_sddmm(a, m, axis, partition, u, v):
    ext = jnp.concatenate([v, _halo(a, v, axis, partition)])
    return (u[a["local_rows"]] * ext[a["local_cols"]] * a["mask"].astype(u.dtype))[None]


_BLOCKS = {"matmul": _block_matmul, "matmul_t": _block_matmul_t, "sddmm": _block_sddmm}


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
        return _split(partition, mesh, _local(name, partition, mesh, laid, x))

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
    return _local("matmul_t" if transpose else "matmul", partition, mesh,
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
    laid = _local("sddmm", partition, mesh, u, v)        # (devices, L)
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
# block-Jacobi with a local AMG V-cycle per device (`sciad.solvers._block_amg`)


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
