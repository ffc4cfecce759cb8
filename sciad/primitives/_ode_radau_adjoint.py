"""Radau's discrete derivatives as nodes: `ode.radau_adjoint` (the reverse
pass over the steps an `ode.odeint` node with `solver="radau"` took) and
`ode.radau_tangent` (the forward sensitivity of the same steps), each one
node lowered to one JAX loop over the recorded steps
(`sciad.solvers.ode._radau_adjoint`) that keeps the forward loop's real and
complex factorizations over steps and solves each step's stage system (or
its transpose) by the iteration they precondition. With `directions`, a
batch of cotangents or tangents over the same steps (`jacrev`, `jacfwd`)
is one such loop, every direction solved with the same stages and
factorizations (`_directions_rule`).

They are what the node's default reverse mode (`adjoint="checkpoint"`,
the states recorded at every step) and its forward mode emit for Radau.
Before, each step was re-run in sciad ops (`_ode_replay.radau_step`: its
three stages one root node), which factored the `3 n` stage Jacobian
twice a step: on the 1,024-state Brusselator the gradient took 5.7 times
the forward solve. That formulation stays as these nodes' reference
(`reference`, `tangent_reference`): their derivative rules (second order)
are the derivatives of the same steps' replay, which linearises them at
the same stages (to the replay's Newton tolerance,
`_ode_replay.STAGE_RTOL` of rtol).

`ode.radau_adjoint`'s operands: `(*consts, grid, marks, states, ct[,
ct_states])` (the field's consts, the node's recorded step times, output
marks and states, the cotangents of the states at the output times and,
with `states_ct`, at every step); its outputs: the cotangents of the consts
flagged `wanted`, then that of the initial state. `ode.radau_tangent`'s:
see `radau_tangent_p`.
"""

from __future__ import annotations

from ..errors import ConvergenceError, NonFiniteError
from ..graph import Param, Primitive, Site, TensorType, Zero, is_zero, lower
from ..graph._autodiff import instantiate, jvp_eval, type_of, vjp_eval, vjp_transpose
from ..graph._body import Body, trace_body
from ..graph._cost import Cost, _si
from ..graph._sparsity import dense_all
from ..graph._types import Pattern
from ..solvers.nonlinear._root_methods import sparse_jacobian
from ..solvers.ode import _radau_adjoint
from ._checks import check, tie
from ._map import map_rule
from .._ops import broadcast_to
from ..graph._batch import batch_graph, batch_size_of, batched_front, to_front
from ..graph._trace import trace_flat
from ._ode_field import part_of

#: the params both nodes take from the `ode.odeint` node, and `directions`
_STEPS_PARAMS = {
    "body": Body, "rtol": float, "atol": float, "max_steps": int,
    "jac": Param(str, default="dense"), "pattern": Param((Pattern, None), default=None),
    "mass": Param((int, None), default=None),
    "mass_pattern": Param((Pattern, None), default=None),
    "directions": Param(bool, default=False)}


def _steps_params(params: dict, **own) -> dict:
    """A node's params from the `ode.odeint` node's `params` (the defaults
    left out) and its own."""
    p = {name: params[name] for name in ("body", "rtol", "atol", "max_steps")}
    p.update((name, params[name]) for name in ("jac", "pattern", "mass", "mass_pattern")
             if params.get(name) is not None)
    return dict(p, **own)


radau_adjoint_p = Primitive("ode.radau_adjoint", multiple_results=True, runtime_checks=True,
                            params=dict(_STEPS_PARAMS, wanted=tuple[bool, ...],
                                        states_ct=Param(bool, default=False)))
#: `body`, `rtol`, `atol`, `max_steps`, `jac`, `pattern`, `mass`,
#: `mass_pattern`: the `ode.odeint` node's (`solver="radau"`); `wanted`: per
#: const, whether its cotangent is formed (an output); `states_ct`: the last
#: operand is the cotangent of the states at every step; `directions`: the
#: cotangents (and the outputs) have a leading axis of directions, all solved
#: with the same stages and factorizations (a batch of reverse passes over
#: the same steps: `jacrev`, `vmap` of a VJP)


