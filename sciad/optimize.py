"""Minimization with SciPy's optimizers and sciad's compiled derivatives.

```python
import numpy as np
import sciad as sd
import sciad.numpy as snp
import sciad.optimize

t = np.linspace(0.0, 2.0, 50)
y = 3.0 * np.exp(-1.5 * t)

def misfit(p, t, y):                        # p: a pytree of float arrays
    pred = p["scale"] * snp.exp(-p["rate"] * t)
    return 0.5 * snp.sum((pred - y) ** 2)

res = sd.optimize.minimize(misfit, {"scale": 1.0, "rate": 0.5}, args=(t, y),
                           bounds=({"scale": 0.0, "rate": 0.0}, None))
res.x["rate"], res.fun, res.nit, res.success   # (array(1.5), ~0, ..., True)
```

`minimize` traces `f` once into a value-and-gradient graph, compiles it with
`sd.function` and hands SciPy a callable that makes one compiled call per
function evaluation (`jac=True`). Methods that use curvature get it from
sciad too: Hessian-vector products (forward over reverse) for Newton-CG,
trust-ncg, trust-krylov and trust-constr, the dense Hessian for dogleg and
trust-exact. The compiled functions are cached per objective and argument
signature, so calling `minimize` again with the same `f` and new values of
`x0` and `args` (same shapes and dtypes) does not retrace or recompile.

`scipy.optimize` is imported by `minimize` when first called (it takes about
0.15 s to import, which `import sciad` does not pay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import numpy as np

from . import numpy as snp, sparse
from ._traceback import api_boundary
from ._compile import _split_args, cached as _cached, compiled_call, to_device as _to_device
from ._function import Function, function
from ._transforms import _in_trace, grad, hvp, jacfwd, value_and_grad
from .errors import (DTypeError, InvalidOptionError, NonFiniteError, NotSupportedError,
                     ShapeError, TracerError, plain)
from .graph import Tracer
from .graph._autodiff import type_of
from .primitives._root import default_tol, root_node, stacked
from .primitives._stop_gradient import stop_gradient
from .solvers.nonlinear._nonlinear import STATUS
from .solvers._registry import lookup, names as _solver_names, records as _solver_records

if TYPE_CHECKING:  # (imported by `minimize` when first called: see the module docstring)
    import scipy.optimize

__all__ = ["minimize", "METHODS", "root", "fixed_point", "RootResult"]

_tree = jax.tree_util
_OP = "optimize.minimize"

METHODS = ("nelder-mead", "powell", "cg", "bfgs", "newton-cg", "l-bfgs-b", "tnc", "cobyla",
           "cobyqa", "slsqp", "trust-constr", "dogleg", "trust-ncg", "trust-exact",
           "trust-krylov")
"""The method names `minimize` accepts (case-insensitive), as in SciPy."""

_VALUE_ONLY = frozenset({"nelder-mead", "powell", "cobyla", "cobyqa"})
_HESSP = frozenset({"newton-cg", "trust-ncg", "trust-krylov", "trust-constr"})
_HESS = frozenset({"dogleg", "trust-exact"})
_BOUNDED = frozenset({"l-bfgs-b", "tnc", "slsqp", "trust-constr", "nelder-mead", "powell",
                      "cobyla", "cobyqa"})


# ---------------------------------------------------------------------------
# x0 as one float64 vector


class _Spec(NamedTuple):
    """How a pytree of float arrays maps to one flat float64 vector: leaves in
    `jax.tree_util` order, each raveled in C order."""

    treedef: Any
    shapes: tuple
    dtypes: tuple
    paths: tuple  # "x0['a'][1]"-style names of the leaves, for messages

    @property
    def sizes(self) -> list[int]:
        return [int(np.prod(s, dtype=np.int64)) for s in self.shapes]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    @property
    def key(self):
        return (self.treedef, self.shapes, self.dtypes)

    def unflatten(self, z: np.ndarray):
        """The pytree of NumPy arrays (each leaf's own dtype) of a flat vector."""
        leaves, start = [], 0
        for shape, dtype, size in zip(self.shapes, self.dtypes, self.sizes):
            leaves.append(np.array(z[start:start + size], dtype=dtype).reshape(shape))
            start += size
        return _tree.tree_unflatten(self.treedef, leaves)

    def unflatten_traced(self, z):
        """The same inside a trace: static slices of the traced vector."""
        if len(self.shapes) == 1 and self.shapes[0] == (self.size,) and \
                self.dtypes[0] == np.float64:
            return _tree.tree_unflatten(self.treedef, [z])
        leaves, start = [], 0
        for shape, dtype, size in zip(self.shapes, self.dtypes, self.sizes):
            leaf = snp.reshape(z[start:start + size], shape)
            if dtype != np.float64:
                leaf = snp.astype(leaf, dtype)
            leaves.append(leaf)
            start += size
        return _tree.tree_unflatten(self.treedef, leaves)

    def name_of(self, i: int) -> str:
        """The flat element `i` by its leaf and index, e.g. `x0['M'][0, 1]`."""
        start = 0
        for path, shape, size in zip(self.paths, self.shapes, self.sizes):
            if i < start + size:
                idx = np.unravel_index(i - start, shape) if shape else ()
                return path + (f"[{', '.join(str(int(k)) for k in idx)}]" if shape else "")
            start += size
        raise IndexError(i)


def _flatten_x0(x0) -> tuple[_Spec, np.ndarray]:
    with_path, treedef = _tree.tree_flatten_with_path(x0)
    if not with_path:
        raise ShapeError("`x0` holds no arrays; give an array or a pytree of float "
                         "arrays.", op=_OP)
    shapes, dtypes, paths, flat = [], [], [], []
    for path, leaf in with_path:
        name = "x0" + _tree.keystr(path)
        if isinstance(leaf, Tracer):
            raise TracerError(f"{name} is a traced value; `minimize` runs SciPy on the host "
                              "and cannot be called inside `sd.function`, `sd.trace` or a "
                              "transform. Call it on concrete arrays.", op=_OP)
        a = np.asarray(leaf)
        t = f"{a.dtype.name}{list(a.shape)}"
        if a.dtype.kind == "c":
            raise DTypeError(f"{name} is complex ({t}); SciPy minimizes over real "
                             "vectors. Optimize its real and imaginary parts as two real "
                             "leaves and rebuild it in `f` as `re + 1j * im`.", op=_OP)
        if a.dtype.kind != "f":
            raise DTypeError(f"{name} must be a float array, got {t}; convert it with "
                             "`.astype(float)` (or write `1.0` for `1`).", op=_OP)
        shapes.append(tuple(a.shape))
        dtypes.append(a.dtype)
        paths.append(name)
        flat.append(a.astype(np.float64).ravel())
    spec = _Spec(treedef, tuple(shapes), tuple(dtypes), tuple(paths))
    if spec.size == 0:
        raise ShapeError("`x0` has no elements to optimize.", op=_OP)
    return spec, np.concatenate(flat)


# ---------------------------------------------------------------------------
# bounds


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.number, np.bool_)) and not isinstance(v, complex)


