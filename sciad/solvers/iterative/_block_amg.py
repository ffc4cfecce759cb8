"""Block-Jacobi preconditioning with a local algebraic multigrid V-cycle per
block: the preconditioner of a sharded Krylov solve (`linalg.solve`'s
`partition`, `preconditioner="block_amg"`).

The matrix's `n` rows split into `devices` blocks of `m = n / devices`
consecutive rows (a `RowPartition`'s blocks); block `d`'s diagonal block
`A[dm:(d+1)m, dm:(d+1)m]` gets its own smoothed-aggregation hierarchy,
made by `_amg`'s machinery: its `Structure` (aggregates and superset
patterns) once per pattern, its values (Jacobi weights, `P`, coarse
matrices, the coarsest level's dense inverse) on the host once per values
(`_amg._setup_one`, with its cache). `M^-1 = blockdiag(V_d)`, `V_d` one
V-cycle of block `d`: symmetric positive definite for an spd `A` (each
block of an spd matrix is spd, and the cycle is), so CG takes it.

The blocks' hierarchies differ in shape, so they are padded to common ones
and stacked along a leading axis of `devices` (as the partition's arrays
are): per level the largest row count, entry count and prolongator entry
count over the blocks; padded entries hold value 0 (at row and column 0),
padded rows weight 0, and a block with fewer levels than another continues
through *pass-through* levels (`P` the identity, weight 0: the cycle passes
its right-hand side on unchanged) to its coarsest level, whose dense
inverse is padded with zeros. A padded row's value stays 0 throughout, so
each block's cycle is exactly its own hierarchy's.

`vcycle(bs, arrays, a0, v, transpose=)` is one block's cycle (its slice of
the stacked arrays, its values `a0` and its block `v` of the vector): under
`jax.shard_map` each device runs its own, without communication; without a
mesh, `jax.vmap` over the blocks computes the same. The hierarchies are
made likewise: under a mesh each device makes its own block's
(`setup_block`, one host call per device: new values cost one block's
setup per device), without one a single host call makes all (`setup`).
The aggregation (`BlockStructure`) is made once per pattern: new values
redo only the numeric setup, as `"amg"`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import numpy as np

from ... import _cache
from ...errors import InvalidOptionError
from . import _amg
from .._host import host_call
from ._iterative import AbstractPreconditioner, missing_diagonal


@dataclass(frozen=True, eq=False)
class BlockStructure:
    """The padded, stacked hierarchies of a pattern's `devices` diagonal
    blocks (see the module docstring). Arrays of shape `(devices, ...)`."""

    devices: int
    m: int
    structures: tuple          # per block: its `_amg.Structure`
    positions: np.ndarray      # (devices, Z0): each block entry's place in the data
    mask: np.ndarray           # (devices, Z0): 1 for an entry, 0 for padding
    sizes: tuple               # per level: (N rows, NC coarse, Z entries, PZ P entries)
    index: tuple               # per level: (rows, cols, p_rows, p_cols), each (devices, .)
    n_coarse: int              # the padded coarsest size

    @property
    def levels(self) -> int:
        return len(self.sizes)

    def layout(self, dtype) -> tuple:
        """`((shape, dtype), ...)` of the setup's stacked arrays: each
        level's weights, each level's `P` values, the values of levels 1..,
        the coarsest level's dense inverse."""
        D = self.devices
        out = [((D, s[0]), dtype) for s in self.sizes]
        out += [((D, s[3]), dtype) for s in self.sizes]
        out += [((D, s[2]), dtype) for s in self.sizes[1:]]
        return tuple(out) + (((D, self.n_coarse, self.n_coarse), dtype),)

    def apply_flops(self) -> float:
        """FLOPs of one application (every block's cycle, padded)."""
        f = 0.0
        for n, _, z, pz in self.sizes:
            f += 2.0 * (2 * z + 2 * pz) + 6.0 * n
        return self.devices * (f + 2.0 * self.n_coarse ** 2)

    def nbytes(self, itemsize: int) -> int:
        return sum(int(np.prod(shape)) for shape, _ in self.layout(np.float64)) * itemsize


