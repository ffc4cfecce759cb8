"""Jacobian sparsity as an interpretation of the graph.

Each value is given the set of differentiated-input elements each of its
elements depends on: a boolean SciPy CSR matrix with one row per element of
the value (a sparse value: per stored entry) and one column per element of
the inputs differentiated. Interpreting a graph with every primitive's
sparsity rule gives the structural pattern of its Jacobian: global (it holds
for every input value, as SparseConnectivityTracer's global patterns do), and
sound (every entry that can be nonzero is in it).

A rule is declared beside the primitive's other rules:

```python
@p.def_sparsity
def _sparsity(outs, *deps, **params):  # outs: the output types
    return elementwise(outs[0], *deps)  # one CSR matrix per output
```

`deps[i]` is a `Deps`: the operand's dependency matrix, its shape, and its
value where it is a constant (a literal, or computed from literals only), so
a product with a constant stencil keeps the stencil's zeros. The helpers
below (`elementwise`, `dense`, `along`, `grouped`, `by_ids`, `contraction`) cover
most rules. Integer and boolean values never carry dependencies. A primitive
without a rule is taken as dense in all its operands, with a
`SparsityWarning` naming it.
"""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple, Sequence

import jax
import numpy as np
import scipy.sparse as sp

from ..config import x64_scope
from ..errors import ShapeError, SparsityWarning
from ._autodiff import add_any_p, jvp_primal_p
from ._core import Graph, Literal, Node
from ._interpret import Interpreter
from ._types import AbstractType, BatchedType, FactorType, SparseType, TensorType

#: the most dependency entries one value may hold (a dense 7,000 x 7,000
#: Jacobian); beyond it the interpretation stops with an error instead of
#: running out of memory
MAX_ENTRIES = 50_000_000
#: the largest constant the interpretation computes, to keep a constant
#: operand's zeros (a stencil built with `snp.eye` and friends)
MAX_CONSTANT = 1_000_000


class Deps(NamedTuple):
    """One operand, as a sparsity rule sees it."""

    #: `(size, n)` boolean CSR: row `i` holds the input elements element `i`
    #: (in C order; a sparse value's stored entries) depends on
    matrix: sp.csr_matrix
    #: the operand's shape (a sparse matrix: `(nnz,)`, its data vector)
    shape: tuple[int, ...]
    #: the operand's value, where it is a constant; else None
    value: np.ndarray | None = None

    @property
    def size(self) -> int:
        return self.matrix.shape[0]

    @property
    def columns(self) -> int:
        return self.matrix.shape[1]

    def mask(self) -> np.ndarray | None:
        """Where a constant is nonzero (None: not a constant)."""
        return None if self.value is None else np.asarray(self.value) != 0


def value_shape(t: AbstractType) -> tuple[int, ...]:
    """The shape of a value's elements: a sparse matrix's is its data vector's;
    a factorization is one element (it depends on its whole matrix)."""
    if isinstance(t, SparseType):
        return (t.pattern.nnz,)
    if isinstance(t, FactorType):
        return (1,)
    if isinstance(t, BatchedType):  # a batch of sparse matrices or factorizations
        return (t.size,) + value_shape(t.inner)
    return tuple(t.shape)


def _size(t: AbstractType) -> int:
    return int(np.prod(value_shape(t), dtype=np.int64))


def empty(size: int, n: int) -> sp.csr_matrix:
    return sp.csr_matrix((size, n), dtype=bool)


def _bool(m) -> sp.csr_matrix:
    m = sp.csr_matrix(m)
    if m.dtype != bool:
        m = m.astype(bool)
    m.eliminate_zeros()
    m.sort_indices()
    return m


def select_rows(m: sp.csr_matrix, idx) -> sp.csr_matrix:
    """Rows `idx` of `m` (a flat int array); an index < 0 gives an empty row."""
    idx = np.asarray(idx, dtype=np.int64).ravel()
    keep = idx >= 0
    sel = sp.csr_matrix((np.ones(int(keep.sum()), bool), (np.nonzero(keep)[0], idx[keep])),
                        shape=(idx.size, m.shape[0]))
    return _bool(sel @ m)


def union(*ms: sp.csr_matrix) -> sp.csr_matrix:
    out = ms[0]
    for m in ms[1:]:
        out = out + m
    return _bool(out)


