"""Rules shared by the loop nodes (`scan`, `scan_adjoint`, `while`):
the grouped JVP of a body, the cotangent plan and the one-step VJP of a
reverse pass, and the linearity and transposed step of a loop in a
tangent map. Bodies follow the closed-body convention (`graph/_body.py`):
`(*consts, *carry, *x) -> (*carry, *y)`.
"""

from __future__ import annotations

from typing import Sequence


from ..errors import ShapeError
from ..graph import Graph, TensorType, Var, Zero
from ..graph import is_differentiable, is_zero
from ..graph import add_tangents, instantiate, transpose_eval
from ..graph._autodiff import (active_values, graph_linear_outputs, jvp_primal, known_zero,
                               needs_ct, type_of, vjp_eval)
from ..graph._body import jvp_body, nonlinear_body, permute, trace_body



# -- forward mode -----------------------------------------------------------


def grouped_jvp(graph: Graph, nz: Sequence[bool], in_sizes: Sequence[int],
                out_sizes: Sequence[int], force: Sequence[bool]):
    """The JVP of a body, its inputs and outputs grouped by the closed-body
    convention: each group's primals, then the tangents of its members
    flagged nonzero (inputs: `nz`; outputs: not symbolically zero, or
    `force`d). Returns `(graph, out_nz)`."""
    jg, out_nz = jvp_body(graph, nz, instantiate=force)
    return permute(jg, inputs=_group_order(nz, in_sizes),
                   outputs=_group_order(out_nz, out_sizes)), out_nz


def _group_order(nz, sizes) -> list[int]:
    n = len(nz)
    tpos, k = {}, n
    for i in range(n):
        if nz[i]:
            tpos[i] = k
            k += 1
    order, lo = [], 0
    for size in sizes:
        order += list(range(lo, lo + size)) + [tpos[i] for i in range(lo, lo + size)
                                               if nz[i]]
        lo += size
    return order


def loop_body_jvp(body: Graph, nc: int, nk: int, nz: list[bool]):
    """The JVP of a scan body, grouped `(consts, dconsts, carry, dcarry, xs,
    dxs) -> (carry, dcarry, ys, dys)`; a carry's tangent is present where it
    is not zero at the fixed point of the loop."""
    nz = [bool(z) and is_differentiable(v.type) for z, v in zip(nz, body.inputs)]
    n, nout = len(body.inputs), len(body.outputs)
    sizes_in, sizes_out = (nc, nk, n - nc - nk), (nk, nout - nk)
    while True:
        force = nz[nc:nc + nk] + [False] * (nout - nk)
        jg, out_nz = grouped_jvp(body, nz, sizes_in, sizes_out, force)
        carry_nz = [a or b for a, b in zip(nz[nc:nc + nk], out_nz[:nk])]
        if carry_nz == nz[nc:nc + nk]:
            return jg, nz, out_nz
        nz[nc:nc + nk] = carry_nz


# -- reverse mode ---------------------------------------------------------------


def body_wrt(body: Graph, nc: int, nk: int, primals) -> list[bool]:
    """The body inputs a reverse pass through the loop differentiates: the
    consts and per-step inputs that need cotangents, and the carries that do
    or that such a value reaches over the steps. The body's VJPs form
    cotangents for these only (a const held fixed gets none, so `u ** c`
    forms no `log(u)`)."""
    flags = [needs_ct(p) for p in primals]
    carry = flags[nc:nc + nk]
    while True:
        wrt = flags[:nc] + carry + flags[nc + nk:]
        active = active_values(body, wrt)
        new = [c or (isinstance(o, Var) and o in active)
               for c, o in zip(carry, body.outputs[:nk])]
        if new == carry:
            return wrt
        carry = new


def assemble_cts(primals, nc, nk, ct_carry_idx, acc_idx, x_idx, out):
    n_ctc, n_acc = len(ct_carry_idx), len(acc_idx)
    in_cts: list = [None] * len(primals)
    for i, c in zip(ct_carry_idx, out[:n_ctc]):
        in_cts[nc + i] = c
    for i, c in zip(acc_idx, out[n_ctc:n_ctc + n_acc]):
        in_cts[i] = c
    for i, c in zip(x_idx, out[n_ctc + n_acc:]):
        if needs_ct(primals[i]):
            in_cts[i] = c
    return tuple(in_cts)


def check_storable(body: Graph, nc: int, nk: int) -> None:
    """Reverse mode that stores carries (every step's, or checkpoints) needs
    arrays there."""
    for v in body.inputs[nc:nc + nk]:
        if not isinstance(v.type, TensorType):
            raise ShapeError(f"reverse mode through this scan stores its carries; a carry "
                             f"of type {v.type.str_short()} cannot be stored. Make it an "
                             "array, or a const of the loop.", op="scan")