def _split(args, wanted, states_ct):
    k = len(wanted)
    consts, rest = list(args[:k]), list(args[k:])
    grid, marks, states, ct = rest[:4]
    return consts, grid, marks, states, ct, rest[4] if states_ct else None


@radau_adjoint_p.def_abstract_eval
def _shape(*args, body, rtol, atol, max_steps, jac="dense", pattern=None, mass=None,
           mass_pattern=None, wanted, states_ct=False, directions=False):
    consts, grid, marks, states, ct, ct_states = _split(args, wanted, states_ct)
    lead = ct.shape[:1] if directions else ()
    if len(consts) != len(body.inputs) - 2 or not isinstance(states, TensorType) \
            or states.ndim != 2 or ct.shape != lead + (marks.shape[0], states.shape[1]) \
            or grid.shape != (states.shape[0],) or (
                ct_states is not None and ct_states.shape != lead + states.shape):
        raise ValueError("ode.radau_adjoint: operands (*consts, grid, marks, states, ct"
                         "[, ct_states]) do not match each other or the field's body")
    return [TensorType(lead + c.shape, c.dtype) for c, w in zip(consts, wanted) if w] + \
        [TensorType(lead + (states.shape[1],), states.dtype)]


def judge_radau_adjoint(site, *, status, t):
    """Raises the error of a reverse pass that stopped at the step from
    `t`: `NonFiniteError` where the field's derivative there was not finite
    (as BDF's pass), `ConvergenceError` where its stages or transposed
    stage system could not be solved."""
    status = int(status)
    if status == 0:
        return
    where = f"the step from t = {float(t):.6g}"
    if status == _radau_adjoint.NONFINITE:
        site.fail(NonFiniteError,
                  f"the discrete adjoint of Radau's steps met values that are not finite at "
                  f"{where}: the vector field's derivative (its Jacobian, or its VJP) is NaN "
                  f"or infinite at one of the step's stages, though the forward solve, which "
                  f"evaluates the field there, succeeded. Make the field differentiable where "
                  f"the solution goes (a square root or division at 0 has no derivative).")
    site.fail(ConvergenceError,
              f"the discrete adjoint of Radau's steps could not solve the stages or the "
              f"transposed stage system of {where}, even with the Jacobian at the step's "
              f"start factored afresh (the forward solve accepted the step with a looser "
              f"tolerance). Use adjoint='interpolated' (the continuous adjoint) for this "
              f"solve, or a smaller rtol, whose steps are shorter.")


@radau_adjoint_p.def_impl
def _impl(*args, body, rtol, atol, max_steps, jac="dense", pattern=None, mass=None,
          mass_pattern=None, wanted, states_ct=False, directions=False, site=None):
    consts, grid, marks, states, ct, ct_states = _split(args, wanted, states_ct)
    field, kind, mvals = _field_of(body, consts, wanted, jac, mass, mass_pattern, pattern,
                                   states.shape[1], site)
    idx = [i for i, w in enumerate(wanted) if w]
    if not directions:
        ct, ct_states = ct[None], None if ct_states is None else ct_states[None]
    cbar, ybar, status, t_failed = _radau_adjoint.adjoint(
        field, tuple(consts[i] for i in idx), grid, marks, states, ct, ct_states, rtol=rtol,
        atol=atol, jac=kind, pattern=pattern, mass=mvals)
    token = check(judge_radau_adjoint, site or Site("ode.radau_adjoint"), when=status != 0,
                  status=status, t=t_failed)
    outs = [*cbar, ybar]
    return tuple(tie(outs if directions else [o[0] for o in outs], token))


def radau_vjp(primals, outs, ct, params, wanted, ct_states=None) -> list:
    """The cotangents of an `ode.odeint` node's `(*consts, y0)` (None where
    not `wanted`) by one `ode.radau_adjoint` node: `outs`, the node's
    outputs (an `OdeintOutputs` with `states`); `ct`, `ct_states`: as
    `Adjoint.vjp`'s."""
    return bind_adjoint(radau_adjoint_p, primals[:-2], [outs.grid, outs.marks, outs.states],
                        ct, ct_states, params, wanted)