def _side(b, spec: _Spec, fill: float, which: str) -> np.ndarray:
    """One side of `(lower, upper)` as a flat float64 vector."""
    if b is None:
        return np.full(spec.size, fill)
    if _is_number(b) or (isinstance(b, (np.ndarray, jax.Array)) and np.ndim(b) == 0):
        return np.full(spec.size, float(b))
    try:
        leaves = spec.treedef.flatten_up_to(b)
    except (ValueError, TypeError) as e:
        raise ShapeError(
            f"`{which}` in `bounds=(lower, upper)` must be None, a number, or a pytree with "
            f"x0's structure {spec.treedef}; got {type(b).__name__} ({e}). For SciPy's "
            "per-element `(lo, hi)` pairs, pass `scipy.optimize.Bounds(lb, ub)` over the "
            "flattened x0.", op=_OP) from None
    out = []
    for leaf, shape, path in zip(leaves, spec.shapes, spec.paths):
        name = f"{which} for {path}"
        if leaf is None:
            out.append(np.full(int(np.prod(shape, dtype=np.int64)), fill))
            continue
        if isinstance(leaf, (list, tuple, dict)):
            hint = (f"SciPy's per-element `(lo, hi)` pairs must number x0.size = {spec.size}"
                    if spec.treedef.num_nodes == 1 else "for SciPy's per-element `(lo, hi)` "
                    "pairs, pass `scipy.optimize.Bounds(lb, ub)` over the flattened x0")
            raise ShapeError(f"{name} is a {type(leaf).__name__}; give a number, None or an "
                             f"array that broadcasts to {shape} ({hint}).", op=_OP)
        a = np.asarray(leaf)
        if a.dtype.kind not in "biuf":
            raise ShapeError(f"{name} must be real numbers, got {a.dtype.name}.", op=_OP)
        try:
            a = np.broadcast_to(a.astype(np.float64), shape)
        except ValueError:
            raise ShapeError(f"{name} has shape {a.shape}, which does not broadcast to the "
                             f"leaf's shape {shape}.", op=_OP) from None
        out.append(a.ravel())
    return np.concatenate(out)


def _scipy_pairs(bounds, n: int) -> bool:
    """Whether `bounds` is SciPy's sequence of `n` `(lo, hi)` pairs of numbers
    (or None)."""
    def pair(p):
        return isinstance(p, (list, tuple)) and len(p) == 2 and all(
            q is None or _is_number(q) for q in p)

    return isinstance(bounds, (list, tuple)) and len(bounds) == n and all(map(pair, bounds))


def _fits(spec: _Spec, tree) -> bool:
    try:
        spec.treedef.flatten_up_to(tree)
        return True
    except (ValueError, TypeError):
        return False