def ct_inits(primals, cts, ct_carry_idx, acc_idx):
    """The backward loop's initial carries: the final carries' cotangents, and
    zeros for the sums of the consts' cotangents."""
    return ([instantiate(cts[i]) for i in ct_carry_idx],
            [instantiate(Zero(type_of(primals[i]).update())) for i in acc_idx])


def step_vjp_graph(body: Graph, nc: int, nk: int, ct_carry_idx, acc_idx, cty_idx, x_idx):
    """The backward part of one step, with the step's forward part recomputed:
    `(*consts, *ct_carry, *acc, *carry, *x, *ct_y) -> (*ct_carry, *acc, *ct_x)`
    (cotangents of the carries flagged in `ct_carry_idx`, sums of the consts'
    in `acc_idx`, `ct_y` for the outputs in `cty_idx`)."""
    types = ([v.type for v in body.inputs[:nc]]
             + [body.inputs[nc + i].type.update() for i in ct_carry_idx]
             + [body.inputs[i].type.update() for i in acc_idx]
             + [v.type for v in body.inputs[nc:]]
             + [body.outputs[i].type.update() for i in cty_idx])
    n_ctc, n_acc = len(ct_carry_idx), len(acc_idx)
    nout = len(body.outputs)
    # the inputs whose cotangents are formed: no rule works for the others
    wrt = ([i in acc_idx for i in range(nc)] + [i in ct_carry_idx for i in range(nk)]
           + [i in x_idx for i in range(nc + nk, len(body.inputs))])

    def step(*args):
        consts = args[:nc]
        ctc = args[nc:nc + n_ctc]
        acc = args[nc + n_ctc:nc + n_ctc + n_acc]
        k = nc + n_ctc + n_acc
        rest = args[k:k + len(body.inputs) - nc]
        cty = args[k + len(body.inputs) - nc:]
        _, backward = vjp_eval(body, list(consts) + list(rest), wrt)
        ct = [Zero(body.outputs[i].type.update()) for i in range(nout)]
        for i, c in zip(ct_carry_idx, ctc):
            ct[i] = c
        for i, c in zip(cty_idx, cty):
            ct[i] = c
        in_cts = backward(ct)
        return ([instantiate(in_cts[nc + i]) for i in ct_carry_idx]
                + [a + instantiate(in_cts[i]) for a, i in zip(acc, acc_idx)]
                + [instantiate(in_cts[i]) for i in x_idx])

    g, bconsts, _ = trace_body(step, types, name=f"{body.name}_step_vjp")
    assert not bconsts, "a body's step VJP closes over nothing"
    return g


def ct_plan(body, nc, nk, primals, cts):
    """Which cotangents the backward loop carries, sums and emits: of the
    active carries (`body_wrt`), of the consts that need them, of the
    nonzero per-step outputs given, of the per-step inputs that need them."""
    wrt = body_wrt(body, nc, nk, primals)
    diff_in = [i for i, v in enumerate(body.inputs) if is_differentiable(v.type) and wrt[i]]
    ct_carry_idx = [i for i in range(nk) if is_differentiable(body.outputs[i].type)
                    and wrt[nc + i]]
    acc_idx = [i for i in diff_in if i < nc]
    cty_idx = [i for i in range(nk, len(body.outputs))
               if is_differentiable(body.outputs[i].type) and not is_zero(cts[i])]
    x_idx = [i for i in diff_in if i >= nc + nk]
    return ct_carry_idx, acc_idx, cty_idx, x_idx


def split_grouped(out, types, sizes):
    """The primal outputs and their tangents (symbolic zeros where a type is
    not differentiable) of a node whose outputs are grouped as `grouped_jvp`
    orders them: each group's primals, then its differentiable members'
    tangents."""
    outs, touts, k, lo = [], [], 0, 0
    for size in sizes:
        # (the primal results come out of the node that computes their
        # tangents: marked for transposition, see `jvp_primal`)
        outs += [jvp_primal(o) if is_differentiable(t) else o
                 for o, t in zip(out[k:k + size], types[lo:lo + size])]
        k += size
        for t in types[lo:lo + size]:
            if is_differentiable(t):
                touts.append(out[k])
                k += 1
            else:
                touts.append(Zero(t.update()))
        lo += size
    return tuple(outs), tuple(touts)


def with_unused_inputs(graph: Graph, at: int, types) -> Graph:
    new = tuple(Var(t) for t in types)
    return graph.replace(inputs=graph.inputs[:at] + new + graph.inputs[at:])