def _broadcast_index(shape: tuple, out_shape: tuple) -> np.ndarray:
    """For each element of a value of `shape` broadcast to `out_shape`, the
    element of the value it is."""
    idx = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    return np.broadcast_to(idx, out_shape).ravel()


def elementwise(out: AbstractType, *deps: Deps) -> sp.csr_matrix:
    """Each output element depends on the elements it is computed from, the
    operands broadcast (NumPy's rules) to the output's shape."""
    shape = value_shape(out)
    ms = [select_rows(d.matrix, _broadcast_index(d.shape, shape)) if d.shape != shape
          else d.matrix for d in deps if d.matrix.nnz]
    if not ms:
        return empty(_size(out), deps[0].columns)
    return union(*ms)


def all_of(*deps: Deps) -> sp.csr_matrix:
    """One row: every element any operand depends on."""
    n = deps[0].columns
    cols = [np.unique(d.matrix.indices) for d in deps if d.matrix.nnz]
    cols = np.unique(np.concatenate(cols)) if cols else np.zeros(0, np.int64)
    return sp.csr_matrix((np.ones(cols.size, bool), cols, [0, cols.size]), shape=(1, n))


def dense(out: AbstractType, *deps: Deps) -> sp.csr_matrix:
    """Every output element depends on every element of every operand."""
    (m,) = dense_all((out,), *deps)
    return m


def dense_all(outs: Sequence[AbstractType], *deps: Deps) -> list[sp.csr_matrix]:
    """`dense` for each of a node's outputs (the bound on entries over all)."""
    row = all_of(*deps)
    sizes = [_size(t) for t in outs]
    _check_entries(int(sum(sizes)) * row.nnz)
    return [select_rows(row, np.zeros(k, np.int64)) for k in sizes]


def _check_entries(k: int) -> None:
    if k > MAX_ENTRIES:
        raise ShapeError(
            f"the Jacobian pattern would hold {k:,} entries (more than {MAX_ENTRIES:,}): the "
            "function couples its elements densely (a dense solve, an FFT or a reduction "
            "feeding the output), so a sparse Jacobian would not pay.", op="sparsity")


def grouped(out: AbstractType, dep: Deps, in_group: np.ndarray,
            out_group: np.ndarray) -> sp.csr_matrix:
    """Each output element `o` depends on every operand element `e` with
    `in_group[e] == out_group[o]` (reductions over axes, FFTs along axes,
    sorts): the union of each group's rows, then one row per output."""
    in_group = np.asarray(in_group, np.int64).ravel()
    n_groups = int(max(in_group.max(initial=-1), np.max(out_group, initial=-1)) + 1)
    onehot = sp.csr_matrix((np.ones(in_group.size, bool), (in_group, np.arange(in_group.size))),
                           shape=(n_groups, dep.size))
    per_group = _bool(onehot @ dep.matrix)
    _check_entries(int(np.diff(per_group.indptr)[np.asarray(out_group).ravel()].sum()))
    return select_rows(per_group, out_group)


def along(out: AbstractType, dep: Deps, axes: Sequence[int],
          out_axes: Sequence[int] | None = None) -> sp.csr_matrix:
    """Each output element depends on every operand element of its line
    along `axes` (the operand's) / `out_axes` (the output's; default
    `axes`): the elements that share its position on the other axes
    (reductions, cumulative sums, sorts, FFTs, decompositions per matrix)."""
    return grouped(out, dep, axes_groups(dep.shape, axes),
                   axes_groups(value_shape(out), axes if out_axes is None else out_axes))


def axes_groups(shape: tuple, axes: Sequence[int]) -> np.ndarray:
    """For each element of a value of `shape`, its position among the
    others once `axes` are taken out (the group a reduction along `axes`
    puts it in)."""
    shape = tuple(shape)
    kept = [i for i in range(len(shape)) if i not in {a % max(len(shape), 1) for a in axes}]
    grid = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), np.int64)
    if not kept:
        return np.zeros(int(np.prod(shape, dtype=np.int64)), np.int64)
    return np.ravel_multi_index(tuple(grid[i] for i in kept), tuple(shape[i] for i in kept))


