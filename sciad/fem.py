"""Finite elements on scikit-fem: forms assembled with sciad coefficients.

```python
import skfem, sciad as sd, sciad.numpy as snp
from skfem.helpers import dot, grad

basis = skfem.Basis(skfem.MeshTri().refined(4), skfem.ElementTriP1())

@skfem.BilinearForm
def stiffness(u, v, w):
    return w.k * dot(grad(u), grad(v))

@skfem.LinearForm
def load(v, w):
    return 1.0 * v

def misfit(m):                                   # m: one value per mesh node
    K = sd.fem.assemble(stiffness, basis, k=snp.exp(m))
    f = sd.fem.assemble(load, basis)
    u = sd.fem.solve(*sd.fem.condense(K, f, D=basis.get_dofs()))
    return 0.5 * snp.sum((u - d) ** 2)

sd.grad(misfit)(m)
```

A form is a scikit-fem `BilinearForm`, `LinearForm` or `Functional`,
written as scikit-fem users write them (with `skfem.helpers`). Its
coefficients are sciad values (or NumPy arrays), passed by keyword as to
`form.assemble(basis, **coefficients)`: a nodal array (`basis.N` entries,
interpolated to the quadrature points with its derivatives, as
`basis.interpolate` does: `w.k`, `grad(w.k)`), an element-wise array
(`nelems` entries, or `(..., nelems, 1)`), quadrature values
`(..., nelems, nqp)`, or a scalar. The result equals scikit-fem's (to
rounding) and is differentiable in every coefficient, to any order.

How: the sparsity pattern, the element-to-entry index and the basis
functions of every (trial, test) pair, laid side by side along the element
axis, are computed once per basis (pair) and kept. The form function then
runs once per trace, on arrays of `nbasis_u * nbasis_v * nelems` "elements"
(NumPy for the basis functions, sciad values for the coefficients), so the
traced program holds a few vectorized nodes and a single scatter of the
element contributions into the pattern (`sparse.assemble`), whatever the
mesh size; its derivative is one gather.

Boundary conditions: `condense` (scikit-fem's semantics: Dirichlet values
eliminated, their derivative included) and `solve`; Neumann and Robin terms
are forms on a `skfem.FacetBasis`, assembled the same way. `probes` and
`probes` observes a nodal field at points (a constant sparse operator);
`interpolate` gives a nodal field at the quadrature points of a basis, to
pass to a form on another one.

This module, and scikit-fem with it, is imported on first use (`sd.fem`, or
`import sciad.fem`), not by `import sciad`.
"""

from __future__ import annotations

import difflib
import numbers
import sys
import weakref
from typing import Any, Iterable

import numpy as np
from skfem import BilinearForm, Functional, LinearForm
from skfem.assembly.form.form import FormExtraParams
from skfem.element import DiscreteField, ElementVector

from . import _traceback, linalg as _linalg, numpy as snp
from .errors import DTypeError, InvalidOptionError, MissingCoefficientError, ShapeError
from .graph import Tracer
from .graph._types import Pattern, SparseArray, SparseType
from .primitives._sparse import IndexMap, assemble_at, gather
from .sparse import _check_tags, _tags, issparse

__all__ = ["assemble", "condense", "solve", "interpolate", "probes", "FieldTracer"]

_ATTRS = DiscreteField._extra_attrs  # grad, div, curl, hess, ... (after the value)


class FieldTracer(Tracer):
    """A traced coefficient at quadrature points with its derivatives as
    attributes (`grad`, `div`, `hess`, ... as a scikit-fem `DiscreteField`;
    `None` where the element has none), so `skfem.helpers.grad(w.k)` works
    on a traced `w.k`. A derivative is traced when the form first reads it."""

    __slots__ = ("_extras",)

    @classmethod
    def of(cls, value: Tracer, extras: dict[str, Any]) -> "FieldTracer":
        """`value` with the derivatives `extras` (values, or functions that
        make them)."""
        f = cls(value._builder, value._var)
        f._extras = dict(extras)
        return f

    def _extra(self, name: str):
        v = self._extras.get(name)
        if callable(v):
            v = self._extras[name] = v()
        return v