# ---------------------------------------------------------------------------
# transposition: a scan in a tangent map
#
# The JVP of a scan is a scan carrying primals and tangents, linear in its
# tangent operands; forward mode's gauge checks transpose it (as does the
# VJP derived from a JVP). Its transpose runs the primal part forward
# (`nonlinear_body`), stacking the primal carries each step starts from,
# then the body's transpose (`transpose_body`: the step's primal part
# recomputed, its tangent part transposed node by node) in reverse, carrying
# the linear carries' cotangents and the sums of the linear consts'. With a
# checkpoint schedule the two are one `scan_adjoint` node on that schedule.


def loop_linearity(body: Graph, linear: Sequence[bool], nc: int, nk: int):
    """`(linear, out_linear)`: the flags of a loop body's inputs, its carries
    made linear where the body makes them depend on a linear input (to a
    fixed point), and which of its outputs then depend on linear inputs. A
    carry that becomes linear from an initial value that is not is a tangent
    carry started from zeros (a JVP instantiates a symbolic zero there); the
    map is linear only if that value is zero, and its start is taken so."""
    lin = list(linear)
    while True:
        out = graph_linear_outputs(body, lin)
        new = [a or b for a, b in zip(lin[nc:nc + nk], out[:nk])]
        if new == lin[nc:nc + nk]:
            return lin, out
        lin[nc:nc + nk] = new


def check_zero_starts(args, linear, lin, nc: int, nk: int, op: str) -> None:
    """A carry that a loop's transpose takes as linear from a start that is
    not a linear operand must start from zero (`loop_linearity`): else the
    loop is not linear, and the transpose would be silently wrong."""
    for k in range(nk):
        if lin[nc + k] and not linear[nc + k]:
            assert known_zero(args[nc + k]), (
                f"{op}: transposing a loop whose carry {k} depends on the tangents but "
                "starts from a value not known to be zero; this is a bug in sciad.")


def transposed_step(body: Graph, lin: Sequence[bool], given: Sequence[int], nc: int,
                    nk: int):
    """The two bodies of a loop's transpose, for a body `(*consts, *carry, *x)
    -> (*carry, *y)` with inputs flagged `lin` (`loop_linearity`) and
    cotangents for its outputs `given` (indices): `fb`, the primal step
    `(*consts, *carry, *x) -> (*carry)` over the inputs not flagged, and `st`,
    the transposed step `(*consts, *ct_carry, *acc, *carry, *x, *ct_y) ->
    (*ct_carry, *acc, *ct_x)` over those and the linear carries'
    cotangents, the sums of the linear consts' and the linear `x`s' (the
    operand layout of `scan_adjoint`)."""
    n = len(body.inputs)
    nl = [i for i in range(n) if not lin[i]]
    nl_k = [k for k in range(nk) if not lin[nc + k]]
    lk = [k for k in range(nk) if lin[nc + k]]
    lc = [i for i in range(nc) if lin[i]]
    lx = [i for i in range(nc + nk, n) if lin[i]]
    fb = nonlinear_body(body, lin, nl_k, name=f"{body.name}_primal")
    types = ([body.inputs[i].type for i in nl if i < nc]
             + [body.inputs[nc + k].type.update() for k in lk]
             + [body.inputs[i].type.update() for i in lc]
             + [body.inputs[i].type for i in nl if i >= nc]
             + [body.outputs[j].type.update() for j in given])
    n_c = sum(1 for i in nl if i < nc)

    def step(*a):
        it = iter(a)
        consts = [next(it) for _ in range(n_c)]
        ct_k = [next(it) for _ in lk]
        acc = [next(it) for _ in lc]
        rest = [next(it) for i in nl if i >= nc]
        cts = [Zero(o.type.update()) for o in body.outputs]
        for k, c in zip(lk, ct_k):
            cts[k] = c
        for j, c in zip(given, it):
            cts[j] = c
        got = dict(zip([i for i in range(n) if lin[i]],
                       transpose_eval(body, lin, consts + rest, cts)))
        return ([instantiate(got[nc + k]) for k in lk]
                + [add_tangents(s, got[i]) for s, i in zip(acc, lc)]
                + [instantiate(got[i]) for i in lx])

    st, bconsts, _ = trace_body(step, types, name=f"{body.name}_transpose")
    assert not bconsts, "a body's transpose closes over nothing"
    return fb, st


def storable_primal_carries(body: Graph, carries: Sequence[int], nc: int, op: str) -> None:
    for k in carries:
        t = body.inputs[nc + k].type
        if not isinstance(t, TensorType):
            raise ShapeError(f"transposing this loop (forward mode's checks do) stores its "
                             f"primal carries, and a carry of type {t.str_short()} cannot be "
                             "stored. Make it a const of the loop.", op=op)