def _block_pattern(indptr, indices, d: int, m: int):
    """`(indptr, cols, positions)` of diagonal block `d` (local indices) and
    its entries' places in the whole matrix's data."""
    lo, hi = indptr[d * m], indptr[(d + 1) * m]
    cols = indices[lo:hi]
    rows = np.repeat(np.arange(m), np.diff(indptr[d * m:(d + 1) * m + 1]))
    keep = (cols >= d * m) & (cols < (d + 1) * m)
    pos = np.arange(lo, hi)[keep]
    local_indptr = np.concatenate([[0], np.cumsum(np.bincount(rows[keep], minlength=m))])
    return local_indptr, cols[keep] - d * m, pos


def block_structure(pattern, devices: int) -> BlockStructure:
    """The `BlockStructure` of `pattern`'s `devices` diagonal blocks, once
    per (pattern, devices, `_amg.MAX_COARSE`, `_amg.MAX_LEVELS`)."""
    key = (pattern, devices, _amg.MAX_COARSE, _amg.MAX_LEVELS)
    return _cache.cached(_cache.GLOBAL, "block amg structure", key, lambda: _build(*key),
                         limit=16)


def _build(pattern, devices, max_coarse, max_levels) -> BlockStructure:
    n = pattern.shape[0]
    m = n // devices
    indptr = np.asarray(pattern.indptr, np.int64)
    indices = np.asarray(pattern.indices, np.int64)
    blocks = [_block_pattern(indptr, indices, d, m) for d in range(devices)]
    structures = tuple(_amg.build_structure((m, m), bi, bc, max_coarse, max_levels)
                       for bi, bc, _ in blocks)
    Z0 = max(1, max(p.size for _, _, p in blocks))
    positions = np.zeros((devices, Z0), np.int64)
    mask = np.zeros((devices, Z0))
    for d, (_, _, p) in enumerate(blocks):
        positions[d, :p.size], mask[d, :p.size] = p, 1.0
    L = max(len(s.levels) for s in structures)

    def level(s, l):
        """(n, nc, rows, cols, p_rows, p_cols) of a block's level `l` (a
        pass-through level past its own)."""
        if l < len(s.levels):
            lv = s.levels[l]
            return (lv.n, lv.nc, _amg._rows_of(lv.indptr), np.asarray(lv.cols),
                    _amg._rows_of(lv.p_indptr), np.asarray(lv.p_cols))
        nc = s.n_coarse
        e = np.arange(nc)
        return nc, nc, np.zeros(0, np.int64), np.zeros(0, np.int64), e, e

    sizes, index = [], []
    for l in range(L):
        per = [level(s, l) for s in structures]
        N = max(p[0] for p in per)
        NC = max(p[1] for p in per)
        Z = max(1, max(p[2].size for p in per))
        PZ = max(1, max(p[4].size for p in per))
        arrs = [np.zeros((devices, k), np.int32) for k in (Z, Z, PZ, PZ)]
        for d, p in enumerate(per):
            for a, src in zip(arrs, p[2:]):
                a[d, :src.size] = src
        for a in arrs:
            a.setflags(write=False)
        sizes.append((N, NC, Z, PZ))
        index.append(tuple(arrs))
    n_coarse = max(s.n_coarse for s in structures)
    return BlockStructure(devices, m, structures, positions, mask, tuple(sizes), tuple(index),
                          n_coarse)


def _pad(x, size):
    out = np.zeros(size, x.dtype)
    out[:x.size] = x
    return out


def _block_arrays(bs: BlockStructure, d: int, vals: np.ndarray, dtype) -> list:
    """Block `d`'s padded arrays of `layout` (without the leading devices
    axis) from its values `vals` (at least its entries; `block_values`'
    row), its hierarchy from `_amg`'s cache where it holds it."""
    out = [np.zeros(shape[1:], dt) for shape, dt in bs.layout(dtype)]
    L, s = bs.levels, bs.structures[d]
    vals = np.ascontiguousarray(vals[:int(bs.mask[d].sum())])
    arrays = _amg._setup_one(s, vals, dtype)
    nl = len(s.levels)
    weights, ps, values = arrays[:nl], arrays[nl:2 * nl], arrays[2 * nl:3 * nl - 1]
    for l in range(L):
        if l < nl:
            out[l][:weights[l].size] = weights[l]
            out[L + l][:ps[l].size] = ps[l]
            if l >= 1:
                out[2 * L + l - 1][:values[l - 1].size] = values[l - 1]
        else:  # pass-through: P the identity, weight 0
            out[L + l][:s.n_coarse] = 1.0
    c = arrays[-1]
    out[-1][:c.shape[0], :c.shape[1]] = c
    return out