def by_ids(fn: Callable[..., np.ndarray], *deps: Deps) -> sp.csr_matrix:
    """For ops that move elements (reshape, transpose, slicing, padding,
    concatenation): `fn` applied to arrays of element ids, one per operand
    (in its shape, numbered across all operands), gives for each output
    element the id it is a copy of (-1: a constant, no dependence)."""
    ids, start = [], 0
    for d in deps:
        ids.append(np.arange(start, start + d.size, dtype=np.int64).reshape(d.shape))
        start += d.size
    out = np.asarray(fn(*ids))
    stacked = sp.vstack([d.matrix for d in deps], format="csr") if len(deps) > 1 \
        else deps[0].matrix
    return select_rows(stacked, out.ravel())


def contraction(out: AbstractType, spec: str, *deps: Deps) -> sp.csr_matrix:
    """An einsum-like product (`"ij,jk->ik"`, no ellipsis, operands already
    broadcast-compatible): output element `o` depends on operand `k`'s
    element `e` where some term of the sum holds both and the other
    operands' factors in that term are not constant zeros."""
    ins, res = spec.split("->")
    terms = ins.split(",")
    letters = sorted(set("".join(terms)), key=lambda c: "".join(terms + [res]).index(c))
    dims: dict[str, int] = {}
    for t, d in zip(terms, deps):
        for c, n in zip(t, d.shape):
            dims[c] = max(dims.get(c, 1), n)
    space = tuple(dims[c] for c in letters)
    _check_entries(int(np.prod(space, dtype=np.int64)) * len(deps))
    grid = np.indices(space, sparse=True)

    def flat(term, shape):
        # the element of an operand each term of the sum reads (broadcast dims: 0)
        coords = [grid[letters.index(c)] if n > 1 else 0 for c, n in zip(term, shape)]
        if not coords:
            return np.zeros(space, np.int64)
        return np.broadcast_to(np.ravel_multi_index(
            np.broadcast_arrays(*coords), tuple(shape)) if shape else 0, space)

    elems = [flat(t, d.shape) for t, d in zip(terms, deps)]
    masks = [np.broadcast_to(d.mask().ravel()[e], space) if d.value is not None
             else np.ones(space, bool) for d, e in zip(deps, elems)]
    o = flat(res, value_shape(out))
    size = _size(out)
    parts = []
    for k, d in enumerate(deps):
        if not d.matrix.nnz:
            continue
        live = np.ones(space, bool)
        for j, m in enumerate(masks):
            if j != k:
                live &= m
        sel = sp.csr_matrix((np.ones(int(live.sum()), bool), (o[live], elems[k][live])),
                            shape=(size, d.size))
        parts.append(_bool(sel) @ d.matrix)
    return union(*parts) if parts else empty(size, deps[0].columns)


# ---------------------------------------------------------------------------
# the interpreter


class _Sparsity(Interpreter):
    def __init__(self, graph: Graph, n: int, missing: set):
        super().__init__(graph)
        self.n = n
        self.missing = missing  # the primitives without a rule, for one warning

    def literal(self, lit: Literal) -> Deps:
        shape = value_shape(lit.type)
        return Deps(empty(_size(lit.type), self.n), shape, np.asarray(lit.value))

    def run_node(self, node: Node, invals: Sequence[Deps]) -> list[Deps]:
        outs = [v.type for v in node.outputs]
        carried = [_carries(t) for t in outs]
        if not any(carried) or not any(d.matrix.nnz for d in invals):
            values = _constant(node, invals)
            return [Deps(empty(_size(t), self.n), value_shape(t),
                         None if values is None else values[i]) for i, t in enumerate(outs)]
        prim = node.primitive
        rule = prim.sparsity_rule
        if rule is None:
            self.missing.add(prim.name)
            res = dense_all(outs, *invals)
        else:
            res = rule(tuple(outs), *invals, **node.params)
            res = list(res) if prim.multiple_results else [res]
        out = []
        for t, m, c in zip(outs, res, carried):
            if not c:
                m = empty(_size(t), self.n)
            assert m.shape == (_size(t), self.n), \
                f"{prim.name}: its sparsity rule gave a {m.shape} pattern for {t.str_short()}"
            out.append(Deps(_bool(m), value_shape(t)))
        return out


