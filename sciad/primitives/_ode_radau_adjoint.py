"""`ode.radau_adjoint`: the discrete adjoint of the steps an `ode.odeint`
node with `solver="radau"` took, one node, lowered to one JAX loop down the
recorded steps (`sciad.solvers.ode._radau_adjoint`) that keeps the forward
loop's real and complex factorizations over steps and solves each step's
transposed stage system by the iteration they precondition.

It is what the node's default reverse mode (`adjoint="checkpoint"`, the
states recorded at every step) emits for Radau. Before, each step was
re-run in sciad ops (`_ode_replay.radau_step`: its three stages one root
node), which factored the `3 n` stage Jacobian twice a step (once to solve
the stages, once transposed): on the 1,024-state Brusselator the gradient
took 5.7 times the forward solve. That formulation stays as this node's
reference (`reference`): its derivative rules (second order: forward or
reverse over this reverse pass) are the derivatives of the same steps'
replay, which linearises them at the same stages (to the replay's Newton
tolerance, `_ode_replay.STAGE_RTOL` of rtol).

Operands: `(*consts, grid, marks, states, ct[, ct_states])` (the field's
consts, the node's recorded step times, output marks and states, the
cotangents of the states at the output times and, with `states_ct`, at
every step). Outputs: the cotangents of the consts flagged `wanted`, then
that of the initial state.
"""

from __future__ import annotations

from ..errors import ConvergenceError
from ..graph import Param, Primitive, Site, TensorType, Zero, is_zero, lower
from ..graph._autodiff import jvp_eval, type_of, vjp_eval, vjp_transpose
from ..graph._body import Body, trace_body
from ..graph._cost import Cost, _si
from ..graph._sparsity import dense_all
from ..graph._types import Pattern
from ..solvers.nonlinear._root_methods import sparse_jacobian
from ..solvers.ode import _radau_adjoint
from ._checks import check, tie
from ._map import map_rule
from ._ode_field import part_of

radau_adjoint_p = Primitive("ode.radau_adjoint", multiple_results=True, runtime_checks=True,
                            params={
    "body": Body, "rtol": float, "atol": float, "max_steps": int,
    "jac": Param(str, default="dense"), "pattern": Param((Pattern, None), default=None),
    "mass": Param((int, None), default=None),
    "mass_pattern": Param((Pattern, None), default=None),
    "wanted": tuple[bool, ...], "states_ct": Param(bool, default=False)})
#: `body`, `rtol`, `atol`, `max_steps`, `jac`, `pattern`, `mass`,
#: `mass_pattern`: the `ode.odeint` node's (`solver="radau"`); `wanted`: per
#: const, whether its cotangent is formed (an output); `states_ct`: the last
#: operand is the cotangent of the states at every step


def _split(args, wanted, states_ct):
    k = len(wanted)
    consts, rest = list(args[:k]), list(args[k:])
    grid, marks, states, ct = rest[:4]
    return consts, grid, marks, states, ct, rest[4] if states_ct else None


@radau_adjoint_p.def_abstract_eval
def _shape(*args, body, rtol, atol, max_steps, jac="dense", pattern=None, mass=None,
           mass_pattern=None, wanted, states_ct=False):
    consts, grid, marks, states, ct, ct_states = _split(args, wanted, states_ct)
    if len(consts) != len(body.inputs) - 2 or not isinstance(states, TensorType) \
            or states.ndim != 2 or ct.ndim != 2 or ct.shape[1] != states.shape[1] \
            or marks.shape != (ct.shape[0],) or grid.shape != (states.shape[0],):
        raise ValueError("ode.radau_adjoint: operands (*consts, grid, marks, states, ct"
                         "[, ct_states]) do not match each other or the field's body")
    return [TensorType(c.shape, c.dtype) for c, w in zip(consts, wanted) if w] + \
        [TensorType((states.shape[1],), states.dtype)]