def bind_adjoint(prim, consts, recorded, ct, ct_states, params, wanted) -> list:
    """The cotangents of an `ode.odeint` node's `(*consts, y0)` (None for
    the consts not `wanted`) by one reverse-pass node `prim` (Radau's,
    BDF's) over the node's `recorded` steps (its grid, marks, states and
    what else `prim` reads of them), with the `ode.odeint` node's `params`."""
    p = _steps_params(params, wanted=tuple(bool(w) for w in wanted))
    if ct_states is not None:
        p["states_ct"] = True
    got = iter(prim.bind(*consts, *recorded, ct,
                         *([] if ct_states is None else [ct_states]), **p))
    bars = [next(got) if w else None for w in wanted]
    return bars + [next(got)]


def reference(*args, **params):
    """The node's outputs computed in sciad ops: each step re-run from its
    recorded state (`_ode_adjoint.stored_vjp`, Radau's steps by
    `_ode_replay.radau_step`), whose derivatives are this node's."""
    from ._ode_adjoint import stored_vjp
    from ._ode import OdeintOutputs

    wanted, states_ct = params["wanted"], params.get("states_ct", False)
    consts, grid, marks, states, ct, ct_states = _split(args, wanted, states_ct)
    odeint_params = dict(params, solver="radau")
    outs = OdeintOutputs(None, None, None, grid=grid, marks=marks, states=states)
    bars = stored_vjp([*consts, states[0], grid[marks]], outs, ct, odeint_params, ct_states,
                      wanted=list(wanted))
    return [b for b, w in zip(bars, wanted) if w] + [bars[-1]]


def _reference_graph(reference_fn, args, params):
    def fn(*a):
        return reference_fn(*a, **params)

    g, closed, _ = trace_body(fn, [type_of(a) for a in args], name="radau_reference")
    return g, closed


def _over_directions(single, linear_of):
    """`single` (a reference, one direction), or with `directions`, mapped
    over the leading axis of the operands at `linear_of(args, params)` (a
    sciad `vmap` of it)."""
    def reference_fn(*args, **params):
        if not params.get("directions", False):
            return single(*args, **params)
        one = dict(params, directions=False)
        lin = linear_of(args, params)

        def each(*values):
            full = list(args)
            for i, v in zip(lin, values):
                full[i] = v
            return single(*full, **one)

        values = [args[i] for i in lin]
        size = type_of(values[0]).shape[0]
        per = tuple(TensorType(type_of(v).shape[1:], type_of(v).dtype) for v in values)
        graph, _, _, captured = trace_flat(each, per, closure=True, name="radau_reference")
        outs = batch_graph(graph, values + list(captured), [0] * len(values) +
                           [None] * len(captured), None)
        return [batched_front(v, d, size) for v, d in outs]

    return reference_fn


def _directions_rule(prim, linear_of):
    """The batch rule of `prim`: a batch of its linear operands alone (the
    same steps, many cotangents or tangents) is one node with `directions`,
    whose loop solves them all with the same stages and factorizations;
    any other batch is a `map` of one (`jax.vmap` of its loop: the kept
    factors' swaps batch as the forward loop's)."""
    mapped = map_rule(prim)

    def rule(args, dims, spmd_axis=None, **params):
        lin = linear_of(args, params)
        if spmd_axis is not None or params.get("directions", False) or any(
                d is not None for i, d in enumerate(dims) if i not in lin):
            return mapped(args, dims, spmd_axis=spmd_axis, **params)
        size = batch_size_of(args, dims)
        new = list(args)
        for i in lin:
            new[i] = to_front(args[i], dims[i]) if dims[i] is not None else \
                broadcast_to(args[i], (size,) + tuple(type_of(args[i]).shape))
        outs = list(prim.bind(*new, **dict(params, directions=True)))
        return outs, [0] * len(outs)

    return rule