def _carries(t: AbstractType) -> bool:
    """Whether a value of type `t` can depend on the inputs (a float or
    complex array)."""
    dtype = getattr(t, "dtype", None)
    return dtype is not None and np.dtype(dtype).kind in "fc"


def _constant(node: Node, invals: Sequence[Deps]):
    """The node's output values where all its operands are small constants
    (so a stencil built in the program keeps its zeros), else None."""
    prim = node.primitive
    if prim.impl_rule is None or prim.runtime_checks or node.subgraphs \
            or any(d.value is None for d in invals) \
            or sum(_size(v.type) for v in node.outputs) > MAX_CONSTANT \
            or any(isinstance(v.type, SparseType) or not isinstance(v.type, TensorType)
                   for v in node.outputs):
        return None
    try:
        with x64_scope(), jax.ensure_compile_time_eval():
            res = prim.impl_rule(*(d.value for d in invals), **node.params)
        res = res if prim.multiple_results else (res,)
        return [np.asarray(r) for r in res]
    except Exception:  # an op that cannot run eagerly here: no value, still sound
        return None


def sparsity_eval(graph: Graph, deps: Sequence[Deps]) -> list[Deps]:
    """Interprets `graph` on its inputs' `Deps`; returns its outputs'. Rules of
    higher-order primitives call it on their bodies."""
    n = deps[0].columns if deps else 0
    missing: set = set()
    outs = _Sparsity(graph, n, missing).run(*deps)
    _warn_missing(missing)
    return outs


def _warn_missing(missing: set) -> None:
    if missing:
        names = ", ".join(sorted(missing))
        warnings.warn(
            f"no sparsity rule for {names}: the Jacobian pattern takes their outputs to "
            "depend on all of their operands (sound, but possibly denser than it is). "
            "Declare one with `@p.def_sparsity`.", SparsityWarning, stacklevel=3)


def input_deps(types: Sequence[AbstractType], wrt: Sequence[bool]) -> list[Deps]:
    """The inputs' `Deps`: identity blocks for those differentiated (their
    elements numbered in order), empty ones for the rest."""
    sizes = [_size(t) if w else 0 for t, w in zip(types, wrt)]
    n = int(sum(sizes))
    out, start = [], 0
    for t, w, k in zip(types, wrt, sizes):
        size = _size(t)
        if w:
            m = sp.csr_matrix((np.ones(k, bool), (np.arange(k), np.arange(start, start + k))),
                              shape=(size, n))
            start += k
        else:
            m = empty(size, n)
        out.append(Deps(m, value_shape(t)))
    return out


def graph_sparsity(graph: Graph, wrt: Sequence[bool]) -> sp.csr_matrix:
    """The structural Jacobian of `graph`'s outputs (stacked, in order) with
    respect to its inputs flagged in `wrt`: a boolean CSR matrix."""
    outs = sparsity_eval(graph, input_deps(graph.in_types, wrt))
    return sp.vstack([d.matrix for d in outs], format="csr") if len(outs) > 1 \
        else outs[0].matrix


def body_rule(graph_of: Callable[[dict], Graph]):
    """A sparsity rule for a node that applies its body once to its operands
    (`call`, `checkpoint`): the body interpreted on them."""
    def rule(outs, *deps, **params):
        return [d.matrix for d in sparsity_eval(graph_of(params), deps)]
    return rule


def moves(impl: Callable, **fixed):
    """A sparsity rule for an op that moves elements and whose implementation
    runs on integer arrays (reshape, transpose, slicing): `impl(*ids,
    **params)` on element ids (see `by_ids`), `fixed` overriding params (a
    pad's fill value: -1, no dependence)."""
    def rule(outs, *deps, **params):
        def on_ids(*ids):
            with x64_scope(), jax.ensure_compile_time_eval():
                return np.asarray(impl(*map(jax.numpy.asarray, ids), **{**params, **fixed}))
        return by_ids(on_ids, *deps)
    return rule


def scatter_add(out: AbstractType, x: Deps, v: Deps, positions: np.ndarray) -> sp.csr_matrix:
    """`x` with the elements of `v` added at `positions` (the output element
    each element of `v` lands on; several may land on one)."""
    positions = np.asarray(positions, np.int64).ravel()
    sel = sp.csr_matrix((np.ones(positions.size, bool), (positions, np.arange(positions.size))),
                        shape=(_size(out), v.size))
    return union(x.matrix, _bool(sel @ v.matrix))


