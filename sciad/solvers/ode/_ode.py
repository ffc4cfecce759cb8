"""`SparseNewtonSolver`: the Newton systems of diffrax's implicit solvers
solved by SuperLU on the host.

diffrax's implicit Runge-Kutta methods (Kvaerno3/4/5, ImplicitEuler) find
each stage with `diffrax.VeryChord`: once per step it linearises the stage
relation (`lx.JacobianLinearOperator`, `lx.linearise`) and calls the linear
solver's `init(operator)`; every Newton iteration of every stage of that step
then calls `compute(state, vector)`. The matrix is `I - h gamma df/dy`
(up to diffrax's scaling), whose pattern, that of `df/dy` plus the diagonal,
sciad detects from the vector field's graph.

- `init`: the matrix's values on the pattern from one matrix-vector product
  per color of the pattern's columns (Curtis-Powell-Reid: columns sharing no
  row share a color; `vmap`ped over the seeds, a handful of JVPs instead of
  `n`), read back entry by entry; then one host call factors them with
  SuperLU (`sciad.solvers.direct._sparse_direct`) and returns a handle (an int32)
  to the factor, kept in a host store of this module's own. The state is
  `(values, handle)`.
- `compute`: one host call, a pair of triangular solves with the handle's
  factor (transposed or conjugated as lineax asks, from the same factor).

The store is a bounded cache, as `_sparse_direct`'s is: every step makes a
new factor and the oldest beyond `_sparse_direct.MAX_KEPT` are released
(never those just made, so a `vmap`'s batch of factors all stay), so
thousands of steps hold a few factors. Every solve also receives the values,
so a solve whose factor was pushed out (by concurrent runs of a program, or
a program run twice by XLA) factors them again: the cache never changes a
result. Handles are never shared between batch elements or calls.

Kept over steps (`reusing`, with `holding`'s step-size controller): as BDF
codes do, a step of the same `h gamma` as the last factorization's solves
with it (the Jacobian of an earlier state: chord iterations, stopped by
their contraction rate, `patient_chord`), for up to `MAX_AGE` steps. The
controller holds the step size where it would grow it by at most `HOLD`
times, so that the kept factor fits; a failed Newton iteration fails the
step, whose shorter retry factors anew.

A matrix that is exactly the identity (diffrax linearises a dummy relation
with a zero diagonal at the start of each step) is not factored: its handle
is `IDENTITY` and its solves copy the vector. A singular or non-finite matrix
gives a NaN solution, which lineax reports as a failed solve and diffrax
answers with a smaller step.

(diffrax, optimistix, lineax and equinox are imported inside the functions
that subclass their classes, `sparse_newton_solver` among them: diffrax takes
seconds to import, lineax with equinox about 0.2 s, which `import sciad` does
not pay.)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from ..direct import _sparse_direct
from .._coloring import color_seeds, coloring
from .._host import host_call
from ..nonlinear._nonlinear import colored_values

#: the handle of an identity matrix (no factor: solves copy the vector)
IDENTITY = -1

# this module's factors: not mixed with the linear-algebra nodes' kept ones,
# which thousands of time steps would otherwise push out
_store = _sparse_direct._Store()


def held() -> int:
    """How many factorizations the ODE solver's store holds now (for tests:
    bounded however many steps were taken)."""
    return len(_store)


def _with_diagonal(pattern):
    """`pattern` with its diagonal added where it lacks entries (a Newton
    matrix `I - h gamma J` has them whatever `J`'s pattern is); a pattern of
    the same class (built from its `shape`, `indptr` and `indices`)."""
    if np.all(pattern.diagonal_positions() >= 0):
        return pattern
    n = pattern.shape[0]
    p = sp.csr_matrix((np.ones(pattern.nnz, bool), pattern.indices, pattern.indptr),
                      shape=pattern.shape)
    p = sp.csr_matrix(p + sp.eye(n, dtype=bool, format="csr"), dtype=bool)
    p.sum_duplicates()
    p.sort_indices()
    return type(pattern)(p.shape, p.indptr, p.indices)


@functools.lru_cache(maxsize=32)
def _structure(pattern):
    """`(seeds, color of each entry's column, identity values)` of `pattern`,
    computed once per pattern."""
    colors = coloring(pattern)
    seeds = color_seeds(colors, pattern.shape[1])
    where = np.asarray(colors[pattern.indices], np.int64)
    eye = np.zeros(pattern.nnz)
    eye[pattern.diagonal_positions()] = 1.0
    for a in (seeds, where, eye):
        a.setflags(write=False)
    return seeds, where, eye


def _factor(pattern, values):
    """The handles of the factors of the matrices with `values` on `pattern`
    (leading batch axes allowed), factored on the host and stored."""
    _, _, eye = _structure(pattern)

    def host(d):
        batch = d.shape[:-1]
        flat = d.reshape((-1, d.shape[-1]))
        ident = [bool(np.array_equal(row, eye)) for row in flat]
        rows = [row for row, i in zip(flat, ident) if not i]
        made = _sparse_direct._Factored.make_many(pattern, rows) if rows else []
        handles = np.full(len(flat), IDENTITY, np.int32)
        new = [_store.new_handle() for _ in made]
        handles[[k for k, i in enumerate(ident) if not i]] = new
        if made:
            _store.put(new, made, None)  # uncounted: the oldest pushed out
        return (handles.reshape(batch),)

    (h,) = host_call(host, (jax.ShapeDtypeStruct(values.shape[:-1], jnp.int32),), values)
    return h


def _solve_one(pattern, handle: int, d: np.ndarray, b: np.ndarray, transpose: bool,
               conj: bool) -> np.ndarray:
    """`op(A) x = b` with `handle`'s factor of `A` (values `d`); factored
    again if the store let it go. `conj`: with `conj(A)`, by conjugating
    `b` and the solution."""
    if handle == IDENTITY:
        return b.copy()
    lu = _store.get_or_make(pattern, handle, d, None)[1]  # (made again if let go)
    if lu is None:  # exactly singular, or not finite
        return np.full(b.shape, np.nan, b.dtype)
    if conj:
        b = np.conj(b)
    x = _sparse_direct._lu_solve(lu, b, transpose)
    return np.conj(x) if conj else x


def _solve(pattern, handle, values, b, transpose: bool, conj: bool):
    """`op(A) x = b` on the host (leading batch axes allowed: a `vmap`)."""
    def host(h, d, bb):
        if h.ndim == 0:  # one solve (no vmap)
            return (_solve_one(pattern, int(h), d, bb, transpose, conj),)
        batch, examples = _sparse_direct.each_example(h, d, bb)
        out = np.stack([_solve_one(pattern, hi, di, bi, transpose, conj)
                        for hi, di, bi in examples])
        return (out.reshape(batch + bb.shape[-1:]),)

    (x,) = host_call(host, (jax.ShapeDtypeStruct(b.shape, b.dtype),), handle, values, b)
    return x


@functools.lru_cache(maxsize=None)
def sparse_newton_solver():
    """The class `SparseNewtonSolver`, a lineax solver, made on first use
    (see the module docstring); `sparse_newton_solver()(pattern)` is an
    instance. The module's attribute `SparseNewtonSolver` is the same class
    (`__getattr__`)."""
    import equinox as eqx
    import equinox.internal as eqxi
    import lineax as lx
    import lineax.internal as lxi

    class SparseNewtonSolver(lx.AbstractLinearSolver):
        """A lineax solver for square operators whose matrix has the sparsity
        `pattern` (a `sciad.graph._types.Pattern`; the diagonal is added if it
        lacks it): values by colored matrix-vector products, SuperLU on the host
        (see the module docstring). For `diffrax.VeryChord(linear_solver=...)`.

        Entries of the operator outside `pattern` are silently dropped (its
        colored products add them to other entries): the pattern must hold the
        whole structure."""

        pattern: Any = eqx.field(static=True)
        #: `(values, handle)` of a factorization made beforehand (by a solver
        #: that keeps one over steps, `reusing`): `init` then takes it instead
        #: of the operator's
        given: Any = None

        def __init__(self, pattern, given=None):
            if pattern.shape[0] != pattern.shape[1]:
                raise ValueError(f"SparseNewtonSolver needs a square pattern, got {pattern!r}.")
            self.pattern = _with_diagonal(pattern)
            self.given = given

        def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
            del options
            n = self.pattern.shape[0]
            if operator.in_size() != n or operator.out_size() != n:
                raise ValueError(f"SparseNewtonSolver: the operator is {operator.out_size()} x "
                                 f"{operator.in_size()}, its pattern {self.pattern!r}.")
            packed = lxi.pack_structures(operator)
            if self.given is not None:
                values, handle = self.given
                return values, handle, packed, eqxi.Static((False, False))
            seeds, where, _ = _structure(self.pattern)
            dtype = jnp.result_type(*[s.dtype for s in jax.tree_util.tree_leaves(
                operator.in_structure())])

            def product(seed):  # the operator on one color's seed, flat
                out = operator.mv(lxi.unravel_solution(seed, packed))
                return lxi.ravel_vector(out, packed)

            products = jax.vmap(product)(jnp.asarray(seeds, dtype))  # (n_colors, n)
            values = products[where, self.pattern.rows]  # entry (i, j): color(j)'s row i
            handle = _factor(self.pattern, values)
            return values, handle, packed, eqxi.Static((False, False))

        def compute(self, state, vector, options: dict[str, Any]):
            del options
            values, handle, packed, flags = state
            transpose, conj = flags.value
            b = lxi.ravel_vector(vector, packed)
            x = _solve(self.pattern, handle, values, b.astype(values.dtype), transpose, conj)
            return lxi.unravel_solution(x, packed), lx.RESULTS.successful, {}

        def transpose(self, state, options: dict[str, Any]):
            values, handle, packed, flags = state
            transpose, conj = flags.value
            return (values, handle, lxi.transpose_packed_structures(packed),
                    eqxi.Static((not transpose, conj))), {}

        def conj(self, state, options: dict[str, Any]):
            values, handle, packed, flags = state
            transpose, conj = flags.value
            # (values stay A's: the solve conjugates around A's factor)
            return (values, handle, packed, eqxi.Static((transpose, not conj))), {}

        def assume_full_rank(self) -> bool:
            return True

    SparseNewtonSolver.__qualname__ = "SparseNewtonSolver"
    return SparseNewtonSolver


def __getattr__(name: str):
    # `from sciad.solvers.ode._ode import SparseNewtonSolver`: the class, made then
    if name == "SparseNewtonSolver":
        return sparse_newton_solver()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: a factorization kept over steps is made again after this many steps
MAX_AGE = 20
#: a proposed step between 1 and this many times the last is not taken: the
#: step size is held, so that the kept factorization still fits
HOLD = 1.2


def newton_values(pattern, field, t, y, hg):
    """The values of `I - hg df/dy` at `(t, y)` on `pattern` (with its
    diagonal), from one JVP of `field(t, y)` per color (`colored_values`)."""
    jacobian = colored_values(lambda z: field(t, z), pattern, coloring(pattern))(y)
    return jnp.asarray(_structure(pattern)[2], y.dtype) - hg * jacobian


@functools.lru_cache(maxsize=None)
def reusing(cls, gamma: float):
    """`cls` (a diffrax implicit Runge-Kutta solver with the diagonal `gamma`
    and a `VeryChord(linear_solver=sparse_newton_solver()(...))` root finder)
    keeping its Newton matrix's factorization over steps, as BDF codes do.

    Each step needs `I - h gamma J`. The solver state carries the last
    factorization made, its `h gamma` and its age; a step of the same `h
    gamma` (`HoldStepController` holds the step size where the controller
    would change it little) with a factor younger than `MAX_AGE` steps
    solves with it (a Jacobian of an earlier state: chord iterations), any
    other step factors `I - h gamma J(t0, y0)` anew. A kept factor whose
    Newton iterations fail fails the step, whose retry is shorter and so
    factors again; a rejected step's state is dropped. The decision reads
    only the solver's state: a solve's result never depends on other
    solves."""

    import diffrax
    import equinox as eqx

    class Reusing(cls):
        def init(self, terms, t0, t1, y0, args):
            inner = super().init(terms, t0, t1, y0, args)
            pattern = self.root_finder.linear_solver.pattern
            dtype = jnp.result_type(y0)
            return inner, (jnp.zeros((pattern.nnz,), dtype), jnp.zeros((), jnp.int32),
                           jnp.full((), jnp.nan, dtype), jnp.zeros((), jnp.int32))

        def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
            inner, (values, handle, hg_kept, age) = solver_state
            linear = self.root_finder.linear_solver
            hg = gamma * (t1 - t0)
            keep = (jnp.abs(hg - hg_kept) <= 1e-12 * jnp.abs(hg)) & (age < MAX_AGE)

            # (an IMEX method's Newton systems hold its stiff, last, term)
            stiff = terms.terms[-1] if isinstance(terms, diffrax.MultiTerm) else terms

            def fresh(_):
                v = newton_values(linear.pattern, lambda t, z: stiff.vf(t, z, args), t0, y0,
                                  hg)
                return v, _factor(linear.pattern, v)

            values, handle = jax.lax.cond(keep, lambda _: (values, handle), fresh, None)
            me = eqx.tree_at(lambda s: s.root_finder.linear_solver.given, self,
                             (values, handle), is_leaf=lambda x: x is None)
            y1, err, dense, inner, result = super(Reusing, me).step(
                terms, t0, t1, y0, args, inner, made_jump)
            state = (values, handle, jnp.where(keep, hg_kept, hg),
                     jnp.where(keep, age + 1, 1).astype(jnp.int32))
            return y1, err, dense, (inner, state), result

    Reusing.__name__ = Reusing.__qualname__ = f"Reusing{cls.__name__}"
    return Reusing


#: the smallest step, in units of the spacing of floating-point numbers at
#: the step's time (SciPy's rule: "Required step size is less than spacing
#: between numbers"): a step the controller proposes below it ends the
#: integration (status 2) where the solution blows up or the field is
#: singular, instead of shrinking steps until `max_steps`
MIN_STEP_ULPS = 10.0


@functools.lru_cache(maxsize=None)
def floored(base: type) -> type:
    """The step-size controller class `base` (a diffrax `PIDController`)
    that fails with diffrax's `dt_min_reached` where the step it proposes
    is below `MIN_STEP_ULPS` spacings of floating-point numbers at its
    time: no step can make progress there."""
    import diffrax

    class Floored(base):
        def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order,
                            controller_state):
            keep, t0n, t1n, jump, state, result = super().adapt_step_size(
                t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state)
            spacing = jnp.abs(jnp.nextafter(t0n, jnp.asarray(jnp.inf, t0n.dtype)) - t0n)
            small = (t1n - t0n) < MIN_STEP_ULPS * spacing
            result = diffrax.RESULTS.where(small, diffrax.RESULTS.dt_min_reached, result)
            return keep, t0n, t1n, jump, state, result

    Floored.__name__ = Floored.__qualname__ = f"Floored{base.__name__}"
    return Floored


@functools.lru_cache(maxsize=None)
def holding():
    """diffrax's `PIDController` holding the step size where it would grow
    it by at most `HOLD` times (as Hairer and Wanner's RADAU5 does), so
    that a kept factorization (`reusing`) still fits the next step."""
    import diffrax

    class HoldStepController(diffrax.PIDController):
        def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order,
                            controller_state):
            keep, t0n, t1n, jump, state, result = super().adapt_step_size(
                t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state)
            h = t1 - t0
            hold = keep & (t1n - t0n >= h) & (t1n - t0n <= HOLD * h)
            return keep, t0n, jnp.where(hold, t0n + h, t1n), jump, state, result

    return HoldStepController


#: the most chord iterations of a stage (diffrax's `root_find_max_steps`)
CHORD_ITERATIONS = 10


@functools.lru_cache(maxsize=None)
def patient_chord():
    """diffrax's `VeryChord`, patient enough for chord iterations.

    `VeryChord` fails a stage whose iterations have not converged after two,
    and the step with it. A Jacobian of the step's start contracts at a rate
    of about 1e-4 on smooth stretches, but a factorization kept from an
    earlier step (`reusing`) at about 1e-2, and the first steps of a stiff
    transient slower: with `VeryChord` 70% of the kept factors' steps
    failed on a stiff reaction-diffusion problem, and a dense Kvaerno5 took
    67 steps where this takes 26 (a stiff heat equation). This one stops as Hairer
    and Wanner's RADAU5 does: converged when `rate / (1 - rate) |delta| <=
    kappa` (in the tolerance-scaled norm), failed when the rate is 1 or more
    or when `CHORD_ITERATIONS` iterations at that rate could not reach
    `kappa`."""
    import diffrax
    import optimistix as optx

    class PatientChord(diffrax.VeryChord):
        def terminate(self, fn, y, args, options, state, tags):
            del fn, args, options, tags
            two = state.step >= 2
            size = state.diffsize
            rate = size / state.diffsize_prev
            contracts = jnp.isfinite(rate) & (rate < 1)
            small = size < 10.0 ** (2 - jnp.finfo(size.dtype).precision)
            # an update at the iterate's rounding level: the iterate cannot
            # move, so its rate says nothing (KenCarp's stages iterate on
            # h f, whose tolerance scale is atol: a linear stiff part
            # converges in one iteration, and the second's rate of about 1
            # had failed nearly every step of a heat equation)
            dmax, ymax = (jnp.max(jnp.stack([jnp.max(jnp.abs(v)) for v in
                                             jax.tree_util.tree_leaves(tree)]))
                          for tree in (state.diff, y))
            stuck = (state.step >= 1) & (dmax <= 16 * jnp.finfo(dmax.dtype).eps * ymax)
            done = stuck | (two & (small | (contracts & (size * rate / (1 - rate)
                                                          < self.kappa))))
            left = CHORD_ITERATIONS - state.step
            hopeless = ~contracts | (size * rate ** left / (1 - rate) > self.kappa)
            fail = two & ~done & hopeless
            R = optx.RESULTS
            linear_failed = state.result != R.successful
            result = R.where(linear_failed, state.result,
                             R.where(fail, R.nonlinear_divergence, R.successful))
            return linear_failed | done | fail, result

    return PatientChord