for _name in _ATTRS:
    setattr(FieldTracer, _name, property(lambda self, _n=_name: self._extra(_n)))
del _name


# ---------------------------------------------------------------------------
# per-basis plans, computed once


class _Plan:
    """What assembling a form of one kind on one basis (pair) needs, apart
    from the form: the basis-function fields of every (trial, test) pair,
    side by side along the element axis (`P * nelems` "elements"), the
    default parameters `w.x`, `w.h`, ... tiled the same way, the quadrature
    weights `dx`, and where each element contribution goes."""

    __slots__ = ("P", "ne", "nq", "u", "v", "defaults", "dx", "pattern", "dest", "rows",
                 "shape", "basis", "__weakref__")


_PLANS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_INTERP: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _astuple(field) -> tuple:
    return tuple(field.get(n) for n in range(len(_ATTRS) + 1))


def _stack(fields: list, repeat: int, tile: int) -> DiscreteField:
    """The fields (each `(..., ne, nq)`) stacked along the element axis: each
    one `repeat` times in a row, the whole list `tile` times."""
    parts = []
    for n, first in enumerate(_astuple(fields[0])):
        if first is None:
            parts.append(None)
            continue
        a = np.stack([np.asarray(f.get(n)) for f in fields], axis=-3)  # (..., m, ne, nq)
        if repeat > 1:
            a = np.repeat(a, repeat, axis=-3)
        if tile > 1:
            a = np.concatenate([a] * tile, axis=-3)
        parts.append(a.reshape(a.shape[:-3] + (-1, a.shape[-1])))
    return DiscreteField(*parts)


def _tile_numpy(a, P: int, ne: int, nq: int):
    """A NumPy field `(..., ne, nq)` repeated `P` times along the element axis."""
    if isinstance(a, DiscreteField):
        return DiscreteField(*[None if c is None else _tile_numpy(np.asarray(c), P, ne, nq)
                               for c in _astuple(a)])
    a = np.asarray(a)
    if P == 1 or a.ndim < 2 or a.shape[-2:] != (ne, nq):
        return a
    return np.concatenate([a] * P, axis=-2)


def _tile_traced(a: Tracer, P: int):
    if P == 1:
        return a
    lead, (ne, nq) = tuple(a.shape[:-2]), tuple(a.shape[-2:])
    t = snp.broadcast_to(snp.expand_dims(a, -3), lead + (P, ne, nq))
    return snp.reshape(t, lead + (P * ne, nq))


def _plan(kind: str, ubasis, vbasis) -> _Plan:
    per = _PLANS.get(ubasis)
    if per is None:
        per = _PLANS[ubasis] = {}
    key = (kind, None if vbasis is None else id(vbasis))
    hit = per.get(key)
    if hit is not None and (vbasis is None or hit[1] is vbasis):
        return hit[0]
    plan = _make_plan(kind, ubasis, vbasis)
    per[key] = (plan, vbasis)
    return plan


def _make_plan(kind: str, ubasis, vbasis) -> _Plan:
    p = _Plan()
    vb = ubasis if vbasis is None else vbasis
    p.ne, p.nq = int(ubasis.nelems), int(ubasis.X.shape[-1])
    if vb.X.shape[-1] != p.nq or vb.nelems != p.ne:
        raise ShapeError(f"the trial and test bases must have the same elements and "
                         f"quadrature points, got {ubasis.nelems} x {ubasis.X.shape[-1]} "
                         f"and {vb.nelems} x {vb.X.shape[-1]}.", op="fem.assemble")
    ncomp = len(vb.basis[0])
    p.u = p.v = ()
    p.pattern = p.dest = p.rows = p.shape = None
    if kind == "bilinear":
        nu, nv = ubasis.Nbfun, vb.Nbfun
        p.P = nu * nv
        p.u = tuple(_stack([ubasis.basis[j][c] for j in range(nu)], nv, 1)
                    for c in range(len(ubasis.basis[0])))
        p.v = tuple(_stack([vb.basis[i][c] for i in range(nv)], 1, nu) for c in range(ncomp))
        # entry (j, i, t) <- row: test dof i of element t, col: trial dof j (scikit-fem's order)
        rows = np.tile(np.asarray(vb.element_dofs, np.int64), (nu, 1)).ravel()
        cols = np.repeat(np.asarray(ubasis.element_dofs, np.int64), nv, axis=0).ravel()
        p.shape = (int(vb.N), int(ubasis.N))
        p.pattern, dest = Pattern.from_coo(p.shape, rows, cols)
        p.dest = dest
    elif kind == "linear":
        p.P = vb.Nbfun
        p.v = tuple(_stack([vb.basis[i][c] for i in range(vb.Nbfun)], 1, 1)
                    for c in range(ncomp))
        p.rows = np.asarray(vb.element_dofs, np.int64).ravel()
        p.shape = (int(vb.N),)
    else:
        p.P = 1
    p.dx = _tile_numpy(np.asarray(ubasis.dx), p.P, p.ne, p.nq)
    p.basis = weakref.ref(ubasis)
    p.defaults = {}
    return p