def _flat_bounds(bounds, spec: _Spec) -> scipy.optimize.Bounds:
    import scipy.optimize

    n = spec.size
    if isinstance(bounds, scipy.optimize.Bounds):
        sides = []
        for which, v in (("lb", bounds.lb), ("ub", bounds.ub)):
            a = np.asarray(v, dtype=np.float64)
            try:
                sides.append(np.broadcast_to(a, (n,)).copy())
            except ValueError:
                raise ShapeError(f"`Bounds.{which}` has shape {a.shape}; give a number or "
                                 f"{n} values, one per element of the flattened x0 (leaves "
                                 "in `jax.tree_util` order, each raveled).", op=_OP) from None
        lb, ub = sides
        keep = np.broadcast_to(np.asarray(bounds.keep_feasible, bool), (n,))
    elif spec.treedef.num_nodes == 1 and _scipy_pairs(bounds, n):
        # x0 is one array: a pair `(lower, upper)` cannot hold tuples, so this
        # reads only as SciPy's per-element pairs (C order).
        lb = np.array([-np.inf if lo is None else lo for lo, _ in bounds], np.float64)
        ub = np.array([np.inf if hi is None else hi for _, hi in bounds], np.float64)
        keep = False
    elif isinstance(bounds, (list, tuple)) and len(bounds) == 2:
        if _scipy_pairs(bounds, n) and _fits(spec, bounds[0]):
            raise InvalidOptionError(
                f"`bounds={bounds!r}` is ambiguous for this x0 of two scalars: it reads both "
                "as SciPy's per-element `(lo, hi)` pairs and as `(lower, upper)`. Pass "
                "`scipy.optimize.Bounds(lb, ub)`.", op=_OP)
        lb = _side(bounds[0], spec, -np.inf, "lower")
        ub = _side(bounds[1], spec, np.inf, "upper")
        keep = False
    else:
        raise ShapeError(
            "`bounds` must be a pair `(lower, upper)` (each None, a number, or a pytree with "
            "x0's structure whose leaves broadcast to x0's leaves), a "
            "`scipy.optimize.Bounds`, or, for an x0 that is one array, SciPy's sequence of "
            f"x0.size `(lo, hi)` pairs; got {type(bounds).__name__}"
            + (f" of length {len(bounds)}" if isinstance(bounds, (list, tuple)) else "")
            + ". For per-element `(lo, hi)` pairs over a pytree x0, pass "
            "`scipy.optimize.Bounds(*np.transpose(pairs))` over the flattened x0.", op=_OP)
    for name, side in (("lower", lb), ("upper", ub)):
        bad = np.flatnonzero(np.isnan(side))
        if bad.size:
            raise InvalidOptionError(f"the {name} bound of {spec.name_of(int(bad[0]))} is NaN; use "
                                     "None or ±inf for no bound.", op=_OP)
    bad = np.flatnonzero(lb > ub)
    if bad.size:
        i = int(bad[0])
        raise InvalidOptionError(f"the lower bound of {spec.name_of(i)} is above its upper bound: "
                                 f"{lb[i]} > {ub[i]}.", op=_OP)
    return scipy.optimize.Bounds(lb, ub, keep_feasible=keep)


# ---------------------------------------------------------------------------
# compiled objective, gradient and curvature, cached per objective


def _check_scalar(out) -> None:
    if isinstance(out, (tuple, list, dict)) or out is None:
        raise ShapeError(f"`f` must return a real scalar (the objective), got a "
                         f"{type(out).__name__}.", op=_OP)
    t = type_of(out)
    if getattr(t, "shape", None) != () or t.dtype.kind != "f":
        raise ShapeError(f"`f` must return a real scalar (the objective), got "
                         f"{t.str_short()}. Reduce it to one number (e.g. `snp.sum(r**2)` "
                         "for residuals `r`).", op=_OP)


def _build(fref: Callable, spec: _Spec, kind: str) -> Function:
    name = getattr(fref(), "__name__", "objective")

    def objective(z, *args):
        x = spec.unflatten_traced(z)
        out = fref()(x, *args)
        _check_scalar(out)
        return out

    objective.__name__ = objective.__qualname__ = name
    if kind == "value":
        return function(objective)
    if kind == "value_and_grad":
        return function(value_and_grad(objective))
    if kind == "hessp":
        def hessp(z, p, *args):
            return hvp(lambda y: objective(y, *args), z, p)

        hessp.__name__ = f"hvp_{name}"
        return function(hessp)
    assert kind == "hess"

    def hess(z, *args):
        return jacfwd(grad(objective))(z, *args)

    hess.__name__ = f"hessian_{name}"
    return function(hess)


def _compiled(f: Callable, spec: _Spec, kind: str) -> Function:
    """`f`'s compiled `kind` ("value", "value_and_grad", "hessp", "hess") for
    this x0 layout; `sd.function` caches per signature of the arguments."""
    return _cached(f, (spec.key, kind), lambda fref: _build(fref, spec, kind))


# ---------------------------------------------------------------------------
# minimize


