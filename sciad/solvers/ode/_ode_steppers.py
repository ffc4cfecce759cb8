"""The ODE steppers: one record per Runge-Kutta method `ode.odeint` takes
(its `solver` param is the record's name, a key of `STEPPERS`).

A record says what the method is: diffrax's class that steps it, explicit
or implicit, IMEX (additive: an explicit tableau for the field's first,
non-stiff part and an ESDIRK one for its second, stiff part), its order,
whether it has an embedded error estimate (else constant steps only) and a
dense-output interpolant of its own order (else diffrax's is linear), and its
Butcher tableau (`tableau`), which the node's reverse pass replays in sciad
ops. Code asks the record, never the name.

`diffrax_solver` builds diffrax's solver for a record (its Newton settings
for an implicit one: `sciad.solvers.ode._ode`), tracking its last accepted step
for the diagnosis of a failed solve.

Plain JAX code, no graph. (diffrax and optimistix are imported where first
used: diffrax takes seconds to import, which `import sciad` does not pay.)
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .. import _registry
from ..nonlinear._root_methods import sparse_jacobian
from ._ode import patient_chord, reusing, sparse_newton_solver

#: implicit solvers: the chord iterations of a stage stop when their
#: estimated error is below this fraction of the step's tolerance (diffrax's
#: default, 0.01, rejected half the steps of a stiff reaction-diffusion
#: problem for Newton "divergence"; 0.1 is within Hairer and Wanner's range),
#: and the step-size controller's PID gains (diffrax's suggestion for stiff
#: problems)
NEWTON_KAPPA = 0.1
STIFF_PID = {"pcoeff": 0.3, "icoeff": 0.4}


class Stepper(NamedTuple):
    """One ODE stepper (a Runge-Kutta method). Its first two fields are the
    `(diffrax class name, implicit)` pair `sd.ode.SOLVERS` has always
    held."""

    #: diffrax's class (by name, in the `diffrax` module)
    diffrax_name: str
    #: implicit stages (Newton systems `I - h gamma df/dy`)
    implicit: bool
    #: the method's order
    order: int
    #: an embedded error estimate: adaptive steps (else constant ones only)
    error_estimate: bool = True
    #: diffrax's dense output is of the method's order (else linear)
    dense_output: bool = True
    #: IMEX: the name of the ESDIRK stepper of the same order, which the
    #: continuous adjoints integrate the summed field with (None: not IMEX)
    summed: str | None = None
    #: diffrax's class does not fail a step whose Newton iteration failed
    #: (it ends the solve instead): wrapped to make that step's error
    #: infinite, so that it is retried shorter
    fail_to_error: bool = False
    #: the tableau `(c, (A,), b)` where diffrax's class has none
    own_tableau: tuple | None = None
    #: how odeint runs it: "diffrax" (`diffrax.diffeqsolve` with diffrax's
    #: class), or one of sciad's own loops, "bdf" (`_bdf`: multistep, no
    #: tableau) or "radau" (`_radau`: a fully implicit collocation method,
    #: its stages solved together)
    lowering: str = "diffrax"
    #: the reverse mode odeint takes where none is asked for: the discrete
    #: adjoint, for every stepper (it replays a diagonally implicit or
    #: explicit tableau's steps, reads BDF's record of its steps, or solves
    #: each Radau step's transposed stage system from its recorded state
    #: with the forward's kept factorizations: exact for the computed
    #: solution, consistent with forward mode, and through a DAE)
    default_adjoint: str = "checkpoint"
    #: takes a mass matrix (`M dy/dt = f`, index-1 DAEs): BDF, Radau, and
    #: the stiffly accurate ESDIRK methods (with an explicit first stage and
    #: an embedded estimate), which then run in sciad's own loop
    #: (`sciad.solvers.ode._esdirk`: diffrax's stage relation has no mass)
    takes_mass: bool = False

    @property
    def replayable(self) -> bool:
        """Its steps are those of an explicit or diagonally implicit
        Runge-Kutta tableau (`tableau`), which the discrete adjoint replays
        stage by stage."""
        return self.lowering == "diffrax"

    @property
    def discrete(self) -> bool:
        """The discrete adjoint ("checkpoint") differentiates its steps:
        replayed from its tableau, linearised at the states the forward pass
        records from BDF's record of each accepted step's order and step
        size changes, or re-run from those states (Radau's coupled
        stages)."""
        return self.replayable or self.lowering in ("bdf", "radau")

    @property
    def imex(self) -> bool:
        """An additive method on a field of two parts."""
        return self.summed is not None

    @property
    def parts(self) -> int:
        """How many parts the vector field has (one, or an IMEX field's
        two)."""
        return 2 if self.imex else 1


#: every stepper, by the name `ode.odeint`'s `solver` param holds: the
#: solver registry's "ode stepper" family (`_registry.family`)
STEPPERS: dict[str, Stepper] = _registry.family("ode stepper")
_BUILT_IN = {
    "tsit5": Stepper("Tsit5", False, 5),
    "dopri5": Stepper("Dopri5", False, 5),
    "dopri8": Stepper("Dopri8", False, 8),
    "bosh3": Stepper("Bosh3", False, 3),
    "heun": Stepper("Heun", False, 2),
    "euler": Stepper("Euler", False, 1, error_estimate=False, dense_output=False,
                     own_tableau=((0.0,), (((0.0,),),), (1.0,))),
    "kvaerno3": Stepper("Kvaerno3", True, 3, takes_mass=True),
    "kvaerno4": Stepper("Kvaerno4", True, 4, takes_mass=True),
    "kvaerno5": Stepper("Kvaerno5", True, 5, takes_mass=True),
    "implicit_euler": Stepper("ImplicitEuler", True, 1, dense_output=False,
                              fail_to_error=True,
                              own_tableau=((1.0,), (((1.0,),),), (1.0,))),
    "kencarp3": Stepper("KenCarp3", True, 3, summed="kvaerno3"),
    "kencarp4": Stepper("KenCarp4", True, 4, summed="kvaerno4"),
    "kencarp5": Stepper("KenCarp5", True, 5, summed="kvaerno5"),
    # variable order 1-5 (its `order` the highest): SciPy's BDF (NDF)
    "bdf": Stepper("BDF", True, 5, lowering="bdf", takes_mass=True),
    # Radau IIA of order 5: Hairer and Wanner's RADAU5, SciPy's Radau
    "radau": Stepper("Radau", True, 5, lowering="radau", takes_mass=True),
}
for _name, _stepper in _BUILT_IN.items():
    _registry.register(_stepper, family="ode stepper", name=_name)


def takers_of_mass() -> str:
    """The names of the steppers that take a mass matrix, for a message."""
    return ", ".join(repr(k) for k, s in sorted(STEPPERS.items()) if s.takes_mass)


@functools.lru_cache(maxsize=None)
def tableau(stepper: Stepper):
    """`(c, As, b)` of the stepper's Runge-Kutta method: one matrix `A` (lower
    triangular, its diagonal nonzero for implicit stages) per part of the
    field, the explicit one and then the implicit one for an IMEX method
    (whose parts share `c` and `b`)."""
    if not stepper.replayable:
        raise ValueError(f"{stepper.diffrax_name} has no explicit or diagonally implicit "
                         "tableau to replay.")
    if stepper.own_tableau is not None:
        c, As, b = stepper.own_tableau
        return np.array(c), tuple(np.array(A) for A in As), np.array(b)
    import diffrax

    tab = getattr(diffrax, stepper.diffrax_name).tableau
    tabs = tab.tableaus if isinstance(tab, diffrax.MultiButcherTableau) else (tab,)
    s = len(tabs[0].b_sol)
    As = []
    for t in tabs:
        A = np.zeros((s, s))
        for i, row in enumerate(t.a_lower, start=1):
            A[i, :i] = row
        if t.a_diagonal is not None:
            A[np.diag_indices(s)] = t.a_diagonal
        As.append(A)
        assert np.array_equal(t.b_sol, tabs[0].b_sol) and np.array_equal(t.c, tabs[0].c)
    return np.concatenate([[tabs[0].c1], tabs[0].c]), tuple(As), np.asarray(tabs[0].b_sol)


@functools.lru_cache(maxsize=None)
def error_weights(stepper: Stepper) -> np.ndarray:
    """`b - b_hat`: the weights of the stages' slopes in the embedded error
    estimate of the stepper's (single-part) tableau, diffrax's `b_error`."""
    if not stepper.replayable or stepper.own_tableau is not None or stepper.imex \
            or not stepper.error_estimate:
        raise ValueError(f"{stepper.diffrax_name} has no embedded estimate to read.")
    import diffrax

    return np.asarray(getattr(diffrax, stepper.diffrax_name).tableau.b_error, np.float64)


@functools.lru_cache(maxsize=None)
def diffrax_class(stepper: Stepper):
    """diffrax's class for the stepper (`fail_to_error`: wrapped so that a
    failed Newton iteration makes the step's error infinite, as diffrax's
    Runge-Kutta methods do: the step is retried shorter instead of ending
    the solve)."""
    import diffrax
    import jax
    import jax.numpy as jnp

    cls = getattr(diffrax, stepper.diffrax_name)
    if not stepper.fail_to_error:
        return cls

    class FailToError(cls):
        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            y1, err, dense, state, result = super().step(terms, t0, t1, y0, args,
                                                         solver_state, made_jump)
            ok = result == diffrax.RESULTS.successful
            err = jax.tree_util.tree_map(lambda e: jnp.where(ok, e, jnp.inf), err)
            return y1, err, dense, state, result

    FailToError.__name__ = FailToError.__qualname__ = cls.__name__
    return FailToError


def diffrax_solver(stepper: Stepper, jac: str, pattern, rtol: float, atol: float, m: int):
    """diffrax's solver for `stepper`, tracking its last accepted step (of
    the first `m` state elements: see `tracking`); an implicit one's Newton
    systems dense, or sparse on `pattern` (`jac="sparse"`: SuperLU, its
    factorization kept over steps)."""
    cls = diffrax_class(stepper)
    if not stepper.implicit:
        return tracking(cls, m)()
    extra = {}
    if sparse_jacobian(jac):  # SuperLU, its factorization kept over steps
        extra["linear_solver"] = sparse_newton_solver()(pattern)
        _, As, _ = tableau(stepper)  # (gamma: the implicit tableau's diagonal)
        cls = reusing(cls, float(np.max(np.diag(As[-1]))))
    # (stages stop as RADAU5's do: diffrax's VeryChord fails a stage not
    # converged after two iterations, and so rejects steps a chord iteration
    # would have finished: 67 steps against 26 for a stiff heat equation)
    return tracking(cls, m)(root_finder=patient_chord()(rtol=rtol, atol=atol,
                                                        kappa=NEWTON_KAPPA, **extra))


@functools.lru_cache(maxsize=None)
def tracking(cls, m: int):
    """`cls` keeping `(t, h, max |y[:m]|)` of its last step in its state:
    diffrax keeps a step's solver state only when it accepts the step, so
    the final state (`SaveAt(solver_state=True)`) tells the time reached,
    the last accepted step size and the state's size there, for the
    diagnosis of a failed solve, without recording every step (`max |y|` is
    infinite before a first accepted step)."""
    import jax.numpy as jnp

    class Tracking(cls):
        def init(self, terms, t0, t1, y0, args):
            dt = jnp.result_type(y0)
            return super().init(terms, t0, t1, y0, args), (
                jnp.asarray(t0, dt), jnp.zeros((), dt), jnp.full((), jnp.inf, dt))

        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            y1, err, dense, state, result = super().step(terms, t0, t1, y0, args,
                                                         solver_state[0], made_jump)
            dt = jnp.result_type(y0)
            last = (jnp.asarray(t1, dt), jnp.asarray(t1 - t0, dt),
                    jnp.max(jnp.abs(y1[:m])).astype(dt))
            return y1, err, dense, (state, last), result

    Tracking.__name__ = Tracking.__qualname__ = f"Tracking{cls.__name__}"
    return Tracking