class _Params(FormExtraParams):
    """The form's `w`: the default parameters (`w.x`, `w.h`, `w.n`, ...),
    tiled over the basis-function pairs when the form first reads them."""

    def __init__(self, plan: _Plan, names, coefficients: dict, form: str = "form"):
        super().__init__({**{k: None for k in names}, **coefficients})
        self._plan = plan
        self._lazy = set(names) - set(coefficients)
        self._form, self._given = form, tuple(coefficients)

    def __getattr__(self, attr):
        if attr in self:
            return self[attr]
        if attr.startswith("__"):  # (Python's protocols: copy, pickle)
            raise AttributeError(attr)
        given = ", ".join(f"`{k}`" for k in self._given) or "none"
        near = difflib.get_close_matches(attr, self._given, n=1)
        hint = (f"if `{near[0]}=` was meant for it, rename it `{attr}=`" if near else
                f"pass it by keyword: `sd.fem.assemble({self._form}, basis, {attr}=...)`")
        raise MissingCoefficientError(
            f"the form `{self._form}` reads the coefficient `w.{attr}`, which was not given "
            f"(coefficients given: {given}; the basis's own: "
            f"{', '.join(f'`{k}`' for k in sorted(self._lazy | (set(self) - set(self._given))))}"
            f"); {hint}.", op="fem.assemble")

    def __getitem__(self, key):
        if key in self._lazy:
            plan = self._plan
            value = plan.defaults.get(key)
            if value is None:
                raw = plan.basis().default_parameters()[key]
                value = plan.defaults[key] = _tile_numpy(raw, plan.P, plan.ne, plan.nq)
            dict.__setitem__(self, key, value)
            self._lazy.discard(key)
        return dict.__getitem__(self, key)


# ---------------------------------------------------------------------------
# coefficients


def _interp_tables(basis) -> list:
    """The basis functions at the quadrature points, stacked over the
    element's basis functions: `(Nbfun, ..., nelems, nqp)` per derivative."""
    hit = _INTERP.get(basis)
    if hit is None:
        tables = []
        for n, first in enumerate(_astuple(basis.basis[0][0])):
            tables.append(None if first is None else np.stack(
                [np.asarray(basis.basis[i][0].get(n)) for i in range(basis.Nbfun)]))
        hit = _INTERP[basis] = tuple(tables)
    return list(hit)


def _interpolate_traced(w: Tracer, basis, P: int) -> FieldTracer:
    """A traced nodal field at the quadrature points, as `basis.interpolate`,
    tiled over the `P` basis-function pairs."""
    if len(basis.basis[0]) > 1 and not isinstance(basis.elem, ElementVector):
        raise InvalidOptionError(
            f"a traced nodal coefficient on a composite element "
            f"({type(basis.elem).__name__}) is not supported: interpolate each component "
            "on its own basis and pass the quadrature values `(nelems, nqp)`.",
            op="fem.assemble")
    dofs = np.asarray(basis.element_dofs, np.int64)  # (Nbfun, nelems)
    wg = snp.take(w, dofs)                            # (Nbfun, nelems)
    tables = _interp_tables(basis)

    def at_points(table):
        mid = "ijklmnop"[: table.ndim - 3]
        return _tile_traced(snp.einsum(f"ae,a{mid}eq->{mid}eq", wg, table), P)

    return FieldTracer.of(at_points(tables[0]), {
        a: (lambda t=t: at_points(t)) for a, t in zip(_ATTRS, tables[1:]) if t is not None})