@api_boundary
def minimize(f: Callable, x0, args=(), method: str | Callable = "L-BFGS-B", bounds=None,
             tol: float | None = None, callback: Callable | None = None,
             options: dict | None = None) -> scipy.optimize.OptimizeResult:
    """Minimizes a real scalar function of a pytree of float arrays with
    `scipy.optimize.minimize`, its gradient (and curvature) from sciad.

    **Arguments:**

    - `f`: `f(x, *args)` returns a real scalar; `x` has `x0`'s structure,
      shapes and dtypes. Written with `sciad.numpy` and primitives.
    - `x0`: the starting point, an array or a pytree (dict, tuple, nested) of
      float arrays; a list is a pytree node, as in JAX, so pass `np.array([...])`
      for a vector. Complex and integer leaves are refused: optimize a complex
      value's real and imaginary parts as two leaves.
    - `args`: extra arguments of `f` (arrays or pytrees of arrays, a single one
      needs no tuple). They are inputs of the compiled program, not constants:
      new values with the same shapes and dtypes do not recompile. They are
      not differentiated.
    - `method`: a SciPy method name (case-insensitive, see `METHODS`) or a
      custom minimizer callable, as in SciPy. Gradient-based methods get the
      gradient with the value, in one compiled call per evaluation;
      Newton-CG, trust-ncg, trust-krylov and trust-constr also get
      Hessian-vector products; dogleg and trust-exact the dense Hessian
      (`x0.size` forward passes each, for small problems); Nelder-Mead,
      Powell, COBYLA and COBYQA only the value.
    - `bounds`: None, a pair `(lower, upper)`, or a `scipy.optimize.Bounds`.
      `lower` and `upper` are each None (unbounded), a number (for every
      element), or a pytree with `x0`'s structure whose leaves are None,
      numbers or arrays broadcasting to the matching leaf of `x0`:
      `bounds=({"w": 0.0, "b": None}, None)` keeps `w >= 0`. A `Bounds`
      applies to the flattened x0 (leaves in `jax.tree_util` order, each
      raveled in C order). When `x0` is a single array, SciPy's sequence of
      `x0.size` pairs `(lo, hi)` (numbers or None) works too; for a pytree
      `x0`, pass such pairs as `Bounds(*np.transpose(pairs))`. `x0` is
      clipped into the bounds.
      Methods: L-BFGS-B, TNC, SLSQP, trust-constr and the value-only ones.
    - `tol`: SciPy's `tol`.
    - `callback`: `callback(x)`, called once per iteration with the current
      iterate as a pytree of NumPy arrays like `x0`. As in SciPy, raising
      `StopIteration` in it ends the run (`status` 99) for most methods.
    - `options`: SciPy's method options (`maxiter`, `gtol`, `disp`, ...).

    **Returns:**

    SciPy's `OptimizeResult`, with `x` (and `jac`, the gradient at `x`, and
    `allvecs` with `return_all`) as pytrees of NumPy arrays like `x0`; `fun`,
    `nit`, `nfev`, `njev`, `success`, `status`, `message` as SciPy gives them.
    Matrices over the variables (`hess_inv`) refer to the flattened x0. For
    trust-constr the objective's gradient is `grad` (`jac` stays SciPy's
    constraint Jacobians).

    **Raises:**

    `DTypeError` for complex or integer leaves of `x0`; `ShapeError` when `f`
    does not return a real scalar or `bounds` do not fit `x0`;
    `NotSupportedError` for bounds with a method that ignores them;
    `NonFiniteError` (a `FloatingPointError`) when the value or the gradient
    is not finite at `x0`.

    The compiled functions are cached on `f` (held weakly): another call
    with the same `f` and arrays of the same shapes reuses them. As with
    `sd.function`, arrays `f` reads from its enclosing scope are frozen when
    it is first traced; pass data that changes through `args`.

    **Example:**

    ```python
    import numpy as np, sciad as sd

    rosen = lambda z: (1 - z[0]) ** 2 + 100 * (z[1] - z[0] ** 2) ** 2
    res = sd.optimize.minimize(rosen, np.zeros(2))                # L-BFGS-B on compiled gradients
    res.success                                                   # True
    res.x                                                         # [0.99999971 0.9999994 ]
    ```
    """
    import scipy.optimize

    spec, z0 = _flatten_x0(x0)
    if not isinstance(args, tuple):
        args = (args,)
    if callable(method):
        meth = "_custom"
    elif isinstance(method, str) and method.lower() in METHODS:
        meth = method.lower()
    else:
        raise InvalidOptionError(f"unknown method {method!r}; choose one of {', '.join(METHODS)} "
                                 "(any case) or pass a minimizer callable.", op=_OP)

    kw: dict = {}
    if bounds is not None:
        if meth not in _BOUNDED and meth != "_custom":
            raise NotSupportedError(
                f"method {method!r} does not take bounds (SciPy would ignore them); use one "
                "of 'L-BFGS-B', 'TNC', 'SLSQP', 'trust-constr'.", op=_OP)
        kw["bounds"] = b = _flat_bounds(bounds, spec)
        z0 = np.clip(z0, b.lb, b.ub)

    args = _to_device(args)
    value_only = meth in _VALUE_ONLY
    fn = _compiled(f, spec, "value" if value_only else "value_and_grad")

    def evaluate(z):
        out = fn(z, *args)
        if value_only:
            return float(out)
        v, g = out
        return float(v), np.array(g, dtype=np.float64)

    first = evaluate(z0)
    v0, g0 = (first, None) if value_only else first
    if not np.isfinite(v0):
        raise NonFiniteError(f"the objective is {v0} at x0; start from a point where `f` "
                             "is finite.", op=_OP)
    if g0 is not None and not np.all(np.isfinite(g0)):
        bad = np.flatnonzero(~np.isfinite(g0))
        raise NonFiniteError(f"the gradient is not finite at x0: {bad.size} of {g0.size} "
                             f"elements, first {spec.name_of(int(bad[0]))} = "
                             f"{g0[bad[0]]}; start from a point where `f` is smooth.",
                             op=_OP)

    pending = [(z0.copy(), first)]  # SciPy's first evaluation is at z0: reuse it

    def fun(z):
        if pending:
            zp, out = pending.pop()
            if np.array_equal(z, zp):
                return out
        return evaluate(z)

    if not value_only:
        kw["jac"] = True
    if meth in _HESSP:
        hp = _compiled(f, spec, "hessp")
        kw["hessp"] = lambda z, p: np.array(hp(z, np.asarray(p, np.float64), *args),
                                            dtype=np.float64)
    elif meth in _HESS:
        hs = _compiled(f, spec, "hess")
        kw["hess"] = lambda z: np.array(hs(z, *args), dtype=np.float64)
    if callback is not None:
        def scipy_callback(xk, *_):  # trust-constr passes (x, state)
            return callback(spec.unflatten(np.asarray(xk)))

        kw["callback"] = scipy_callback

    res = scipy.optimize.minimize(fun, z0, method=method, tol=tol, options=options, **kw)

    res.x = spec.unflatten(np.asarray(res.x))
    grad_key = "grad" if meth == "trust-constr" else "jac"
    if grad_key in res and np.shape(res[grad_key]) == (spec.size,):
        res[grad_key] = spec.unflatten(np.asarray(res[grad_key]))
    if "allvecs" in res:
        res.allvecs = [spec.unflatten(np.asarray(v)) for v in res.allvecs]
    return res