# ---------------------------------------------------------------------------
# bodies applied to slices (`scan`'s per-step inputs, `map`'s examples)


def symbolic_slices(deps: Sequence[Deps], length: int, shapes: Sequence[tuple],
                    n: int) -> tuple[list[Deps], sp.csr_matrix]:
    """For a body interpreted once for all the slices of stacked operands
    (`deps`, each `length` slices of `shapes[j]` along its leading axis),
    the body's inputs for a slice, and the slices' dependencies.

    The slices get `K` columns of their own after the `n` real ones (one per
    element of a slice, across the operands): slice operand `j`'s input is
    the identity onto its columns, and the body's other inputs get `K` empty
    columns (`pad_columns`). An output of the body so interpreted has real
    columns (what it depends on whatever the slice) and symbolic ones (the
    elements of its slice it depends on), which `substitute` replaces by
    those of each slice. Every rule selects and unites rows, so this gives
    for each slice what interpreting the body on that slice would (or a
    superset, where a rule asks whether an operand depends on anything).
    Returns `(inputs, x)`: `x`, `(length * K, n)`, holds slice `t`'s rows
    (the operands' in order) at `t * K ...`."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    K = int(sum(sizes))
    inputs, idx, start, off = [], [], 0, 0
    for d, s, k in zip(deps, shapes, sizes):
        eye = sp.csr_matrix((np.ones(k, bool), (np.arange(k), n + start + np.arange(k))),
                            shape=(k, n + K))
        inputs.append(Deps(eye, tuple(s)))
        idx.append(off + np.arange(length, dtype=np.int64)[:, None] * k + np.arange(k))
        start += k
        off += d.size
    if K and length:
        stacked = sp.vstack([d.matrix for d in deps], format="csr") if len(deps) > 1 \
            else deps[0].matrix
        x = select_rows(stacked, np.concatenate(idx, axis=1).ravel())
    else:
        x = empty(length * K, n)
    return inputs, x


def pad_columns(d: Deps, k: int) -> Deps:
    """`d` with `k` more (empty) columns: a real operand beside symbolic slices."""
    if not k:
        return d
    return Deps(_bool(sp.hstack([d.matrix, empty(d.size, k)], format="csr")), d.shape,
                d.value)


def substitute(out: sp.csr_matrix, n: int, x: sp.csr_matrix, length: int) -> sp.csr_matrix:
    """A body output's pattern `out` (`(m, n + K)`, see `symbolic_slices`)
    for each of the `length` slices whose rows `x` (`(length * K, n)`)
    holds, stacked: `(length * m, n)`, slice `t`'s at `t * m ...`: its real
    columns, and the rows of slice `t` its symbolic columns name."""
    m, K = out.shape[0], out.shape[1] - n
    tiled = select_rows(_bool(out[:, :n]), np.tile(np.arange(m, dtype=np.int64), length))
    sym = _bool(out[:, n:]) if K else None
    if sym is None or not sym.nnz:
        return tiled
    _check_entries(length * sym.nnz)
    per = sp.kron(sp.eye(length, dtype=bool, format="csr"), sym, format="csr")
    return union(tiled, _bool(_bool(per) @ x))


def any_slice(out: sp.csr_matrix, n: int, x: sp.csr_matrix) -> sp.csr_matrix:
    """`out` (`(m, n + K)`) for a slice that may be any of those in `x`
    (`(length * K, n)`): its real columns, and the rows of every slice its
    symbolic columns name; `(m, n)`."""
    K = out.shape[1] - n
    real = _bool(out[:, :n])
    if not K or not x.shape[0]:
        return real
    t = np.arange(x.shape[0], dtype=np.int64)
    fold = sp.csr_matrix((np.ones(t.size, bool), (t % K, t)), shape=(K, t.size))
    return union(real, _bool(_bool(out[:, n:]) @ _bool(fold @ x)))


# the sparsity rules of the autodiff layer's own primitives
add_any_p.def_sparsity(lambda outs, x, y: elementwise(outs[0], x, y))
jvp_primal_p.def_sparsity(lambda outs, x: x.matrix)
