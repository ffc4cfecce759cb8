"""What a program costs, at the level of the user's operations: FLOPs, bytes
and memory per node, the values reverse mode saves, and the peak memory of
the program and of its gradient (`sd.cost`).

Estimates, from types and params alone (nothing runs):

- FLOPs: a primitive's `cost` rule (`Primitive.def_cost`); without one, a
  FLOP per output element (elementwise ops, copies). A loop costs its
  trip count times its body (a `while` without `max_steps`: one step, and
  the row says so); a checkpointed backward pass adds the forward steps its
  schedule recomputes.
- bytes: a node's operands and results (the memory traffic of one pass,
  what XLA calls bytes accessed).
- memory: a liveness walk over the nodes: at each node, the values computed
  earlier and still read later, its results, and what it needs while it
  runs (its `temp`: a loop body's own values, a checkpointed loop's stored
  carries, a factorization's fill). The graph's inputs belong to the caller
  and are not counted. XLA may reuse or fuse buffers, so its figure is
  usually somewhat lower; the comparison is in the report when asked for.
- saved: the bytes of the values the reverse-mode program computes in its
  forward part and reads in its backward part (a scan's stacked residuals,
  an exp's result), each counted at the node of the program it comes from
  (the same op at the same line).
- a sparse factorization: the fill of its pattern after the same ordering
  SuperLU uses, found once per pattern by a factorization of a matrix with
  that pattern (a symbolic analysis in all but name).
- devices: the figures above are the whole program's, over all devices.
  Arguments that are JAX arrays laid out over several devices add what the
  most loaded device holds of them (from their shardings), and XLA's
  analysis (`compare_xla`) is then of the partitioned program: per device.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import numpy as np
import scipy.sparse as sp

from ..config import x64_scope
from .. import _cache
from ..errors import SciadError
from ._autodiff import is_differentiable, jvp_primal_p, vjp_graph
from ._core import Graph, Node, Var
from ._lower import lower
from ._trace import runtime_leaves, trace
from ._types import AbstractType, FactorType, SparseType, TensorType, leaf_types
from .passes import optimize


@dataclass(frozen=True)
class Cost:
    """What a node costs beyond reading its operands and writing its results:
    `flops` (all of its work: every step of a loop), `temp` (bytes it needs
    while it runs: a body's values, stored carries, fill), and a `note` for
    the report (`"2000 steps"`)."""

    flops: float = 0.0
    temp: int = 0
    note: str = ""


def nbytes(t: AbstractType) -> int:
    """The bytes of a value of type `t` (a sparse matrix: its stored entries;
    a factorization: its arrays, or for a sparse one its fill)."""
    if isinstance(t, TensorType):
        return int(np.prod(t.shape, dtype=np.int64)) * t.dtype.itemsize
    if isinstance(t, SparseType):
        return t.pattern.nnz * t.dtype.itemsize
    if isinstance(t, FactorType) and t.pattern is not None:
        fill = sparse_lu_fill(t.pattern)
        return (fill.nnz_l + fill.nnz_u) * (t.dtype.itemsize + 4) + 8 * t.shape[0]
    leaves = leaf_types(t)
    return sum(nbytes(x) for x in leaves) if leaves else 0


def size(t: AbstractType) -> int:
    """The number of elements of a tensor (stored entries of a sparse matrix)."""
    if isinstance(t, TensorType):
        return int(np.prod(t.shape, dtype=np.int64))
    if isinstance(t, SparseType):
        return t.pattern.nnz
    return 0


@dataclass(frozen=True)
class Fill:
    """A sparse LU factorization's fill: entries of L and U, and the FLOPs to
    compute them."""

    nnz_l: int
    nnz_u: int
    flops: float


def sparse_lu_fill(pattern) -> Fill:
    """The fill of SuperLU's factorization of a matrix with `pattern` (with
    its ordering, `MMD_AT_PLUS_A`), from a factorization of a diagonally
    dominant matrix of that pattern (so pivoting stays on the diagonal);
    kept in sciad's analysis cache (at most 64 patterns')."""
    return _cache.cached(_cache.GLOBAL, "lu fill estimate", pattern,
                         lambda: _sparse_lu_fill(pattern), nbytes=64, limit=64)


def _sparse_lu_fill(pattern) -> Fill:
    import scipy.sparse.linalg as spl  # (here: it adds ~160 ms to `import sciad`, measured)

    n = pattern.shape[0]
    indptr, indices = np.asarray(pattern.indptr), np.asarray(pattern.indices)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    vals = np.where(rows == indices, 2.0 * (np.diff(indptr)[rows] + 1), -1.0)
    a = sp.csr_matrix((vals, indices, indptr), shape=pattern.shape).tocsc()
    try:
        # (in SuperLU's symmetric mode, as `sciad.solvers.direct._sparse_direct`
        # factors: see `_factor_one`)
        lu = spl.splu(a, permc_spec="MMD_AT_PLUS_A", options=dict(SymmetricMode=True))
    except RuntimeError:  # structurally singular: no estimate better than dense
        return Fill(n * (n + 1) // 2, n * (n + 1) // 2, 2.0 * n ** 3 / 3)
    lc = np.diff(lu.L.tocsc().indptr) - 1  # below the diagonal, per column
    ur = np.diff(lu.U.tocsr().indptr) - 1  # right of the diagonal, per row
    flops = float(np.sum(lc + 2.0 * lc * ur))
    return Fill(int(lu.L.nnz), int(lu.U.nnz), flops)


# ---------------------------------------------------------------------------
# the analysis


@dataclass
class Row:
    """One node of the report."""

    node: Node
    flops: float
    bytes: int
    temp: int
    saved: int | None
    note: str


@dataclass
class GraphCost:
    """A graph's cost: its `rows` (one per node), total `flops` and `bytes`,
    and `peak`, the most bytes its values (not its inputs) occupy at once."""

    graph: Graph
    rows: list[Row]
    flops: float
    bytes: int
    peak: int


def node_cost(node: Node, body: Callable[[Graph], GraphCost] | None = None) -> Cost:
    """A node's `Cost` by its primitive's rule (`body` costs its bodies)."""
    rule = node.primitive.cost_rule
    if rule is None:
        return Cost(float(sum(size(v.type) for v in node.outputs)))
    return rule(node, body or graph_cost)


def graph_cost(graph: Graph) -> GraphCost:
    """The cost of `graph` (see the module docstring). Bodies met more than
    once (a loop's body in its forward and backward passes) are costed
    once."""
    memo: dict[int, tuple[Graph, GraphCost]] = {}

    def body(g: Graph) -> GraphCost:
        hit = memo.get(id(g))
        if hit is None:
            hit = memo[id(g)] = (g, _graph_cost(g, body))
        return hit[1]

    return _graph_cost(graph, body)


def _graph_cost(graph: Graph, body) -> GraphCost:
    rows = []
    for node in graph.nodes:
        c = node_cost(node, body)
        io = sum(nbytes(a.type) for a in node.inputs if isinstance(a, Var)) + sum(
            nbytes(v.type) for v in node.outputs)
        rows.append(Row(node, c.flops, io, c.temp, None, c.note))
    return GraphCost(graph, rows, sum(r.flops for r in rows), sum(r.bytes for r in rows),
                     _peak(graph, [r.temp for r in rows]))


def _peak(graph: Graph, temps: Sequence[int], reusable: Sequence[Var] = ()) -> int:
    """The most bytes the graph's own values occupy at once, each value from
    the node computing it to its last reader (outputs to the end). A result
    of the type of an operand that the node reads last takes that operand's
    memory (as XLA updates in place: a loop's carried buffer, an element-wise
    op on a dead value), also where that operand is one of the inputs in
    `reusable` (a loop body's carries, which XLA updates in place)."""
    n = len(graph.nodes)
    last: dict[Var, int] = {}
    for i, node in enumerate(graph.nodes):
        for a in node.inputs:
            if isinstance(a, Var):
                last[a] = i
    for a in graph.outputs:
        if isinstance(a, Var):
            last[a] = n
    frees: dict[int, int] = {}
    made: set[Var] = set()  # the values the graph's nodes compute
    borrowed: set[Var] = set(reusable)  # values in memory the graph does not count
    live = peak = 0
    for i, node in enumerate(graph.nodes):
        dying = [a for a in dict.fromkeys(node.inputs) if isinstance(a, Var)
                 and (a in made or a in borrowed) and last.get(a) == i]
        out = 0
        for v in node.outputs:
            same = next((a for a in dying if a.type == v.type), None)
            if same is None:
                out += nbytes(v.type)
                continue
            dying.remove(same)  # v takes the memory `same` leaves
            if same in borrowed:
                borrowed.add(v)
            else:
                frees[i] -= nbytes(v.type)
        peak = max(peak, live + out + temps[i])
        live += out
        for v in node.outputs:  # a result nobody reads is freed at once
            if v not in borrowed:
                frees.setdefault(last.get(v, i), 0)
                frees[last.get(v, i)] += nbytes(v.type)
        made.update(v for v in node.outputs if v not in borrowed)
        live -= frees.pop(i, 0)
    return peak


def loop_body_peak(graph: Graph, cost: GraphCost, carries: Sequence[Var]) -> int:
    """The peak memory of a loop body (`cost`, its `graph_cost`) whose
    `carries` (inputs) XLA updates in place."""
    return _peak(graph, [r.temp for r in cost.rows], carries)


def saved_values(gradient: Graph, num_primals: int) -> dict[Var, Node | None]:
    """The values a reverse-mode program (`gradient_program`) keeps from its
    forward part for its backward part, each with the forward node that
    computes it (None for an input): the nodes that do not depend on the
    output cotangents (its inputs after the first `num_primals`) are the
    forward part."""
    tainted = set(gradient.inputs[num_primals:])
    producer: dict[Var, Node | None] = {v: None for v in gradient.inputs[:num_primals]}
    out: dict[Var, Node | None] = {}
    for node in gradient.nodes:
        if any(isinstance(a, Var) and a in tainted for a in node.inputs):
            tainted.update(node.outputs)
            for a in node.inputs:
                if isinstance(a, Var) and a in producer and producer[a] is not None:
                    out[a] = producer[a]
        else:
            producer.update((v, node) for v in node.outputs)
    return out


def _attribute_saved(rows: list[Row], gradient: Graph, num_primals: int) -> int:
    """Sets each row's `saved`: the bytes of the saved values computed by the
    gradient program's forward nodes that come from the row's node (the same
    op at the same line, else the first row of that line: a derivative
    computed in the forward part). Returns the total."""
    by_key: dict[tuple, Row] = {}
    for r in rows:
        r.saved = 0
        by_key.setdefault((r.node.primitive.name, r.node.source), r)
        by_key.setdefault(r.node.source, r)
    total = 0
    for v, node in saved_values(gradient, num_primals).items():
        b = nbytes(v.type)
        total += b
        r = by_key.get((node.primitive.name, node.source)) or by_key.get(node.source)
        if r is not None:
            r.saved += b
    return total


# ---------------------------------------------------------------------------
# the report


def _si(x: float, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}".rstrip()
    return f"{x:.3g} {unit}".rstrip()


def _mb(b) -> str:
    if b is None:
        return "-"
    if b < 1024:
        return f"{int(b)} B"
    if b < 1024 ** 2:
        return f"{b / 1024:.1f} KiB"
    if b < 1024 ** 3:
        return f"{b / 1024 ** 2:.1f} MiB"
    return f"{b / 1024 ** 3:.2f} GiB"


@dataclass
class CostReport:
    """What `sd.cost` returns; `print` it for the table.

    - `rows`: one `Row` per node of the traced program (op, FLOPs, bytes,
      temp, saved, note, and `node.source`, the user's line).
    - `flops`, `bytes`, `peak`: the program's totals and peak memory.
    - `saved`: the bytes reverse mode keeps for the backward pass.
    - `grad_peak`, `grad_flops`: peak memory and FLOPs of the reverse-mode
      program (forward pass, then backward pass), under the loops'
      checkpoint schedules; None where nothing is differentiable, or where
      reverse mode is not available (`no_gradient` says why).
    - `xla`: with `compare_xla=True`, XLA's own analysis of the compiled
      programs: `{"program": {...}, "gradient": {...}}`, each with
      `flops`, `bytes accessed`, `temp` and `output` bytes (per device when
      the arguments are laid out over several).
    - `devices`: how many devices the arguments are laid out over (1 for
      NumPy arrays and single-device arrays); `args_bytes` the bytes of
      the arguments, `args_bytes_per_device` the most any one device holds
      of them (a split array: its block; a replicated one: all of it).
    """

    graph: Graph
    rows: list[Row]
    flops: float
    bytes: int
    peak: int
    saved: int
    grad_flops: float | None = None
    grad_peak: int | None = None
    xla: dict = field(default_factory=dict)
    no_gradient: str | None = None
    devices: int = 1
    args_bytes: int | None = None
    args_bytes_per_device: int | None = None

    def table(self, max_rows: int = 40) -> str:
        rows = self.rows
        if len(rows) > max_rows:  # the costliest, in program order
            keep = set(map(id, sorted(rows, key=lambda r: -(r.flops + r.bytes))[:max_rows]))
            rows = [r for r in rows if id(r) in keep]
        head = ("op", "FLOPs", "bytes", "temp", "saved", "line", "")
        body = [(r.node.primitive.name, _si(r.flops), _mb(r.bytes),
                 _mb(r.temp) if r.temp else "", _mb(r.saved) if r.saved else "",
                 str(r.node.source) if r.node.source else "", r.note) for r in rows]
        widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]
        fmt = lambda r: "  ".join(  # noqa: E731
            (str(c).ljust(w) if i in (0, 5, 6) else str(c).rjust(w))
            for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        lines = [f"cost of {self.graph.name}: {len(self.rows)} nodes"
                 + (f" ({len(rows)} costliest shown)" if len(rows) < len(self.rows) else ""),
                 fmt(head), fmt(tuple("-" * w for w in widths))]
        lines += [fmt(r) for r in body]
        lines.append(f"total: {_si(self.flops, 'FLOP')}, {_mb(self.bytes)} moved, peak "
                     f"memory {_mb(self.peak)}")
        if self.grad_peak is not None:
            lines.append(f"reverse mode: {_mb(self.saved)} saved for the backward pass; "
                         f"gradient program {_si(self.grad_flops, 'FLOP')}, peak memory "
                         f"{_mb(self.grad_peak)}")
        if self.no_gradient:
            lines.append(f"reverse mode: not available ({self.no_gradient})")
        if self.devices > 1:
            lines.append(f"devices: the arguments are laid out over {self.devices}, at most "
                         f"{_mb(self.args_bytes_per_device)} of their {_mb(self.args_bytes)} "
                         f"on one (the figures above: all devices together)")
        per = ", per device" if self.devices > 1 else ""
        for name, d in self.xla.items():
            lines.append(f"XLA ({name}{per}): {_si(d['flops'], 'FLOP')}, "
                         f"{_mb(d['bytes accessed'])} accessed, temp {_mb(d['temp'])}, "
                         f"output {_mb(d['output'])}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _layout(leaves) -> tuple[int, int, int]:
    """`(devices, bytes, most bytes on one device)` of run-time arrays: the
    devices their shardings lay them over (1 without any)."""
    per_device: dict = {}
    total = 0
    for x in leaves:
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            continue
        itemsize = np.dtype(x.dtype).itemsize
        total += int(np.prod(x.shape, dtype=np.int64)) * itemsize
        sharding = getattr(x, "sharding", None)
        if sharding is None or not hasattr(sharding, "devices_indices_map"):
            continue
        for dev, index in sharding.devices_indices_map(tuple(x.shape)).items():
            n = 1
            for sl, dim in zip(index, x.shape):
                n *= len(range(*sl.indices(dim)))
            per_device[dev] = per_device.get(dev, 0) + n * itemsize
    if len(per_device) < 2:
        return 1, total, total
    return len(per_device), total, max(per_device.values())


def _args_mesh(leaves):
    """The one device mesh that the arguments are laid out over, or None (as
    `sd.function` finds it: batched nodes split over its axes find it while
    lowering)."""
    if not jax.sharding.get_abstract_mesh().empty:
        return None
    found = {getattr(getattr(x, "sharding", None), "mesh", None) for x in leaves}
    found = {getattr(m, "abstract_mesh", m) for m in found if m is not None}
    found = {m for m in found if not m.empty}
    return found.pop() if len(found) == 1 else None


def _xla_analysis(graph: Graph, args) -> dict:
    mesh = _args_mesh(args)
    run = lower(graph)
    if mesh is not None and jax.sharding.AxisType.Explicit in mesh.axis_types:
        # as `sd.function` runs it: layouts chosen by the compiler
        run = jax.sharding.auto_axes(run, out_sharding=jax.sharding.PartitionSpec())
    with x64_scope(), (jax.sharding.use_abstract_mesh(mesh) if mesh is not None
                       else contextlib.nullcontext()):
        compiled = jax.jit(run).lower(*args).compile()
        ca = compiled.cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        ma = compiled.memory_analysis()
    return {"flops": float(ca.get("flops", 0.0)),
            "bytes accessed": float(ca.get("bytes accessed", 0.0)),
            "temp": int(ma.temp_size_in_bytes), "output": int(ma.output_size_in_bytes)}


def gradient_program(graph: Graph) -> Graph | None:
    """Reverse mode of `graph` as one program: its forward part, then its
    backward part (the cotangents of the outputs are inputs), optimized as
    `sd.function` would; None if no input is differentiable."""
    if not any(is_differentiable(v.type) for v in graph.inputs):
        return None
    vg = vjp_graph(graph)
    nout = len(graph.outputs)
    fwd, bwd = vg.forward, vg.backward
    nsaved = len(fwd.outputs) - nout
    sub = dict(zip(bwd.inputs[:nsaved], fwd.outputs[nout:]))

    def s(a):
        return sub.get(a, a) if isinstance(a, Var) else a

    nodes = fwd.nodes + tuple(n.replace(inputs=tuple(s(a) for a in n.inputs))
                              for n in bwd.nodes)
    whole = Graph(fwd.inputs + bwd.inputs[nsaved:], nodes,
                  fwd.outputs[:nout] + tuple(s(a) for a in bwd.outputs),
                  f"grad_{graph.name}")
    return optimize(whole)


def report(graph: Graph, args=None, *, compare_xla: bool = False) -> CostReport:
    """The `CostReport` of `graph` (its run-time `args` for `compare_xla`
    and for the arguments' layout over devices)."""
    program = optimize(graph)
    gc = graph_cost(program)
    try:
        gp, why = gradient_program(program), None
    except SciadError as e:  # no reverse mode (a while loop without max_steps)
        gp, why = None, str(e).split("\n")[0]
    saved = _attribute_saved(gc.rows, gp, len(program.inputs)) if gp is not None else 0
    g_cost = graph_cost(gp) if gp is not None else None
    devices, args_bytes, per_device = _layout(args or ())
    rep = CostReport(program, gc.rows, gc.flops, gc.bytes, gc.peak, saved,
                     g_cost.flops if g_cost else None, g_cost.peak if g_cost else None,
                     no_gradient=why, devices=devices,
                     args_bytes=args_bytes if args else None,
                     args_bytes_per_device=per_device if args else None)
    if compare_xla:
        rep.xla["program"] = _xla_analysis(program, args)
        if gp is not None:
            cts = [np.ones(v.type.shape, v.type.dtype) for v in gp.inputs[len(args):]]
            rep.xla["gradient"] = _xla_analysis(gp, list(args) + cts)
    return rep


def steps_note(n: int | None, per: float) -> str:
    return f"{n} steps x {_si(per)}" if n is not None else f"per step ({_si(per)})"


__all__ = ["Cost", "CostReport", "GraphCost", "Row", "graph_cost", "nbytes", "report",
           "sparse_lu_fill", "Fill"]


def cost(f, *args, compare_xla: bool = False, **kwargs) -> CostReport:
    """What `f(*args, **kwargs)` costs, node by node, and what its gradient
    costs: FLOPs, bytes, the values reverse mode saves, and the peak memory
    of the program and of its reverse-mode program (under the loops'
    checkpoint schedules). Nothing runs, unless `compare_xla`.

    ```python
    print(sd.cost(loss, k, u0))
    ```

    **Arguments:**

    - `f`: a function written with sciad ops (traced on `args`), or a
      `Graph` (then `args` are its inputs' run-time values, needed only for
      `compare_xla`).
    - `compare_xla`: also compile the program and its gradient program and
      put XLA's own `cost_analysis()` and `memory_analysis()` in the report
      (`report.xla`). XLA counts a loop's body once, not per step, and
      reuses buffers, so its figures differ from these where loops run.
      With arguments laid out over several devices (sharded JAX arrays)
      it compiles the partitioned program, as `sd.function` would, and its
      figures are per device.

    Arguments laid out over several devices also add a `devices:` line:
    how many, and the most bytes of the arguments any one device holds
    (`report.devices`, `report.args_bytes_per_device`). The table's own
    figures are the whole program's, over all devices.

    **Returns:**

    A `CostReport`; `print` it for the table.
    """
    graph = f if isinstance(f, Graph) else trace(f, *args, **kwargs)
    leaves = list(args) if isinstance(f, Graph) else runtime_leaves((args, kwargs))
    return report(graph, leaves, compare_xla=compare_xla)


# the cost rule of the autodiff layer's own `jvp_primal` (free: it passes its operand on)
jvp_primal_p.def_cost(lambda node, body: Cost())