# ---------------------------------------------------------------------------
# root and fixed_point


class RootResult(NamedTuple):
    """The result of `root` and `fixed_point` (SciPy's names)."""

    #: the root (of `x0`'s shape)
    x: Any
    #: whether the solve converged (a bool, traced inside a trace)
    success: Any
    #: the iterations taken
    nit: Any
    #: `||F(x)||_inf`, the residual's largest entry in magnitude
    residual: Any
    #: 0 converged, 1 iteration limit, 2 singular Jacobian, 3 line search
    #: failed, 4 non-finite residual, 5 stagnation
    status: Any
    #: the residual at `x`, SciPy's `fun`: `fun(x, *args)` (a list or tuple
    #: stacked), or `f(x, *args) - x` for `fixed_point`; from a call outside
    #: a trace (inside one it is None, so that the traced graph holds no
    #: second copy of `fun`: evaluate `fun(res.x, *args)` where it is needed)
    fun: Any = None
    #: the tolerances the solve was given (`tol` relative, for the step
    #: test; `atol` absolute, for the residual test) and its kind ("root" or
    #: "fixed_point"), which `message` reads to say which test stopped it
    tol: Any = None
    atol: Any = None
    kind: str = "root"

    @property
    def message(self) -> str:
        """SciPy's `message`: what stopped the solve; for a success, which
        test it passed and with what margin (as `success`, known when it has
        run: a call outside a trace, or the program's values)."""
        status = int(self.status)
        if status != 0 or self.atol is None:
            return STATUS.get(status, "unknown status")
        tol = default_tol(np.asarray(self.x).dtype) if self.tol is None else self.tol
        r, atol, tol = float(self.residual), float(self.atol), float(tol)
        if self.kind == "fixed_point":
            what = "||G(x) - x||_inf"
            if r <= atol:
                return f"converged: {what} = {r:.3g} <= atol = {atol:.3g} (the absolute test)"
            return (f"converged: {what} = {r:.3g} <= tol ||x||_inf (tol = {tol:.3g}; the "
                    f"relative test: above atol = {atol:.3g})")
        if r <= atol:
            return (f"converged by the residual test: ||F(x)||_inf = {r:.3g} <= atol = "
                    f"{atol:.3g}")
        return (f"converged by the step test: the error in x estimated from the last step "
                f"is at most tol = {tol:.3g} relative to ||x||_inf (||F(x)||_inf = {r:.3g}, "
                f"above atol = {atol:.3g})")


# (the tolerances and kind are static: a program returning a RootResult
# returns its arrays, and these come back as they were given)
jax.tree_util.register_pytree_node(
    RootResult, lambda r: (tuple(r[:6]), tuple(r[6:])),
    lambda static, leaves: RootResult(*leaves, *static))


_ROOT_OP = "optimize.root"
def _root_inline(fun: Callable, x0, args, *, kind: str, method: str, jac, tol: float,
                 atol: float, maxiter: int, memory: int, throw: bool, op: str,
                 jac0=None, at_floor: bool = False, with_fun: bool = False) -> RootResult:
    """The root node in the current trace, as a `RootResult`; `with_fun`:
    its `fun` too, `fun` evaluated at the root (one more evaluation in the
    program: only for a call outside a trace, whose program is sciad's own,
    so that a user's traced graph holds no second copy of `fun`)."""
    values, _, rebuild = _split_args(args)
    start = None if jac0 is None else (
        lambda jac, pattern, tx: _start_matrix(jac0, jac, pattern, tx, op))
    o = root_node(lambda x, *ls: fun(x, *rebuild(ls)), x0, values,
                  name=getattr(fun, "__name__", "fun"), kind=kind, method=method, jac=jac,
                  tol=tol, atol=atol, maxiter=maxiter, memory=memory, throw=throw, op=op,
                  start=start, at_floor=at_floor)
    tests = dict(tol=tol, atol=atol, kind=kind)
    if not with_fun:
        return RootResult(o.x, o.status == 0, o.nit, o.residual, o.status, **tests)
    out = fun(o.x, *args)
    if isinstance(out, (tuple, list)):
        out = stacked(out, op)
    out = snp.asarray(out)
    return RootResult(o.x, o.status == 0, o.nit, o.residual, o.status,
                      out - o.x if kind == "fixed_point" else out, **tests)


