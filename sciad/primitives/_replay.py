"""Replaying a checkpoint schedule: the backward pass of a checkpointed scan
(`scan_adjoint`) as a few plain loops.

A schedule (`Binomial`, `EveryK`) gives its actions as rows (see
`revolve_actions`): store the carry in a slot, advance it some steps, load a
slot, run the backward part of a step. Run one row per iteration of a loop,
they cost a loop iteration, a switch and a select over the carry each,
about four per step, and every backward part recomputes its step's forward
part, which for a cheap step is most of the time. Here the rows are
compiled once (per schedule and length, in NumPy) into *runs*:

- a run loads a stored carry (the one at step `lo`) and advances it to step
  `r0`, storing on the way the carries that later runs load;
- advances on to step `hi`, keeping each step's *residuals* (the values its
  backward part reads, `split_step`): the steps from `r0` to `hi` are those
  whose backward parts the schedule runs next;
- runs those backward parts, last to first, from the kept residuals.

The program is one loop over the runs with a few loops inside: for
periodic checkpointing (`EveryK`) the nested loops one would write by hand,
for the binomial schedule the same with the runs revolve chooses. The
first run's stores can be made by the forward pass itself (`Runs.forward`),
so that the backward pass does not run the loop forward once more first.

Memory. The stored carries and the kept residuals share one buffer of
carry-sized *cells*: a run keeps its residuals in the first cells (a fixed
place, which the loops index fastest), and a stored carry takes the highest
cell free from its store to the last run that loads it. A carry the
schedule stores only for the backward parts that follow at once is not
stored: its step's residuals are. So the replay holds at most one cell more
than the schedule holds carries, and a scratch cell. A step's residuals go
in a cell where, dtype by dtype, they have no more elements than the
carry; otherwise the cell holds the carry itself and the backward part
recomputes the forward part from it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..graph import Graph, TensorType
from ..graph._autodiff import split_graph
from ..graph._body import invariant_nodes, live_inputs, permute
from ..graph._passes import cse, dce


class Runs(NamedTuple):
    """A schedule compiled into runs (NumPy int32 arrays).

    - `runs[r] = (load, lo, r0, hi, store_at, num_stores)`: run `r` loads
      cell `load`, which holds the carry at step `lo`; advances it to step
      `r0`, writing the carry at step `stores[store_at + i, 0]` to cell
      `stores[store_at + i, 1]` on the way (`i < num_stores`); advances on
      to `hi`, writing the residuals of step `hi - j` to cell `j`; then runs
      the backward parts of steps `hi` down to `r0`.
    - `cells`: the cells the runs use; one more, the last, is a scratch cell.
    - `start`: the cell run 0 loads: the initial carry, or, where a forward
      pass made run 0's stores, the carry at run 0's `r0`.
    - `forward[t]`: the cell a forward pass writes the carry at step `t` to
      so as to make run 0's stores and its start (the scratch cell for the
      other steps). Run 0 then starts at its `r0`, without stores.
    """

    runs: np.ndarray
    stores: np.ndarray
    forward: np.ndarray
    cells: int
    start: int

    def stored(self) -> np.ndarray:
        """`runs`, with run 0 starting from the cells a forward pass wrote."""
        runs = self.runs.copy()
        if len(runs):
            runs[0, 1], runs[0, 5] = runs[0, 2], 0
        return runs


def compile_runs(rows: np.ndarray, length: int) -> Runs:
    """The runs that do what the action `rows` do (kinds: 0 store in slot `a`,
    1 advance from step `a` to `b`, 2 load slot `a`, 3 backward part of step
    `a`, the carry being that step's input), on `length` steps."""
    pos_of: list[int] = [0]  # stored carry -> its step; carry 0 is the initial one
    holds: dict[int, int] = {}  # the schedule's slot -> the stored carry in it
    runs: list[list] = []  # [carry loaded, lo, r0, hi, carries stored]
    pos, load, kept, advanced = 0, 0, [], False
    for kind, a, b in rows.tolist():
        if kind == 0:
            holds[a] = len(pos_of)
            kept.append(len(pos_of))
            pos_of.append(pos)
        elif kind == 1:
            assert pos == a and b > a, f"replay: an advance from {a} with the carry at {pos}"
            pos, advanced = b, True
        elif kind == 2:
            assert not advanced and not kept, "replay: a load after an advance or a store"
            load = holds[a]
            pos = pos_of[load]
        else:
            assert pos == a, f"replay: the backward part of step {a} with the carry at {pos}"
            last = runs[-1] if runs else None
            if (last is not None and not advanced and not kept and pos_of[load] == a
                    and last[2] - 1 == a >= last[1]):
                last[2] = a  # the run goes on: it has passed step a and kept its residuals
            else:
                runs.append([load, pos_of[load], a, a, kept])
            pos, kept, advanced = None, [], False
    # A stored carry needs a cell from its store to the last run that loads
    # it; the others (those the schedule keeps for the backward parts that
    # follow at once) are not stored: those steps' residuals are. A run keeps
    # them in the first cells (those of steps `hi, hi - 1, ...` in cells `0,
    # 1, ...`: a fixed place, which the loops index fastest) and the stored
    # carries fill the cells from the last one down, each taking the highest
    # free cell.
    last_load = {0: 0}
    for r, run in enumerate(runs):
        last_load[run[0]] = r
    live: dict[int, int] = {}  # stored carry -> its place, counted from the last cell

    def take(c: int) -> int:
        used = set(live.values())
        live[c] = next(i for i in range(len(used) + 1) if i not in used)
        return live[c]

    table, stores, ncells, start = [], [], 1, 0
    for r, (c, lo, r0, hi, stored) in enumerate(runs):
        load = live[c] if r > 0 else None
        if last_load[c] == r and r > 0:
            del live[c]
        n_before = len(stores)
        for s in stored:
            if last_load.get(s, -1) > r:
                assert lo <= pos_of[s] < r0, "replay: a carry loaded later is kept in a run"
                stores.append((pos_of[s], take(s)))
        if r == 0:
            # run 0 starts from the initial carry, or from the carry at r0 that a
            # forward pass making run 0's stores writes after them: a cell apart
            load = start = take(c)
            del live[c]
        ncells = max(ncells, max(live.values(), default=-1) + 1 + hi - r0 + 1)
        table.append((load, lo, r0, hi, n_before, len(stores) - n_before))
    last = ncells - 1
    as_array = functools.partial(np.asarray, dtype=np.int32)
    table = as_array(table).reshape(-1, 6)
    table[:, 0] = last - table[:, 0]
    stores = as_array(stores).reshape(-1, 2)
    stores[:, 1] = last - stores[:, 1]
    forward = np.full(length, ncells, np.int32)
    if len(table):
        first = stores[:table[0, 5]]
        forward[first[:, 0]] = first[:, 1]
        forward[table[0, 2]] = last - start
    return Runs(table, stores, forward, ncells, last - start)


# ---------------------------------------------------------------------------
# residuals


class Split(NamedTuple):
    """A backward step split into the residuals it reads and the rest.

    `residuals: (*consts, *carry, *x) -> (*res)` (a `Graph`) gives the values
    to keep per step; `backward: (*saved, *acc, *ct_y) -> (*acc, *ct_x)`
    (a `Graph`) the backward part, where `saved[i]` is `where[i] = ("res",
    j)` (a kept residual), `("const", j)`, `("x", j)` (the step's slice of
    per-step input `j`) or `("once", j)` (output `j` of `once: (*consts) ->
    (...)`, the same at every step, computed once)."""

    residuals: Graph
    backward: Graph
    where: tuple
    once: Graph | None


def _elements(types) -> dict:
    """Elements per dtype of values of `types`."""
    out: dict = {}
    for t in types:
        out[t.dtype] = out.get(t.dtype, 0) + int(np.prod(t.shape, dtype=np.int64))
    return out


@functools.lru_cache(maxsize=64)
def split_step(step: Graph, nc: int, nk: int, nx: int, nacc: int) -> Split:
    """The residuals of a `scan_adjoint` step (`(*consts, *acc, *carry, *x,
    *ct_y) -> (*acc, *ct_x)`, its forward part recomputed): the values its
    backward part reads that change from step to step, if they are arrays
    that fit in a carry's cell (dtype by dtype no more elements than the
    carry); else the carry itself (the backward part then recomputes the
    forward part from it)."""
    n = len(step.inputs)
    order = (list(range(nc)) + list(range(nc + nacc, nc + nacc + nk + nx))
             + list(range(nc, nc + nacc)) + list(range(nc + nacc + nk + nx, n)))
    whole = dce(cse(permute(step, inputs=order)))  # (*consts, *carry, *x, *acc, *ct_y)
    vg = split_graph(whole, nc + nk + nx, 0)
    fwd = vg.forward
    inputs = {v: i for i, v in enumerate(fwd.inputs)}
    invariant = set(fwd.inputs[:nc])
    for node, inv in zip(fwd.nodes, invariant_nodes(fwd, nc)):
        if inv:
            invariant.update(node.outputs)
    where, res, once = [], [], []
    for v in fwd.outputs:
        i = inputs.get(v)
        if i is not None and i < nc:
            where.append(("const", i))
        elif i is not None and i >= nc + nk:
            where.append(("x", i - nc - nk))
        elif v in invariant:
            where.append(("once", len(once)))
            once.append(v)
        else:
            where.append(("res", len(res)))
            res.append(v)
    carries = whole.inputs[nc:nc + nk]
    cell = _elements(v.type for v in carries)
    if not all(isinstance(v.type, TensorType) for v in res) or any(
            m > cell.get(d, 0) for d, m in _elements(v.type for v in res).items()):
        # keep the carry; the backward part recomputes the forward part
        ident = Graph(whole.inputs[:nc + nk + nx], (), carries, "carry")
        return Split(ident, whole, tuple([("const", i) for i in range(nc)]
                                         + [("res", i) for i in range(nk)]
                                         + [("x", i) for i in range(nx)]), None)
    residuals = fwd.replace(outputs=tuple(res), name=f"{step.name}_residuals")
    once_graph = None
    if once:
        g, used = live_inputs(fwd.replace(outputs=tuple(once)), [True] * len(once))
        assert not any(used[nc:]), "replay: a value computed once reads the carry"
        once_graph = g.replace(inputs=g.inputs[:nc], name=f"{step.name}_once")
    return Split(residuals, vg.backward, tuple(where), once_graph)


def _packing(cell_types, value_types):
    """How values of `value_types` lie in a cell of `cell_types` (a carry):
    dtype by dtype, the values' elements one after another from the start of
    the cell's elements of that dtype (the cell's arrays of it, one after
    another). Returns `(touched, pack, unpack)`: the positions of the cell's
    arrays the values reach (only those are written and read), `pack(values)
    -> arrays` for those positions and `unpack(arrays) -> values`."""
    if tuple(value_types) == tuple(cell_types):
        return tuple(range(len(cell_types))), tuple, tuple

    def size(t) -> int:
        return int(np.prod(t.shape, dtype=np.int64))

    touched: list[int] = []
    for d, m in _elements(value_types).items():
        k = 0
        for i, t in enumerate(cell_types):
            if t.dtype == d and k < m:
                touched.append(i)
                k += size(t)
    touched.sort()
    cells = {d: [i for i in touched if cell_types[i].dtype == d] for d in
             _elements(value_types)}

    def pack(values):
        out = {}
        for d, idx in cells.items():
            v = jnp.concatenate([jnp.ravel(x) for x, t in zip(values, value_types)
                                 if t.dtype == d])
            n = sum(size(cell_types[i]) for i in idx)
            v, k = jnp.concatenate([v, jnp.zeros((n - v.shape[0],), d)]), 0
            for i in idx:
                out[i] = v[k:k + size(cell_types[i])].reshape(cell_types[i].shape)
                k += size(cell_types[i])
        return tuple(out[i] for i in touched)

    def unpack(arrays):
        at = dict(zip(touched, arrays))
        out = [None] * len(value_types)
        for d, idx in cells.items():
            v, k = jnp.concatenate([jnp.ravel(at[i]) for i in idx]), 0
            for j, t in enumerate(value_types):
                if t.dtype == d:
                    out[j] = v[k:k + size(t)].reshape(t.shape)
                    k += size(t)
        return tuple(out)

    return tuple(touched), pack, unpack


# ---------------------------------------------------------------------------
# the replay


def replay(runs: Runs, index, advance, residuals, backward, start,
           carry_types, res_types, acc0, ct_xs, *, stored=None):
    """The backward pass of a scan's steps on the schedule compiled into
    `runs`: the `t`-th step the loop runs (from 0) reads slice `index(t)` of
    the per-step inputs (`t` for a forward scan of all its steps;
    `length - 1 - t` for a reverse one; offset for a stretch of the loop).

    `advance(k, carry) -> carry` runs the forward step that reads slice `k`
    of the per-step inputs, `residuals(k, carry) -> res` gives what that
    step's backward part reads (`res_types`), and `backward(k, res, acc) ->
    (acc, ct_x)` runs it: `acc` is the backward pass's own carry (the
    carries' cotangents and the consts' sums), `ct_x` the step's per-step
    outputs. `start`: the initial carry (a tuple of arrays of
    `carry_types`); `ct_xs`: zeros for the stacked `ct_x`s. `stored`: the
    cells (a tuple of arrays, one per carry, of `runs.cells + 1` rows) as a
    forward pass wrote them (`Runs.forward`), or None. Returns `(acc,
    ct_xs)`."""
    table = jnp.asarray(runs.runs if stored is None else runs.stored())
    stores = jnp.asarray(runs.stores if len(runs.stores) else np.zeros((1, 2), np.int32))
    touched, pack, unpack = _packing(tuple(carry_types), tuple(res_types))

    def put(buf, vals, i):
        return tuple(jax.lax.dynamic_update_index_in_dim(s, v, i, 0)
                     for s, v in zip(buf, vals))

    def get(buf, i):
        return tuple(jax.lax.dynamic_index_in_dim(s, i, 0, keepdims=False) for s in buf)

    def put_kept(buf, vals, i):  # residuals: into the arrays of the cell they reach
        new = dict(zip(touched, put([buf[j] for j in touched], vals, i)))
        return tuple(new.get(j, s) for j, s in enumerate(buf))

    def get_kept(buf, i):
        return get([buf[j] for j in touched], i)

    def forward(lo, hi, carry):
        return jax.lax.fori_loop(lo, hi, lambda t, c: advance(index(t), c), carry)

    def one_run(r, state):
        buf, acc, ct_xs = state
        load, lo, r0, hi, store_at, num_stores = (table[r, j] for j in range(6))

        def store(i, st):  # advance to the next carry to store, and store it
            carry, buf, p = st
            at, cell = stores[store_at + i, 0], stores[store_at + i, 1]
            carry = forward(p, at, carry)
            return carry, put(buf, carry, cell), at

        carry, buf, p = jax.lax.fori_loop(0, num_stores, store, (get(buf, load), buf, lo))
        carry = forward(p, r0, carry)

        def keep(t, st):  # advance, keeping each step's residuals
            carry, buf = st
            k = index(t)
            res = pack(residuals(k, carry))
            return advance(k, carry), put_kept(buf, res, hi - t)

        carry, buf = jax.lax.fori_loop(r0, hi, keep, (carry, buf))
        buf = put_kept(buf, pack(residuals(index(hi), carry)), 0)

        def back(j, st):
            acc, ct_xs = st
            k = index(hi - j)
            acc, ct_x = backward(k, unpack(get_kept(buf, j)), acc)
            return acc, tuple(jax.lax.dynamic_update_index_in_dim(s, v, k, 0)
                              for s, v in zip(ct_xs, ct_x))

        acc, ct_xs = jax.lax.fori_loop(0, hi - r0 + 1, back, (acc, ct_xs))
        return buf, acc, ct_xs

    if stored is None:
        buf = tuple(jnp.zeros((runs.cells + 1,) + t.shape, t.dtype) for t in carry_types)
        buf = put(buf, start, runs.start)
    else:
        buf = tuple(stored)
    _, acc, ct_xs = jax.lax.fori_loop(0, table.shape[0], one_run, (buf, acc0, ct_xs))
    return acc, ct_xs