def _expected(name: str, shape, basis, ne: int, nq: int) -> str:
    return (f"coefficient `{name}` has shape {tuple(shape)}; expected a nodal array of "
            f"basis.N = {basis.N} entries, an element-wise array of nelems = {ne} entries, "
            f"quadrature values of shape (..., {ne}, {nq}) (or (..., {ne}, 1): one value "
            f"per element), or a scalar. Interpolate a field of another basis first "
            f"(`basis.project`, or its values at `basis.global_coordinates()`).")


def _coefficient(name: str, value, basis, P: int, ne: int, nq: int):
    """A coefficient as the form sees it: at the quadrature points, tiled
    over the `P` basis-function pairs."""
    op = "fem.assemble"
    if isinstance(value, (numbers.Number, tuple)):
        return value
    if isinstance(value, DiscreteField):
        if value.shape[-2:] != (ne, nq):
            raise ShapeError(_expected(name, value.shape, basis, ne, nq), op=op)
        return _tile_numpy(value, P, ne, nq)
    if isinstance(value, FieldTracer) and value.shape[-2:] == (ne, nq):
        return FieldTracer.of(_tile_traced(value, P), {
            a: (lambda a=a: None if getattr(value, a) is None else
                _tile_traced(getattr(value, a), P)) for a in _ATTRS})
    traced = isinstance(value, Tracer)
    if not traced:
        value = np.asarray(value)
    if np.dtype(value.dtype).kind not in "fciub":
        raise DTypeError(f"coefficient `{name}` must be numeric, got dtype {value.dtype}.",
                         op=op)
    if np.dtype(value.dtype).kind in "iub":
        value = snp.astype(value, np.float64) if traced else value.astype(np.float64)
    shape = tuple(value.shape)
    if len(shape) == 0:
        return value
    if len(shape) == 1:
        if shape[0] == basis.N:
            if not traced:
                return _tile_numpy(basis.interpolate(value), P, ne, nq)
            return _interpolate_traced(value, basis, P)
        if shape[0] != ne:
            raise ShapeError(_expected(name, shape, basis, ne, nq), op=op)
        value = value[:, None]
        shape = (ne, 1)
    if shape[-2:] == (ne, 1):
        shape = shape[:-1] + (nq,)
        value = snp.broadcast_to(value, shape) if traced else np.broadcast_to(value, shape)
    if shape[-2:] != (ne, nq):
        raise ShapeError(_expected(name, shape, basis, ne, nq), op=op)
    return _tile_traced(value, P) if traced else _tile_numpy(value, P, ne, nq)


# ---------------------------------------------------------------------------
# assembly


_DEFAULT_NAMES: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _default_names(basis) -> tuple:
    names = _DEFAULT_NAMES.get(basis)
    if names is None:
        names = _DEFAULT_NAMES[basis] = tuple(basis.default_parameters())
    return names


def _kind(form) -> str:
    if isinstance(form, BilinearForm):
        return "bilinear"
    if isinstance(form, LinearForm):
        return "linear"
    if isinstance(form, Functional):
        return "functional"
    raise DTypeError(f"`form` must be a scikit-fem BilinearForm, LinearForm or Functional, "
                     f"got {type(form).__name__}: decorate the form function with "
                     "`@skfem.BilinearForm` (or LinearForm, Functional).", op="fem.assemble")