def judge_radau_adjoint(site, *, status, t):
    """Raises the `ConvergenceError` of a reverse pass that stopped at the
    step from `t` whose stages or transposed stage system it could not
    solve."""
    status = int(status)
    if status == 0:
        return
    where = f"the step from t = {float(t):.6g}"
    if status == _radau_adjoint.NONFINITE:
        site.fail(ConvergenceError,
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
          mass_pattern=None, wanted, states_ct=False, site=None):
    from ._ode import _mass_for  # (a cycle: `_ode` emits this node's rules' callers)

    consts, grid, marks, states, ct, ct_states = _split(args, wanted, states_ct)
    part = lower(part_of(body, 0), site.held if site is not None else ())
    idx = [i for i, w in enumerate(wanted) if w]

    def field(cw, t, y):
        cs = list(consts)
        for i, c in zip(idx, cw):
            cs[i] = c
        return part(*cs, t, y)[0]

    kind = "sparse" if sparse_jacobian(jac) else "dense"
    n = states.shape[1]
    mvals = None if mass is None else _mass_for(consts[mass], mass_pattern, n, kind, pattern)
    cbar, ybar, status, t_failed = _radau_adjoint.adjoint(
        field, tuple(consts[i] for i in idx), grid, marks, states, ct, ct_states, rtol=rtol,
        atol=atol, jac=kind, pattern=pattern, mass=mvals)
    token = check(judge_radau_adjoint, site or Site("ode.radau_adjoint"), when=status != 0,
                  status=status, t=t_failed)
    return tuple(tie([*cbar, ybar], token))


def radau_vjp(primals, outs, ct, params, wanted, ct_states=None) -> list:
    """The cotangents of an `ode.odeint` node's `(*consts, y0)` (None where
    not `wanted`) by one `ode.radau_adjoint` node: `outs`, the node's
    outputs (an `OdeintOutputs` with `states`); `ct`, `ct_states`: as
    `Adjoint.vjp`'s."""
    *consts, _, _ = primals
    p = {"body": params["body"], "rtol": params["rtol"], "atol": params["atol"],
         "max_steps": params["max_steps"], "wanted": tuple(bool(w) for w in wanted)}
    for name in ("jac", "pattern", "mass", "mass_pattern"):
        if params.get(name) is not None:
            p[name] = params[name]
    if ct_states is not None:
        p["states_ct"] = True
    operands = [*consts, outs.grid, outs.marks, outs.states, ct] + \
        ([] if ct_states is None else [ct_states])
    got = iter(radau_adjoint_p.bind(*operands, **p))
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


def _reference_graph(args, params):
    def fn(*a):
        return reference(*a, **params)

    g, closed, _ = trace_body(fn, [type_of(a) for a in args], name="radau_adjoint_reference")
    return g, closed


@radau_adjoint_p.def_jvp
def _jvp(primals, tangents, **params):
    outs = radau_adjoint_p.bind(*primals, **params)
    if all(is_zero(t) for t in tangents):
        return outs, [Zero(type_of(o).update()) for o in outs]
    g, closed = _reference_graph(primals, params)
    _, touts = jvp_eval(g, [*closed, *primals],
                        [Zero(type_of(c).update()) for c in closed] + list(tangents))
    return outs, touts


@radau_adjoint_p.def_vjp
def _vjp(primals, outs, cts, **params):
    g, closed = _reference_graph(primals, params)
    _, backward = vjp_eval(g, [*closed, *primals])
    return backward(list(cts))[len(closed):]


# linear in the cotangents `ct` (and `ct_states`) where the rest is fixed
radau_adjoint_p.def_transpose(vjp_transpose(radau_adjoint_p))


@radau_adjoint_p.def_sparsity
def _sparsity(outs, *deps, **params):
    return dense_all(outs, *deps)


# a batch of reverse passes is a `map` of one (`jax.vmap` of its loop; the
# kept factors' swaps batch as the forward loop's)
radau_adjoint_p.def_batch(map_rule(radau_adjoint_p))


@radau_adjoint_p.def_cost
def _cost(node, body_cost):
    # per step (their number is known only when it runs): about three
    # Newton iterations on the stages and four of the transposed system,
    # each three evaluations (or VJPs) of the field and a real and a complex
    # solve
    F = body_cost(node.params["body"])
    n = node.inputs[len(node.params["wanted"]) + 2].type.shape[1]
    per = 7.0 * 3.0 * (F.flops + 6.0 * n)
    return Cost(per, F.peak, f"per step ({_si(per)})")