def _setup_blocks(bs: BlockStructure, data: np.ndarray, dtype) -> tuple:
    """The stacked, padded arrays of `layout` from the whole matrix's values."""
    rows = [_block_arrays(bs, d, data[bs.positions[d]], dtype) for d in range(bs.devices)]
    return tuple(np.stack(parts) for parts in zip(*rows))


def setup(a, bs: BlockStructure, after=None):
    """The stacked hierarchies of the matrix with values `a` (the whole
    data vector): one host call (see `_amg.setup` for `after`)."""
    return _amg.host_setup(functools.partial(_setup_blocks, bs), bs.layout(np.dtype(a.dtype)), a,
                           after)


def setup_block(bs: BlockStructure, k, a0, after=None):
    """Block `k`'s arrays of `layout` (without the leading devices axis;
    `k` a traced int32: a device's index on the mesh axis) from its values
    `a0` (its row of `block_values`): one host call, so that under a mesh
    each device makes its own block's hierarchy (one host call for every
    block, in a sharded program, ran on every device: 16 hierarchies for 4
    blocks). `after` as in `_amg.setup`."""
    dtype = np.dtype(a0.dtype)
    layout = tuple((shape[1:], dt) for shape, dt in bs.layout(dtype))
    args = (k, a0) if after is None or not jax.numpy.size(after) else (
        k, a0, _amg._one_of(after))

    def host(k, vals, *_):
        return tuple(_block_arrays(bs, int(k), vals, dtype))

    return host_call(host, tuple(jax.ShapeDtypeStruct(shape, dt) for shape, dt in layout), *args)


def block_values(bs: BlockStructure, a):
    """The blocks' finest-level values, `(devices, Z0)`, from the data `a`."""
    return a[bs.positions] * bs.mask.astype(a.dtype)


def _spmv(vals, rows, cols, n_out, x, transpose=False):
    if transpose:
        rows, cols = cols, rows
    return jax.ops.segment_sum(vals * x[cols], rows, n_out)


def vcycle(bs: BlockStructure, arrays, index, a0, v, *, transpose: bool = False):
    """One block's V-cycle from zero for `op(A_dd) x = v` (`_amg.cycle` on
    the padded levels): `arrays` its slices of `layout`'s arrays, `index`
    its slices of the level index arrays (`bs.index`), `a0` its finest
    values, `v` its block (`m`,)."""
    levels = [(n, nc, index[k]) for k, (n, nc, _, _) in enumerate(bs.sizes)]
    return _amg.cycle(_amg.index_products(levels, _spmv), arrays, a0, v, transpose=transpose)


class BlockAMG(AbstractPreconditioner):
    """`"block_amg"`: block-Jacobi over a row partition's blocks, each block
    approximately inverted by a V-cycle of its own AMG hierarchy (see the
    module docstring): the preconditioner of a sharded Krylov solve, and of a
    solve given `partition=` on one device (the same blocks there)."""

    name = "block_amg"
    matrices = frozenset({"sparse"})
    where = "host"
    shardable = True
    partitioned = True

    def rejects(self, *, matrix: str, pattern=None, shown: str = ""):
        return InvalidOptionError, (
            "preconditioner='block_amg' is block-Jacobi over a row partition's blocks: pass "
            "`partition=` (`sd.sparse.row_partition`), or use 'amg'.")

    def rejects_partition(self, pattern, *, shown: str = ""):
        return missing_diagonal(pattern, "the 'block_amg' preconditioner smooths with the "
                                "diagonal, so it", shown)

    def partitioned_cost(self, pattern, partition, itemsize: int):
        bs = block_structure(pattern, partition.devices)
        return (bs.apply_flops(), bs.nbytes(itemsize),
                f"block_amg: {bs.devices} blocks of {bs.levels + 1} levels")