def _def_rules(prim, reference_fn, linear_of):
    """`prim`'s derivative rules: its reference's (the same steps re-run in
    sciad ops), and its transpose (it is linear in its operands at
    `linear_of(args, params)`, the cotangents or tangents, where the rest is
    fixed) by its VJP; its batch rule (`_directions_rule`); its sparsity
    dense."""
    reference_fn = _over_directions(reference_fn, linear_of)

    @prim.def_jvp
    def _jvp(primals, tangents, **params):
        outs = prim.bind(*primals, **params)
        if all(is_zero(t) for t in tangents):
            return outs, [Zero(type_of(o).update()) for o in outs]
        g, closed = _reference_graph(reference_fn, primals, params)
        _, touts = jvp_eval(g, [*closed, *primals],
                            [Zero(type_of(c).update()) for c in closed] + list(tangents))
        return outs, touts

    @prim.def_vjp
    def _vjp(primals, outs, cts, **params):
        g, closed = _reference_graph(reference_fn, primals, params)
        _, backward = vjp_eval(g, [*closed, *primals])
        return backward(list(cts))[len(closed):]

    prim.def_transpose(vjp_transpose(prim))
    prim.def_sparsity(lambda outs, *deps, **params: dense_all(outs, *deps))
    prim.def_batch(_directions_rule(prim, linear_of))


def _adjoint_linear(args, params) -> list:
    k = len(params["wanted"]) + 3  # (ct, after the consts, grid, marks and states)
    return [k, k + 1] if params.get("states_ct", False) else [k]


_def_rules(radau_adjoint_p, reference, _adjoint_linear)


# ---------------------------------------------------------------------------
# forward mode

radau_tangent_p = Primitive("ode.radau_tangent", multiple_results=True, runtime_checks=True,
                            params=dict(_STEPS_PARAMS, nonzero=tuple[bool, ...]))
radau_tangent_p.__doc__ = """The discrete forward sensitivity of the steps an
`ode.odeint` node with `solver="radau"` took, one node, lowered to one JAX
loop up the recorded steps (`sciad.solvers.ode._radau_adjoint.tangent`):
operands `(*consts, *dconsts, grid, marks, states, dy0)` (the tangents of
the consts flagged `nonzero` only), outputs the tangents of the states at
every step and at the output times. Its derivative rules are those of the
steps re-run in sciad ops (`_ode_adjoint.stored_jvp`). `directions`: the
tangents (and the outputs) have a leading axis of directions, all solved
with the same stages and factorizations (`jacfwd`, `vmap` of a JVP)."""


def _split_tangent(args, nonzero):
    k = len(nonzero)
    consts = list(args[:k])
    d = sum(bool(z) for z in nonzero)
    dconsts = list(args[k:k + d])
    grid, marks, states, dy0 = args[k + d:]
    return consts, dconsts, grid, marks, states, dy0


@radau_tangent_p.def_abstract_eval
def _tangent_shape(*args, body, rtol, atol, max_steps, jac="dense", pattern=None, mass=None,
                   mass_pattern=None, nonzero, directions=False):
    consts, dconsts, grid, marks, states, dy0 = _split_tangent(args, nonzero)
    lead = dy0.shape[:1] if directions else ()
    if len(consts) != len(body.inputs) - 2 or states.ndim != 2 \
            or dy0.shape != lead + (states.shape[1],) or grid.shape != (states.shape[0],) \
            or [(lead + c.shape, c.dtype) for c, z in zip(consts, nonzero) if z] != \
            [(d.shape, d.dtype) for d in dconsts]:
        raise ValueError("ode.radau_tangent: operands (*consts, *dconsts, grid, marks, "
                         "states, dy0) do not match each other or the field's body")
    return [TensorType(lead + states.shape, states.dtype),
            TensorType(lead + (marks.shape[0], states.shape[1]), states.dtype)]