def _start_matrix(jac0, jac: str, pattern, tx, op: str):
    """`root(jac0=...)`'s matrix as the node's operand: its values on the
    detected pattern (sparse) or the dense matrix, without derivative."""
    n = tx.size
    on_pattern = lookup(jac, "jacobian").sparse
    if sparse.issparse(jac0):
        t = type_of(jac0)
        if on_pattern and t.pattern != pattern:
            raise ShapeError(f"`jac0` must be on the Jacobian's detected pattern "
                             f"({pattern.shape}, {pattern.nnz} entries), got {t.pattern.shape} "
                             f"with {t.pattern.nnz}: build it from `fun` "
                             f"(sd.sparse.jacobian), or pass a dense array.", op=op)
        jac0 = sparse.data(jac0) if on_pattern else sparse.todense(jac0)
    else:
        jac0 = snp.asarray(jac0)
        if type_of(jac0).shape != (n, n):
            raise ShapeError(f"`jac0` must be an ({n}, {n}) matrix (x has {n} elements), "
                             f"got {type_of(jac0).str_short()}.", op=op)
        if on_pattern:
            jac0 = sparse.data(sparse.sample(jac0, pattern))
    return stop_gradient(snp.astype(jac0, tx.dtype))


def _root_call(fun: Callable, x0, args, op: str, jac0=None, **kw) -> RootResult:
    if not isinstance(args, tuple):
        args = (args,)
    if not callable(fun):
        raise DTypeError(f"`fun` must be a function, got {type(fun).__name__}.", op=op)
    if jac0 is not None and not lookup(kw["method"], "root").takes_jac0:
        raise InvalidOptionError(f"`jac0` starts the chord method: it needs method='chord', got "
                                 f"{kw['method']!r}.", op=op)
    if _in_trace((x0, args, jac0)):
        return _root_inline(fun, x0, args, op=op, jac0=jac0, **kw)
    leading = (x0,) if jac0 is None else (x0, jac0)
    x, success, nit, residual, status, fx = compiled_call(
        lambda fun, x0, *a: tuple(_root_inline(fun, x0, a[-1], op=op,
                                               jac0=a[0] if len(a) == 2 else None,
                                               with_fun=True, **kw))[:6],
        fun, leading, args, key=(op, jac0 is None, tuple(sorted(kw.items()))), name="root")
    return RootResult(x, bool(success), int(nit), float(residual), int(status), fx,
                      tol=kw["tol"], atol=kw["atol"], kind=kw["kind"])


def _root_method(method, kind: str, op: str):
    """The root method record `method` names (case-insensitive), of `kind`."""
    known = [r.name for r in _solver_records("root") if r.kind == kind]
    name = method.lower() if isinstance(method, str) else method
    if name not in known:
        raise InvalidOptionError(f"`method` must be one of {', '.join(map(repr, known))}, got "
                                 f"{method!r}.", op=op)
    return lookup(name, "root")


