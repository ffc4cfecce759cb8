"""A square sparsity pattern's rows split over the devices of a mesh axis
(`RowPartition`, `row_partition`), and the block functions that run under
`jax.shard_map` over it (`local`): each device's products over its block
of rows and its halo, with the halo exchanged by `ppermute`s or one
`all_gather` (`sciad.primitives._sparse_sharded` says how the sharded
products and their derivatives use them). Index arithmetic and JAX
collectives only; the graph's side (the param's serialization, the
primitives) stays in the primitives layer.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, PartitionSpec as P

from ..errors import InvalidOptionError, ShapeError

EXCHANGES = ("auto", "all_gather", "ppermute")


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

    def __init__(self, pattern, devices: int, axis: str, exchange: str = "auto"):
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
def row_partition(pattern, devices: int, axis: str,
                  exchange: str = "auto") -> RowPartition:
    """The `RowPartition` of `pattern` over `devices` devices of mesh axis
    `axis`, computed once per (pattern, devices, axis, exchange).

    `exchange`: how the halo travels. `"all_gather"`: one `all_gather` of
    what each device sends (every device receives all of it); `"ppermute"`:
    one `ppermute` per distance between devices that read each other's
    entries (each device receives its halo, padded per distance); `"auto"`
    (default): the one that moves fewer values (`received()`)."""
    return RowPartition(pattern, devices, axis, exchange)


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


def local(name, partition, mesh, *operands):
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