@radau_tangent_p.def_impl
def _tangent_impl(*args, body, rtol, atol, max_steps, jac="dense", pattern=None, mass=None,
                  mass_pattern=None, nonzero, directions=False, site=None):
    consts, dconsts, grid, marks, states, dy0 = _split_tangent(args, nonzero)
    field, kind, mvals = _field_of(body, consts, nonzero, jac, mass, mass_pattern, pattern,
                                   states.shape[1], site)
    if not directions:
        dconsts, dy0 = [d[None] for d in dconsts], dy0[None]
    dstates, dys, status, t_failed = _radau_adjoint.tangent(
        field, tuple(c for c, z in zip(consts, nonzero) if z), tuple(dconsts), grid, marks,
        states, dy0, rtol=rtol, atol=atol, jac=kind, pattern=pattern, mass=mvals)
    token = check(judge_radau_adjoint, site or Site("ode.radau_tangent"), when=status != 0,
                  status=status, t=t_failed)
    outs = [dstates, dys] if directions else [dstates[0], dys[0]]
    return tuple(tie(outs, token))


def radau_jvp(primals, tangents, outs, params):
    """The tangents of an `ode.odeint` node's states at every step and at
    its output times by one `ode.radau_tangent` node: `tangents`, those of
    `(*consts, y0)` (`Zero`s where none); `outs`, the node's outputs (an
    `OdeintOutputs` with `states`)."""
    *consts, _, _ = primals
    *dconsts, dy0 = tangents
    p = _steps_params(params, nonzero=tuple(not is_zero(d) for d in dconsts))
    dstates, dys = radau_tangent_p.bind(*consts, *[d for d in dconsts if not is_zero(d)],
                                        outs.grid, outs.marks, outs.states, instantiate(dy0),
                                        **p)
    return dstates, dys


def tangent_reference(*args, **params):
    """`ode.radau_tangent`'s outputs computed in sciad ops
    (`_ode_adjoint.stored_jvp`, each step's JVP from its recorded state)."""
    from ._ode import OdeintOutputs
    from ._ode_adjoint import stored_jvp

    nonzero = params["nonzero"]
    consts, dconsts, grid, marks, states, dy0 = _split_tangent(args, nonzero)
    it = iter(dconsts)
    tangents = [next(it) if z else Zero(type_of(c).update()) for c, z in zip(consts, nonzero)]
    outs = OdeintOutputs(None, None, marks[-1], grid=grid, marks=marks, states=states)
    dstates, dys = stored_jvp([*consts, states[0], grid[marks]], [*tangents, dy0], outs,
                              dict(params, solver="radau"))
    return [dstates, dys]


def _tangent_linear(args, params) -> list:
    nonzero = params["nonzero"]
    k, d = len(nonzero), sum(bool(z) for z in nonzero)
    return list(range(k, k + d)) + [len(args) - 1]  # (the dconsts and dy0)


_def_rules(radau_tangent_p, tangent_reference, _tangent_linear)


def _field_of(body, consts, flags, jac, mass, mass_pattern, pattern, n, site):
    """`(field(cw, t, y), the Jacobian kind, the mass matrix's values)` for
    the loops: `cw`, the consts flagged in `flags` (the others fixed)."""
    from ._ode import _mass_for  # (a cycle: `_ode` emits these nodes)

    part = lower(part_of(body, 0), site.held if site is not None else ())
    idx = [i for i, w in enumerate(flags) if w]

    def field(cw, t, y):
        cs = list(consts)
        for i, c in zip(idx, cw):
            cs[i] = c
        return part(*cs, t, y)[0]

    kind = "sparse" if sparse_jacobian(jac) else "dense"
    mvals = None if mass is None else _mass_for(consts[mass], mass_pattern, n, kind, pattern)
    return field, kind, mvals


def _cost(node, body_cost):
    # per step (their number is known only when it runs): about three
    # Newton iterations on the stages and four of the linear system's, each
    # three evaluations (JVPs, VJPs) of the field and a real and a complex
    # solve
    F = body_cost(node.params["body"])
    n = node.outputs[-1].type.shape[-1]
    per = 7.0 * 3.0 * (F.flops + 6.0 * n)
    return Cost(per, F.peak, f"per step ({_si(per)})")


radau_adjoint_p.def_cost(_cost)
radau_tangent_p.def_cost(_cost)