@api_boundary
def root(fun: Callable, x0, args=(), method: str = "newton", jac: str | None = None,
         tol: float | None = None, atol: float = 0.0, maxiter: int | None = None,
         throw: bool = True, jac0=None, at_floor: bool = False, *, callback=None,
         options=None) -> RootResult:
    """Solves `fun(x, *args) = 0`, as one differentiable node.

    The whole solve is one `optimize.root` node holding `fun`'s graph; it
    runs Newton's method with a backtracking line search in the compiled
    program. The iterations are never differentiated: the derivative of the
    root comes from the implicit function theorem at the root, `dx =
    -(dF/dx)^-1 (dF/dargs) dargs`, one linear solve with the Jacobian at the
    root (its transpose in reverse mode, with the same factorization), so
    `sd.grad`, `sd.jvp`, `sd.hvp` and `jax.grad(sd.to_jax(...))` through a
    root are exact whatever the iteration did, at any order.

    **Arguments:**

    - `fun`: the residual, `fun(x, *args) -> F`, written with sciad ops; `F`
      has as many elements as `x`. As in SciPy, `F` may be a list or tuple
      (of numbers, or of equal-shaped arrays), stacked into one array.
    - `x0`: the starting point, a real float array of any shape.
    - `args`: extra arguments (a tuple of arrays or pytrees); derivatives
      with respect to them flow through the root.
    - `method`: `"newton"`; `"chord"` (Newton keeping the Jacobian's
      factorization while each iteration at least halves `||F||_inf`, and
      factoring again when one does not: for expensive Jacobians and good
      starting points, such as the stages of an implicit time step; needs a
      sparse or dense `jac`); or `"newton_krylov"` (Newton with matrix-free
      GMRES steps, the same as `jac="gmres"`); or SciPy's globalized
      methods, which a singular Jacobian does not stop (SciPy's
      pressure-network problem from `x0 = [2, 0, 2, 0]`, where Newton's
      first Jacobian has rank 3): `"hybr"` (Powell's dogleg in a trust
      region, as SciPy's default, though with the Jacobian formed at each
      accepted iterate where MINPACK updates it by Broyden's formula) and
      `"lm"` (Levenberg-Marquardt); both step with the dense Jacobian
      (`jac="dense"` or None) and count rejected steps as iterations; as
      SciPy's, they flatten `x0` (`fun` sees, and the result holds, a 1-D
      `x`). The
      derivatives are the same whatever the method: the implicit function
      theorem at the root (which must be regular there).
    - `jac`: how the Jacobian `dF/dx` is formed and solved, in Newton's steps
      and in the derivatives:
        - `"sparse"`: its pattern detected from `fun`'s graph
          (`sd.sparse.jacobian_sparsity`), its values from one JVP per color
          of the pattern's columns, solved by sparse LU (SuperLU);
        - `"klu"`: the same sparse Jacobian, factored and solved by KLU
          compiled into the program (the CPU, klujax installed): no host
          call per iteration and no factorization kept (the derivatives
          factor the Jacobian at the root again, in the program); faster
          than `"sparse"` where the iterations are many small solves;
        - `"band"`: the same sparse Jacobian where its pattern is a narrow
          band (a method of lines in one dimension; at most 64 sub- plus
          superdiagonals, as it is or after a reverse Cuthill-McKee
          ordering), factored by sciad's banded LU in the program (the
          CPU); with `method="chord"` the factor is kept over the
          iterations (one factorization per solve); the derivatives solve
          as `"klu"`'s do. A pattern that is no narrow band is refused;
        - `"dense"`: by forward mode, solved by dense LU;
        - `"gmres"`: matrix-free (JVPs of `fun`), solved by GMRES;
        - `None` (the default): dense up to 64 unknowns or where the
          detected pattern fills more than a fifth of the matrix, else sparse.
    - `tol`, `atol`: converged when `||F(x)||_inf <= atol` (the residual
      test), or when the error in `x` estimated from the last step `s`
      (`||d - s||_inf + ||s||_inf min(1, ||F(x)||_inf / ||F(x_prev)||_inf)`,
      `d` the full Newton step: what the step left of it, plus the next
      step predicted from this one and the fall of `||F||`) is at most
      `tol ||x||_inf` (the step test: a relative error of `tol` in `x`,
      as SciPy's `xtol`; a linear `fun` passes after one step). Neither
      depends on `x0`: a far start does not loosen them. A root at `x = 0`
      has no relative accuracy: give `atol` there. `tol=None`: 1e-10 in
      float64, 1.2e-4 in float32. The implicit derivative is computed at
      the root found, so it is as accurate as the root (to first order,
      a relative error `tol` in `x` is one in the derivative).
    - `maxiter`: the most iterations (each evaluates `fun` once). `None`:
      50 for Newton's methods; for `"hybr"` and `"lm"`, SciPy's budgets of
      evaluations, `200 (n + 1)` and `100 (n + 1)` for `n` unknowns
      (their rejected steps count: each evaluates `fun`).
    - `throw`: raise `sciad.errors.ConvergenceError` when the solve fails
      (the default), with the iterations, the residual, the estimated error
      and a diagnosis (iteration limit, singular Jacobian, failed line search,
      non-finite values, stagnation). With `throw=False` the result says so
      (`success`, `status`), and a derivative of a failed solve raises.
    - `jac0` (the chord method): the matrix its first iterations solve with,
      instead of the Jacobian at `x0`: a sparse matrix on the pattern
      detected from `fun` (`sd.sparse.jacobian` of `fun` builds one) or a
      dense `(n, n)` array, for instance a Jacobian at a nearby point. It is
      factored again only where the iterations stop contracting. With
      `jac="sparse"`, roots given the same matrix values share one
      factorization (the stages of an implicit time step). No derivative
      flows through it: the root's does not depend on it.
    - `callback`, `options`: SciPy's, refused by name (`InvalidOptionError`):
      the iterations run in the compiled program, and `tol`, `atol`,
      `maxiter` are the options. So is a SciPy `jac=True` or Jacobian
      function: sciad derives the Jacobian from `fun`'s graph.
    - `at_floor`: also converged when the iterations stall (or run out) with
      `||F||_inf` at its floor of rounding errors, measured at the last
      iterate (how much `F` changes when `x` moves by a few units in its
      last place), where the tolerance asks for more than floating point
      allows: for a tolerance that is not known to be reachable. By default
      such a solve fails, saying that `||F||` is at its floor.

    **Returns:**

    A `RootResult`: `x` (the root, of `x0`'s shape), `success`, `nit`,
    `residual` (`||F(x)||_inf`) and `status`, traced values inside a trace
    and Python numbers outside.

    **Example:**

    ```python
    import numpy as np, sciad as sd

    res = sd.optimize.root(lambda x, a: x ** 2 - a, np.array(1.0), (2.0,))
    res.success, float(res.x)                                     # (True, 1.4142135623746899)
    # the derivative of the root in `a`, by the implicit function theorem:
    sd.grad(lambda a: sd.optimize.root(lambda x, a: x ** 2 - a, np.array(1.0), (a,)).x)(2.0)
    # 0.35355339059287505
    ```
    """
    if jac is True or callable(jac) or (jac is not None and not isinstance(jac, str)):
        raise InvalidOptionError(f"`jac` names how sciad forms and solves the Jacobian ('sparse', "
                                 f"'dense', 'gmres' or None), got {plain(jac)}: SciPy's "
                                 "jac=True or a Jacobian function is not taken, because sciad "
                                 "derives the Jacobian from `fun`'s graph (exact, and what the "
                                 "root's derivatives use). Return only the residual.",
                                 op=_ROOT_OP)
    if callback is not None:
        raise InvalidOptionError("`callback` is not taken: the iterations run inside the "
                                 "compiled program; the result reports `nit`, `residual` and "
                                 "`status`.", op=_ROOT_OP)
    if options is not None:
        raise InvalidOptionError(f"`options` (SciPy's per-method dict, got {plain(options)}) is "
                                 "not taken: pass `tol` (the relative error in x), `atol` (a bound "
                                 "on ||F||_inf) and `maxiter`.", op=_ROOT_OP)
    record = _root_method(method, "root", _ROOT_OP)
    if record.jac is not None:  # (newton_krylov: Newton with a fixed Jacobian form)
        if jac not in (None, record.jac):
            raise InvalidOptionError(f"method={record.name!r} is matrix-free; got jac={jac!r}."
                                     if lookup(record.jac, "jacobian").matrix_free else
                                     f"method={record.name!r} takes jac={record.jac!r}; got "
                                     f"jac={jac!r}.", op=_ROOT_OP)
        jac = record.jac
    elif record.chord and jac in _solver_names("jacobian") \
            and lookup(jac, "jacobian").matrix_free:
        raise InvalidOptionError(f"method={record.name!r} keeps a factorization of the Jacobian: "
                                 f"it needs jac='sparse', 'dense' or None, got jac={jac!r}.",
                                 op=_ROOT_OP)
    method = record.node_method or record.name
    if record.flattens_x0:  # as SciPy's hybr and lm: fun sees, and root returns, a 1-D x
        x0 = snp.ravel(snp.asarray(x0))
    if maxiter is None:
        n = type_of(x0).size if isinstance(x0, Tracer) else int(np.size(np.asarray(x0)))
        maxiter = record.default_maxiter(n)
    return _root_call(fun, x0, args, _ROOT_OP, kind="root", method=method, jac=jac,
                      tol=tol, atol=atol, maxiter=maxiter, memory=0, throw=throw, jac0=jac0,
                      at_floor=bool(at_floor))


