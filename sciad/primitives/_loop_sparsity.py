"""The sparsity rule of a loop body (`sd.sparse.jacobian_sparsity`),
shared by `scan` and `while`."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..graph import Graph
from ..graph._sparsity import (Deps, any_slice, pad_columns, select_rows, sparsity_eval,
                               substitute, symbolic_slices, union, value_shape)


# ---------------------------------------------------------------------------
# sparsity (`sd.sparse.jacobian_sparsity`)
#
# A loop's patterns come from interpreting its body step after step, the
# per-step inputs as symbolic columns (`symbolic_slices`), so that each
# step's outputs depend on the slice of `xs` that step reads, not on all of
# them. A scan of at most `SPARSITY_STEPS` steps is followed exactly, one
# step after another (a stencil's band grows one step at a time), stopping
# early where the carries' patterns stop changing. The values of carries
# that are constants (a `fori_loop`'s index) are followed too, so a step
# reading `x[i]` reads that element, not any. A `while` loop is followed
# exactly as long as its predicate's value is a constant (a loop counting
# its steps), and stops where it is false. A longer scan, and a `while`
# loop whose predicate reads the data (it may stop after any step),
# iterate the union of the carries' patterns (a slice read: any of them;
# a carry's value kept only where it is the same at every step) to its
# fixed point, which is monotone and so holds after every step; past
# `SPARSITY_STEPS` iterations without one, every output depends on every
# operand.

#: the most steps a loop's sparsity rule interprets its body for
SPARSITY_STEPS = 100


def loop_sparsity(body: Graph, consts, init, xs, steps: int | None, *, exact: bool,
                  reverse: bool = False, cond: Graph | None = None):
    """The patterns of a loop's final carries and stacked per-step outputs,
    from the `Deps` of its consts, initial carries and stacked per-step
    inputs: `(carries, ys)` (CSR matrices), or None past `SPARSITY_STEPS`
    without a fixed point. `steps`: the body's applications (at most, where
    not `exact`: a `while` loop's `max_steps`, or None). `cond`: a `while`
    loop's predicate `(*consts, *carry) -> (bool,)`."""
    nc, nk = len(consts), len(init)
    n = (list(consts) + list(init) + list(xs))[0].columns
    length = steps or 0
    shapes = [value_shape(v.type) for v in body.inputs[nc + nk:]]
    x_in, x_rows = symbolic_slices(xs, length, shapes, n)
    K = int(sum(d.size for d in x_in))
    c_in = [pad_columns(d, K) for d in consts]
    carry_shapes = [d.shape for d in init]
    carries = [d.matrix for d in init]
    values = [d.value for d in init]
    follow = exact and steps is not None and steps <= SPARSITY_STEPS
    limit = steps if follow else min(SPARSITY_STEPS, SPARSITY_STEPS if steps is None else steps)
    known = cond is not None  # the predicate's value is a constant so far
    records, fixed = [], False
    for i in range(limit):
        ins = [pad_columns(Deps(c, s, v), K) for c, s, v in zip(carries, carry_shapes, values)]
        if known:
            (pred,) = sparsity_eval(cond, c_in + ins)
            known = pred.value is not None
            if known and not bool(pred.value):
                fixed = True  # the loop stops here
                break
        res = sparsity_eval(body, c_in + ins + x_in)
        records.append([r.matrix for r in res[nk:]])
        # whatever slice the later steps read, their carries stay within these
        grown = [union(c, any_slice(r.matrix, n, x_rows)) for c, r in zip(carries, res[:nk])]
        new = [r.value for r in res[:nk]]
        still = all(g.nnz == c.nnz for g, c in zip(grown, carries))
        fixed = still and all(_same_value(a, b) for a, b in zip(values, new))
        if still and not fixed and nk == len(body.outputs):
            # the patterns hold still but a carry's value moves (a loop's
            # index): they hold for any value of it if a step with it
            # unknown grows nothing (a loop with per-step outputs follows
            # on, to keep theirs exact)
            generic = [a if _same_value(a, b) else None for a, b in zip(values, new)]
            res = sparsity_eval(body, c_in + [pad_columns(Deps(c, s, v), K) for c, s, v in
                                              zip(carries, carry_shapes, generic)] + x_in)
            fixed = all(union(c, any_slice(r.matrix, n, x_rows)).nnz == c.nnz
                        for c, r in zip(carries, res[:nk]))
        if fixed:
            break
        if follow or known:  # step `i` reads its own slice
            p = length - 1 - i if reverse else i
            rows = select_rows(x_rows, p * K + np.arange(K))
            carries = [substitute(r.matrix, n, rows, 1) for r in res[:nk]]
            values = new
        else:
            carries = grown
            values = [a if _same_value(a, b) else None for a, b in zip(values, new)]
    if not fixed and not (steps is not None and limit == steps):
        return None
    ys = []
    for j, v in enumerate(body.outputs[nk:]):
        m = int(np.prod(value_shape(v.type), dtype=np.int64))
        if not length:
            ys.append(sp.csr_matrix((0, n), dtype=bool))
            continue
        # step `s` reads slice `p(s)` and sees the carries of record `min(s, last)`
        blocks, dest, last = [], [], len(records) - 1
        for r, rec in enumerate(records):
            step = np.arange(r, length if r == last else r + 1, dtype=np.int64)
            p = length - 1 - step if reverse else step
            rows = select_rows(x_rows, (p[:, None] * K + np.arange(K)).ravel())
            blocks.append(substitute(rec[j], n, rows, p.size))
            dest.append((p[:, None] * m + np.arange(m)).ravel())
        stacked = sp.vstack(blocks, format="csr") if len(blocks) > 1 else blocks[0]
        ys.append(select_rows(stacked, np.argsort(np.concatenate(dest), kind="stable")))
    return carries, ys


def _same_value(a, b) -> bool:
    """Whether two carry values (arrays, or None where not constant) agree."""
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(a, b)