def assemble(form, ubasis, vbasis=None, /, *, tags: Iterable[str] = (), **coefficients):
    """Assembles a scikit-fem form with sciad coefficients.

    **Arguments:**

    - `form`: a `skfem.BilinearForm`, `skfem.LinearForm` or `skfem.Functional`.
    - `ubasis`: the basis (`skfem.Basis`/`CellBasis`, or `FacetBasis` for
      boundary terms); `vbasis`: the test basis of a bilinear form, if it
      differs (same elements and quadrature points).
    - `tags`: structure tags of the matrix (`"symmetric"`, `"spd"`, ...), as
      for `sd.sparse.csr_matrix`: what the form guarantees, for the solvers.
    - `**coefficients`: the form's `w.<name>`, each a sciad value or NumPy
      array: nodal (`basis.N` entries; interpolated with its derivatives,
      so `grad(w.k)` works), element-wise (`nelems` entries, or trailing
      shape `(nelems, 1)`), quadrature values (trailing shape
      `(nelems, nqp)`), or a scalar. A 1-D array of `basis.N` entries is
      nodal, as in scikit-fem, even where `basis.N == nelems`.

    **Returns:**

    A bilinear form: a `sd.sparse` matrix `(vbasis.N, ubasis.N)` on the
    form's fixed pattern, equal to `form.assemble(ubasis, vbasis, ...)`; a
    linear form: a vector of `basis.N` entries; a functional: a scalar.
    Differentiable in every coefficient, to any order.

    ```python
    @skfem.BilinearForm
    def a(u, v, w):
        return w.k * dot(grad(u), grad(v))

    K = sd.fem.assemble(a, basis, k=snp.exp(m))    # m: traced, basis.N values
    ```
    """
    kind = _kind(form)
    op = "fem.assemble"
    if kind != "bilinear" and vbasis is not None:
        raise ShapeError(f"a {type(form).__name__} takes one basis, got two.", op=op)
    tags = _tags(tags, op)
    if tags and kind != "bilinear":
        raise InvalidOptionError(f"`tags` describe a matrix; a {type(form).__name__} gives "
                                 f"{'a vector' if kind == 'linear' else 'a scalar'}.", op=op)
    plan = _plan(kind, ubasis, vbasis)
    P, ne, nq = plan.P, plan.ne, plan.nq
    w = _Params(plan, _default_names(ubasis), {
        k: _coefficient(k, v, ubasis, P, ne, nq) for k, v in coefficients.items()},
        form=getattr(form.form, "__name__", "form"))
    if kind == "bilinear":
        out = form.form(*plan.u, *plan.v, w)
    elif kind == "linear":
        out = form.form(*plan.v, w)
    else:
        out = form.form(w)
    traced = isinstance(out, Tracer)
    shape = _shape(out)
    try:
        ok = np.broadcast_shapes(shape, plan.dx.shape) == plan.dx.shape
    except ValueError:
        ok = False
    if not ok:
        shown = shape[:-2] + (shape[-2] // P,) + shape[-1:] if len(shape) >= 2 else shape
        raise ShapeError(f"the form `{getattr(form.form, '__name__', form.form)}` returned "
                         f"values of shape {shown}; a form returns one number per "
                         f"quadrature point of each element, shape ({ne}, {nq}): reduce "
                         "vectors and tensors with `dot`, `ddot` or `inner`.", op=op)
    if traced:
        data = snp.reshape(snp.sum(out * plan.dx, axis=-1), (-1,))
    else:
        data = np.sum(np.asarray(out) * plan.dx, axis=-1).ravel()
    if kind == "functional":
        return snp.sum(data) if traced else float(np.sum(data))
    if kind == "linear":
        if traced:
            return snp.bincount(plan.rows, weights=data, length=plan.shape[0])
        return np.bincount(plan.rows, weights=data, minlength=plan.shape[0])
    _check_tags(plan.pattern, tags, op)
    if not traced and np.asarray(data).dtype.kind not in "fc":
        data = np.asarray(data, np.float64)
    return assemble_at(data, plan.pattern, plan.dest, tags)


# ---------------------------------------------------------------------------
# boundary conditions


def _shape(x) -> tuple:
    return tuple(x.shape) if isinstance(x, Tracer) else tuple(np.shape(x))


def _dofs(S) -> np.ndarray | None:
    """A scikit-fem DOF collection (array, `DofsView`, dict of them) as
    sorted unique int64 indices."""
    if S is None:
        return None
    if isinstance(S, dict):
        parts = [_dofs(v) for v in S.values()]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    if not isinstance(S, np.ndarray) and hasattr(S, "flatten"):
        S = S.flatten()
    return np.unique(np.asarray(S, dtype=np.int64).ravel())


_SUBMATRICES: "weakref.WeakKeyDictionary[Pattern, dict]" = weakref.WeakKeyDictionary()


def _submatrix(A, rows: np.ndarray, cols: np.ndarray, tags=frozenset()):
    """`A[rows][:, cols]` for sorted index sets: one gather of the kept
    entries onto their pattern (made once per pattern and index sets)."""
    pattern = A.type.pattern
    per = _SUBMATRICES.get(pattern)
    if per is None:
        per = _SUBMATRICES[pattern] = {}
    key = (rows.tobytes(), cols.tobytes())
    hit = per.get(key)
    if hit is None:
        n, m = pattern.shape
        rmap = np.full(n, -1, np.int64)
        rmap[rows] = np.arange(rows.size)
        cmap = np.full(m, -1, np.int64)
        cmap[cols] = np.arange(cols.size)
        r, c = rmap[pattern.rows], cmap[pattern.indices]
        keep = np.flatnonzero((r >= 0) & (c >= 0))
        sub, dest = Pattern.from_coo((rows.size, cols.size), r[keep], c[keep])
        hit = per[key] = (IndexMap(keep), sub, dest)
    index, sub, dest = hit
    data = A.data if not isinstance(A, Tracer) else None
    if data is not None:  # a concrete matrix
        vals = np.asarray(data)[index.array]
    else:
        vals = gather(A, index)
    return assemble_at(vals, sub, dest, tags)


def condense(A, b=None, x=None, *, I=None, D=None, expand: bool = True):
    """Eliminates degrees of freedom from `A u = b`, as `skfem.condense`.

    **Arguments:**

    - `A`: a square `sd.sparse` matrix (traced or not); `b`: the right-hand
      side (vector) or `None`.
    - `x`: the values of the eliminated degrees of freedom (a full vector of
      `A.shape[0]` entries, only its `D` entries read); zeros if not given.
      May be traced: the derivative with respect to the boundary values is
      part of the result.
    - `I`: the degrees of freedom to keep, or `D`: those to eliminate
      (arrays, `DofsView`s or a dict of them, as `basis.get_dofs()` gives).

    **Returns:**

    `(A_II, b_I, x, I)` with `A_II = A[I][:, I]` (keeping `A`'s symmetric /
    spd / hermitian tags) and `b_I = b[I] - A[I][:, D] @ x[D]`; without
    `expand`, `(A_II, b_I)`; without `b`, `A_II` (and `x, I`). Pass the
    tuple to `sd.fem.solve`.

    ```python
    u = sd.fem.solve(*sd.fem.condense(K, f, D=basis.get_dofs()))
    ```
    """
    op = "fem.condense"
    if not issparse(A) or A.shape[0] != A.shape[1]:
        raise ShapeError(f"`A` must be a square sd.sparse matrix, got "
                         f"{getattr(getattr(A, 'type', None), 'str_short', lambda: type(A).__name__)()}.",
                         op=op)
    n = A.shape[0]
    if (I is None) == (D is None):
        raise InvalidOptionError("give exactly one of `I` (the degrees of freedom to keep) "
                                 "and `D` (those to eliminate).", op=op)
    I, D = _dofs(I), _dofs(D)
    for name, S in (("I", I), ("D", D)):
        if S is not None and S.size and (S[0] < 0 or S[-1] >= n):
            raise ShapeError(f"`{name}` holds indices outside [0, {n}).", op=op)
    if I is None:
        I = np.setdiff1d(np.arange(n), D)
    else:
        D = np.setdiff1d(np.arange(n), I)
    if x is None:
        x = np.zeros(n)
    elif _shape(x) != (n,):
        raise ShapeError(f"`x` must hold a value for each of the {n} degrees of freedom "
                         f"(only its `D` entries are read), got shape {_shape(x)}.",
                         op=op)
    keep = A.type.tags & {"symmetric", "spd", "hermitian"}
    A_II = _submatrix(A, I, I, keep)
    if b is None:
        return (A_II, x, I) if expand else A_II
    if _shape(b) != (n,):
        raise ShapeError(f"`b` must be a vector of {n} entries, got shape "
                         f"{_shape(b)}.", op=op)
    b_I = snp.take(b, I) if isinstance(b, Tracer) else np.asarray(b)[I]
    traced_x = isinstance(x, Tracer)
    if D.size and (traced_x or np.any(np.asarray(x)[D] != 0)):
        x_D = snp.take(x, D) if traced_x else np.asarray(x)[D]
        b_I = b_I - _submatrix(A, I, D) @ x_D
    return (A_II, b_I, x, I) if expand else (A_II, b_I)


def solve(A, b, x=None, I=None, **options):
    """Solves a condensed system, as `skfem.solve`: `u_I = A^-1 b` by
    `sd.linalg.solve` (`**options`: its `solver`, `tol`, ...), and with `x`
    and `I` (from `condense`) the full vector: `x` with `u_I` at `I`.
    Differentiable in `A`, `b` and `x`."""
    u = _linalg.solve(A, b, **options)
    if x is None:
        return u
    if I is None:
        raise InvalidOptionError("`x` needs `I` (where the solution goes): pass the whole "
                                 "tuple of `condense`.", op="fem.solve")
    I = _dofs(I)
    if isinstance(x, Tracer) or isinstance(u, Tracer):
        n = _shape(x)[0]
        outside = np.ones(n)
        outside[I] = 0.0  # x where the solution does not go, u_I where it does
        kept = x * outside if isinstance(x, Tracer) else np.asarray(x) * outside
        return kept + snp.bincount(I, weights=u, length=n)
    full = np.array(x, dtype=np.result_type(np.asarray(x).dtype, np.asarray(u).dtype))
    full[I] = np.asarray(u)
    return full


# ---------------------------------------------------------------------------
# observations at points

_PROBES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def probes(basis, points):
    """The linear operator from nodal values to values at `points` (shape
    `(dim, npoints)`), as `basis.probes`: a constant `sd.sparse` matrix
    (made once per basis and points), so `probes(basis, x) @ u` is
    differentiable in `u`.

    ```python
    d = sd.fem.probes(basis, np.array([[0.2, 0.5], [0.3, 0.5]])) @ u
    ```

    A point outside the mesh is a `ShapeError`.
    """
    points = np.ascontiguousarray(points, dtype=np.float64)
    dim = basis.mesh.dim()
    if points.ndim != 2 or points.shape[0] != dim:
        raise ShapeError(f"`points` must have shape (dim, npoints) = ({dim}, npoints), got "
                         f"{points.shape}.", op="fem.probes")
    per = _PROBES.get(basis)
    if per is None:
        per = _PROBES[basis] = {}
    key = points.tobytes()
    hit = per.get(key)
    if hit is None:
        try:
            M = basis.probes(points)
        except ValueError as e:  # scikit-fem: a point outside the mesh
            raise ShapeError(f"a point is outside the mesh ({e}).", op="fem.probes") from None
        C = M.tocsr()
        C.sum_duplicates()
        C.sort_indices()
        pattern = Pattern(C.shape, C.indptr, C.indices)
        data = np.asarray(C.data, np.float64)
        data.setflags(write=False)
        hit = per[key] = SparseArray(data, SparseType(pattern, data.dtype))
    return hit


def interpolate(basis, u):
    """The nodal field `u` (`basis.N` entries) at the quadrature points of
    `basis`, with its derivatives, as `basis.interpolate`: a traced value of
    shape `(..., nelems, nqp)` whose `grad`, `div`, ... attributes are those
    of scikit-fem's `DiscreteField` (a `DiscreteField` for NumPy `u`). Pass it
    as a coefficient of a form on another basis with the same elements and
    quadrature, e.g. a scalar modulus in a vector (elasticity) form.

    ```python
    scalar = basis.with_element(skfem.ElementTriP1())
    K = sd.fem.assemble(elasticity, basis, mu=sd.fem.interpolate(scalar, mu))
    ```
    """
    if not isinstance(u, Tracer):
        return basis.interpolate(np.asarray(u))
    if u.ndim != 1 or u.shape[0] != basis.N:
        raise ShapeError(f"`u` must be a nodal array of basis.N = {basis.N} entries, got "
                         f"{u.type.str_short()}.", op="fem.interpolate")
    return _interpolate_traced(u, basis, 1)


# (this module is imported on first use, `sd.fem`, after `sciad/__init__.py`
# has made the other public modules' functions API boundaries: these too)
_traceback.wrap_public(sys.modules[__name__])