@api_boundary
def fixed_point(f: Callable, x0, args=(), method: str = "anderson", memory: int = 5,
                jac: str | None = "gmres", tol: float | None = None, atol: float = 0.0,
                maxiter: int = 500, throw: bool = True) -> RootResult:
    """Solves `x = f(x, *args)`, as one differentiable node.

    Iterates `x <- f(x)` with Anderson acceleration (mixing the last
    `memory` iterates; `memory=0` or `method="picard"` is the plain
    iteration) in the compiled program. As for `root`, the derivative of
    the fixed point comes from the implicit function theorem, `dx = (I -
    df/dx)^-1 (df/dargs) dargs`, never from the iterations.

    **Arguments:**

    - `f`: the map, `f(x, *args) -> x'` of `x`'s shape.
    - `x0`, `args`: as for `root`.
    - `method`: `"anderson"` or `"picard"`.
    - `memory`: Anderson's depth.
    - `jac`: how the derivatives solve with `I - df/dx`: `"gmres"` (the
      default: matrix-free, the natural choice for a contraction),
      `"sparse"` (pattern detected from `f`'s graph) or `"dense"`.
    - `tol`, `atol`: converged when `||f(x) - x||_inf`, the next plain
      step, is at most `max(atol, tol ||x||_inf)` (a fixed point at `x = 0`
      needs `atol`); `tol=None`: 1e-10 in float64, 1.2e-4 in float32.
    - `maxiter`, `throw`: as for `root`.

    **Returns:**

    A `RootResult`, as for `root`; `residual` is `||f(x) - x||_inf`.
    """
    op = "optimize.fixed_point"
    record = _root_method(method, "fixed_point", op)
    if record.memory is not None:  # (picard: Anderson of depth 0)
        memory = record.memory
    if not isinstance(memory, (int, np.integer)) or memory < 0:
        raise InvalidOptionError(f"`memory` must be an int >= 0, got {plain(memory)}.", op=op)
    return _root_call(f, x0, args, op, kind="fixed_point",
                      method=record.node_method or record.name, jac=jac,
                      tol=tol, atol=atol, maxiter=maxiter, memory=int(memory), throw=throw)
