"""Jacobians as nodes, for the rules that build them: a linear map batched
over a basis (`batched_map`: one graph of the size of one JVP or VJP,
whatever the number of columns), with forward mode's gauge checks, and a
sparse Jacobian's values by colored JVPs (or VJPs) on a known pattern
(`emit`, Curtis-Powell-Reid). `sciad.jacfwd`/`jacrev`, `sd.sparse.jacobian`
and the Newton solves of `optimize.root` are built on them.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import scipy.sparse as sp

from .. import _ops as ops
from ..errors import InvalidOptionError
from ..graph import Graph, TensorType, Zero
from ..graph._autodiff import jvp_eval, transpose_eval, type_of, vjp_eval
from ..graph._batch import batch_graph, batched_front
from ..graph._core import must_run
from ..graph._passes import dce
from ..graph._sparsity import graph_sparsity
from ..graph._trace import trace_flat
from ..graph._types import Pattern
from ..solvers._coloring import color_seeds, coloring
from ._newton_systems import _pattern
from ._sparse import assemble, gather


def unit_basis(t: TensorType):
    """The `t.size` unit vectors of type `t`, stacked along a leading axis:
    `eye(n)` reshaped to `(n,) + t.shape`, one node."""
    return ops.reshape(ops.eye(t.size, dtype=t.dtype), (t.size,) + tuple(t.shape))


def checks_cotangents(nodes) -> bool:
    """Whether `nodes` (their bodies included) hold one whose transpose
    checks its cotangents (`Primitive(checks_cotangents=True)`)."""
    return any(node.primitive.checks_cotangents or
               any(checks_cotangents(g.nodes) for g in node.subgraphs) for node in nodes)


def forward_checks(graph, n_linear: int, values: list) -> list:
    """Forward mode's gauge checks. `graph` is a tangent map, linear in its
    first `n_linear` inputs (`values`: the others). Where it holds nodes
    that check the cotangents they receive when transposed (the guards of
    eigendecompositions: a derivative must not depend on the basis chosen
    inside a cluster of repeated eigenvalues), the map is transposed once on
    a fixed random cotangent, which passes every guard with a check. A map
    that is gauge-invariant transposes every cotangent to a gauge-invariant
    one, and a map that is not does so for almost no cotangent, so this is
    the reverse-mode check applied to the forward computation (one extra
    transposed pass, only where such guards are). Returns the values to
    keep alive (`keep`) so that the checks run."""
    if not checks_cotangents(graph.nodes):
        return []
    rng = np.random.default_rng(0)
    cts = []
    for a in graph.outputs:
        t = a.type
        if isinstance(t, TensorType) and t.dtype.kind in "fc" and t.size:
            u = rng.standard_normal(t.shape)
            if t.dtype.kind == "c":
                u = u + 1j * rng.standard_normal(t.shape)
            cts.append(ops.asarray(u.astype(t.dtype)))
        else:
            cts.append(Zero(t.update()))
    in_cts = transpose_eval(graph, [True] * n_linear + [False] * len(values), values, cts)
    return [c if isinstance(type_of(c), TensorType) else gather(c)
            for c in in_cts if not isinstance(c, Zero)]


def keep(values: list, extra: list) -> list:
    """`values`, made to depend on `extra` so that neither sciad nor XLA
    drops `extra`'s computation (the checks in it): the first array of
    `values` gets `0 * s` added, `s` the sum of `extra` (0 where that is not
    finite), which leaves it unchanged (`x * 0` is never folded: NaN)."""
    arrays = [i for i, v in enumerate(values) if isinstance(type_of(v), TensorType)]
    if not extra or not arrays:
        return values
    s = sum(ops.sum(ops.real(e)) for e in extra)
    zero = ops.where(ops.isfinite(s), s, 0.0) * 0.0
    out = list(values)
    i = arrays[0]
    out[i] = out[i] + ops.astype(zero, type_of(out[i]).dtype)
    return out


def batched_map(fn: Callable, arg_type: TensorType, name: str,
                forward: bool = False, basis=None) -> list:
    """Traces `fn`, a linear map of one argument of type `arg_type` that
    returns a list of derivatives (arrays or `Zero`s), and emits it batched
    over the identity basis of `arg_type` (or over `basis`, a stack of
    vectors along a leading axis: a coloring's seeds). Returns one entry per result:
    `(value, batch_dim)`, or None where the result was a `Zero`. A
    `forward` (tangent) map gets forward mode's gauge checks
    (`forward_checks`)."""
    zero: list[bool] = []

    def nonzero(t):
        results = fn(t)
        zero.extend(isinstance(r, Zero) for r in results)
        return [r for r in results if not isinstance(r, Zero)]

    graph, _, _, captured = trace_flat(nonzero, (arg_type,), closure=True, name=name)
    graph = dce(graph)
    if all(zero) and not any(must_run(n) for n in graph.nodes):
        return [None] * len(zero)  # (else its checks run: a failed solve fails this map)
    res = batch_graph(graph, [unit_basis(arg_type) if basis is None else basis] + list(captured),
                      [0] + [None] * len(captured))
    if forward:
        kept = keep([v for v, _ in res], forward_checks(graph, 1, list(captured)))
        res = [(v, d) for v, (_, d) in zip(kept, res)]
    outs = iter(res)
    return [None if z else next(outs) for z in zero]


def jacobian_leaf(v, d, size: int, out_shape: tuple, in_shape: tuple, rows: bool):
    """A batched derivative `(v, d)` (batch dim `d`, `size` examples) as a
    Jacobian leaf of shape `out_shape + in_shape`. With `rows` (jacrev) the
    batch runs over the output's elements and goes first; otherwise
    (jacfwd) it runs over the input's elements and goes last."""
    if d is None:  # the same for every basis vector (a constant derivative)
        v, d = batched_front(v, d, size), 0
    to = 0 if rows else len(v.shape) - 1
    if d != to:
        v = ops.moveaxis(v, d, to)
    return ops.reshape(v, tuple(out_shape) + tuple(in_shape))


def dense_jacobian(graph: Graph, args: list, wrt: int):
    """The Jacobian of `graph`'s single output with respect to its input
    `wrt`, at `args`, dense (shape `output + input`): one JVP batched over
    the input's unit vectors (`jacfwd`'s)."""
    tx = type_of(args[wrt])
    to = graph.outputs[0].type
    zeros = [Zero(type_of(a).update()) for a in args]

    def tangents(t):
        ts = list(zeros)
        ts[wrt] = t
        return jvp_eval(graph, args, ts)[1]

    (col,) = (batched_map(tangents, tx.update(), "jacfwd_tangents", forward=True)
              if tx.size else [None])
    shape = tuple(to.shape) + tuple(tx.shape)
    return (ops.zeros(shape, to.dtype) if col is None else
            jacobian_leaf(*col, tx.size, to.shape, tx.shape, rows=False))


class Structure(NamedTuple):
    """A Jacobian's pattern and the coloring its values are computed with."""

    pattern: Pattern
    colors: np.ndarray  # per column (rows=False) or per row (rows=True)
    rows: bool

    @property
    def n_colors(self) -> int:
        return int(self.colors.max(initial=-1)) + 1


def structure_of(pattern: sp.csr_matrix, mode: str = "auto") -> Structure:
    """The coloring of `pattern` that takes fewer products: columns (JVPs),
    or rows (VJPs) where that needs fewer colors (`mode="auto"`); or the one
    `mode` names (`"forward"`, `"reverse"`)."""
    if mode not in ("auto", "forward", "reverse"):
        raise InvalidOptionError(f"`mode` must be 'auto', 'forward' or 'reverse', got {mode!r}.",
                                 op="sparse.jacobian")
    pat = _pattern(pattern)
    cols = coloring(pat) if mode != "reverse" else None
    rows = coloring(pat, rows=True) if mode == "reverse" or (
        mode == "auto" and pat.shape[0] < pat.shape[1]) else None
    if cols is None or (rows is not None and rows.max(initial=-1) < cols.max(initial=-1)):
        return Structure(pat, rows, True)
    return Structure(pat, cols, False)


def emit(graph: Graph, args: list, wrt: int, st: Structure):
    """The Jacobian of `graph`'s single output with respect to its input
    `wrt`, at `args`, as a traced sparse matrix on `st.pattern`: one batched
    JVP (or VJP) over the colors' seeds."""
    tx = type_of(args[wrt])
    to = graph.outputs[0].type
    m, n = st.pattern.shape
    c = st.n_colors
    dtype = np.result_type(tx.dtype, to.dtype)
    if st.pattern.nnz == 0 or c == 0:
        return assemble(ops.zeros((st.pattern.nnz,), dtype), st.pattern)
    k = np.arange(st.pattern.nnz)
    rows, cols = st.pattern.rows, st.pattern.indices
    if not st.rows:
        seeds = color_seeds(st.colors, n, tx.dtype)
        zeros = [Zero(type_of(a).update()) for a in args]

        def products(t):
            tangents = list(zeros)
            tangents[wrt] = t
            return jvp_eval(graph, args, tangents)[1]

        seeded = ops.asarray(seeds.reshape((c,) + tuple(tx.shape)))
        (res,) = batched_map(products, tx.update(), "jacobian_colors", forward=True,
                             basis=seeded)
        where = st.colors[cols] * m + rows
        size = m
    else:
        seeds = color_seeds(st.colors, m, to.dtype)
        _, backward = vjp_eval(graph, args)

        def products(ct):
            return [backward([ct])[wrt]]

        seeded = ops.asarray(seeds.reshape((c,) + tuple(to.shape)))
        (res,) = batched_map(products, to.update(), "jacobian_colors", basis=seeded)
        where = st.colors[rows] * n + cols
        size = n
    if res is None:  # the output does not depend on the input
        data = ops.zeros((st.pattern.nnz,), dtype)
    else:
        v, d = res
        if d is None:
            v, d = batched_front(v, d, c), 0
        if d != 0:
            v = ops.moveaxis(v, d, 0)
        data = ops.take(ops.reshape(v, (c * size,)), where[k])
    return assemble(data, st.pattern)


def colored_jacobian(f: Callable, *args):
    """`sd.sparse.jacobian(f)(*args)` inside a trace, for rules: the
    Jacobian of `f` (one array out) in its first argument (one array, the
    others held fixed), as a traced sparse matrix on the pattern detected
    from `f`'s graph, colored as `mode="auto"` colors it."""
    x, rest = args[0], list(args[1:])
    graph, _, _, captured = trace_flat(lambda xi: f(xi, *rest), (x,), closure=True,
                                       name=getattr(f, "__name__", "f"))
    pattern = graph_sparsity(graph, [True] + [False] * len(captured))
    return emit(graph, [x] + list(captured), 0, structure_of(pattern))
