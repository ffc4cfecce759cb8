"""Checks for derivative rules and gradients.

```python
sd.testing.check_rules(my_op_p, x, y, scale=2.0)   # a primitive, with its params
sd.testing.check_rules(lambda x: f(x, 3), x)        # or any sciad function
rates = sd.testing.taylor_test(loss, m, dm)         # ~[2, 2, 2, 2] if grad is right
```

`check_rules` works in float64 (and complex128) on the inputs you give and
on fresh random directions:

1. JVP against central finite differences (Richardson-extrapolated, so the
   truncation error is O(h^4)): relative error <= `rtol` (1e-6).
2. VJP against JVP by the dot-product test
   `|Re<w, J v> - Re<J^T w, v>| <= dot_tol |w| |v|` (1e-10), with the
   unconjugated pairing sciad uses for complex values (see
   `sciad.graph._autodiff`). Where there is no JVP rule (a reverse-only user
   primitive), `J v` comes from the finite differences and `rtol` applies.
3. Second order: the JVP of `x -> J(x)^T w` against its finite differences,
   where both rules are defined (skipped, and reported, where a rule needed
   for it is missing).
4. A primitive's sparsity rule (`def_sparsity`), where it has one: the
   Jacobian, one JVP per input element (inputs of at most 256 elements),
   has no nonzero outside the pattern the rule declares.
5. Batching: the function under `sd.vmap` on two examples (the inputs, and
   the float inputs scaled by `1 + 0.01 r` with random `r`; other inputs
   shared), against the traced graph run on each example (looped) and, for
   a primitive, against the primitive called eagerly on arrays: relative
   error <= 1e-10 (or `100 eps` of a lower precision). A primitive without
   a batch rule is mapped over the examples there (a `map` node), which the
   report notes.

Tolerances are not scaled by array size. A failure raises `RuleError`
naming the rule, the error and the tolerance, and the input types and seed.
An error that is NaN (a rule that returns NaN) fails. Outputs that are not
finite at the inputs raise `NonFiniteError`: no derivative is checked there.

Lower precision. The inputs are float64, but a function may compute in
float32 (`snp.astype(x, np.float32)`, a float32 user primitive), in its
outputs or in between. Its values then carry rounding errors about 1e-7
relative, which finite differences with the float64 step divide by 1e-4:
a right rule would fail. Where any value of the graph (or of its JVP or
VJP graph) is less precise than float64, with `eps` that dtype's machine
epsilon:

- the finite-difference step is `eps ** (1/3)` relative (about 5e-3 for
  float32), which balances rounding against truncation;
- the rounding noise of the function is measured (fourth differences of
  its values at a few points spaced about `1e3 eps` apart along the
  direction, at least `eps |f|`), and finite differences may differ from
  the JVP by 30 times that noise over the step;
- `rtol` and `dot_tol` become at least `100 eps` (relative to `|J v|`, and
  to `|w| |v|` times the larger of `|J v| / |v|`, `|J^T w| / |w|` and 1).

A wrong rule is still caught: a sign error or a missing term is off by
O(1), far above 1e-3. `RuleReport.precision` names the dtype and
`RuleReport.notes` says what was done and the tolerances used.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import numpy as snp
from ._function import _has_runtime_checks, function
from ._traceback import api_boundary
from ._transforms import grad as sd_grad, vjp as sd_vjp, vmap
from .errors import DTypeError, MissingRuleError, NonFiniteError, NotSupportedError, RuleError
from .errors import BatchFallbackWarning, InvalidOptionError, ShapeError
from .graph import Graph, Primitive, instantiate, lower, trace
from .graph._autodiff import Zero, is_differentiable, jvp_graph, type_of, vjp_graph
from .graph._passes import place_releases
from .graph._sparsity import input_deps, sparsity_eval
from .primitives import call

__all__ = ["check_rules", "RuleReport", "taylor_test"]


@dataclasses.dataclass
class RuleReport:
    """What `check_rules` measured. Errors are relative (JVP, second order)
    or relative to `|w||v|` (dot-product test); `skipped` says why a check
    did not run. `precision` is the least precise float dtype among the
    values checked ("float64" unless the function computes in lower
    precision), and `notes` says how the checks were adapted to it (see
    the module docstring); the two are shown only when not float64."""

    name: str
    jvp_error: float | None = None
    vjp_error: float | None = None
    second_order_error: float | None = None
    batch_error: float | None = None
    #: whether a primitive's sparsity rule was checked against its JVP
    sparsity_checked: bool = False
    skipped: dict = dataclasses.field(default_factory=dict)
    precision: str = "float64"
    notes: list = dataclasses.field(default_factory=list)

    def __repr__(self) -> str:
        fields = [f"name={self.name!r}", f"jvp_error={self.jvp_error!r}",
                  f"vjp_error={self.vjp_error!r}",
                  f"second_order_error={self.second_order_error!r}",
                  f"batch_error={self.batch_error!r}", f"skipped={self.skipped!r}"]
        if self.precision != "float64" or self.notes:
            fields += [f"precision={self.precision!r}", f"notes={self.notes!r}"]
        return f"RuleReport({', '.join(fields)})"


_COMPILED: dict[int, tuple] = {}
_OP_BY_OP_NODES = 60


def _run(graph: Graph, args) -> list[np.ndarray]:
    """Runs `graph` op by op (no XLA compile of the whole: quick for small
    checks), or compiled once if it holds solver nodes (an iterative
    solver's loop run op by op is slow) or many nodes (op by op, each op
    of a new shape is an XLA compile of its own). The releases of what it
    makes are placed for the graph as it is (a derived graph's readers of a
    factorization come after the primal's)."""
    fn = lower(place_releases(graph))
    if len(graph.nodes) > _OP_BY_OP_NODES or _has_runtime_checks(graph):
        hit = _COMPILED.get(id(graph))
        if hit is None or hit[0] is not graph:
            hit = _COMPILED[id(graph)] = (graph, jax.jit(fn))
            if len(_COMPILED) > 64:
                _COMPILED.pop(next(iter(_COMPILED)))
        fn = hit[1]
    with jax.enable_x64(True):
        outs = fn(*[jax.tree_util.tree_map(jnp.asarray, a) for a in args])
        # (a saved factorization is a pytree of arrays: kept as one)
        return [jax.tree_util.tree_map(np.asarray, o) for o in outs]


def _random_like(rng, x: np.ndarray) -> np.ndarray:
    v = rng.standard_normal(x.shape)
    if x.dtype.kind == "c":
        v = v + 1j * rng.standard_normal(x.shape)
    return v.astype(x.dtype)


def _pair(a, b) -> float:
    """Re sum(a * b): the real, unconjugated pairing of the transpose."""
    return float(np.sum(np.real(np.asarray(a) * np.asarray(b))))


def _norm(xs) -> float:
    return float(np.sqrt(sum(np.sum(np.abs(np.asarray(x)) ** 2) for x in xs)))


def _step(args, diff: list[int], dirs, rel: float) -> float:
    """The step along `dirs` that moves the inputs by `rel` of their size."""
    scale = max([1.0] + [float(np.max(np.abs(args[i]))) for i in diff if args[i].size])
    vmax = max([1e-300] + [float(np.max(np.abs(d))) for d in dirs if d.size])
    return rel * scale / vmax


def _shifted(args, diff: list[int], dirs, step: float) -> list:
    out = list(args)
    for i, d in zip(diff, dirs):
        out[i] = args[i] + step * d
    return out


def _fd_directional(graph: Graph, args, diff: list[int], dirs,
                    rel_step: float = 1e-4) -> tuple[list[np.ndarray], float]:
    """Richardson-extrapolated central differences of `graph` along `dirs`,
    and the step `h` they used."""
    h = _step(args, diff, dirs, rel_step)

    def central(step):
        fp = _run(graph, _shifted(args, diff, dirs, step))
        fm = _run(graph, _shifted(args, diff, dirs, -step))
        return [(np.asarray(a, np.result_type(a, np.float64)) - b) / (2 * step)
                for a, b in zip(fp, fm)]

    d1, d2 = central(h), central(h / 2)
    return [(4 * b - a) / 3 for a, b in zip(d1, d2)], h


class _Precision:
    """How the checks adapt to the least precise float dtype in the graphs
    checked (see the module docstring). For float64 they are as documented
    at the top: step 1e-4, the tolerances given, no noise allowance."""

    def __init__(self, graphs, rtol: float, dot_tol: float):
        eps = np.finfo(np.float64).eps
        dtype = np.dtype(np.float64)
        for t in _value_types(graphs):
            d = getattr(t, "dtype", None)
            if d is not None and np.dtype(d).kind in "fc" and np.finfo(d).eps > eps:
                eps, dtype = float(np.finfo(d).eps), np.finfo(d).dtype
        self.dtype = dtype
        self.eps = eps
        self.low = dtype != np.float64
        self.rel_step = eps ** (1 / 3) if self.low else 1e-4
        self.rtol = max(rtol, 100 * eps) if self.low else rtol
        self.dot_tol = max(dot_tol, 100 * eps) if self.low else dot_tol

    def noise(self, graph: Graph, args, diff: list[int], dirs, outs, keep: list[int]) -> float:
        """The rounding noise of `graph`'s outputs `keep` near `args` along
        `dirs` (a norm over those outputs); 0 in float64."""
        if not self.low:
            return 0.0
        sigma = _step(args, diff, dirs, min(1e3 * self.eps, self.rel_step / 10))
        vals = [_run(graph, _shifted(args, diff, dirs, k * sigma)) for k in (-2, -1, 0, 1, 2)]
        # fourth differences cancel the smooth part (up to cubic terms); for
        # independent noise of size nu their size is sqrt(70) nu
        fourth = [vals[0][k].astype(np.result_type(vals[0][k], np.float64))
                  - 4 * vals[1][k] + 6 * vals[2][k] - 4 * vals[3][k] + vals[4][k]
                  for k in keep]
        measured = _norm(fourth) / np.sqrt(70.0)
        return max(measured, 0.5 * self.eps * _norm([outs[k] for k in keep]))

    def note(self, report: "RuleReport", what: str) -> None:
        report.precision = self.dtype.name
        report.notes.append(what)

    def why(self) -> str:
        """For an error message: where the tolerances came from."""
        if not self.low:
            return ""
        return (f" (scaled for the {self.dtype.name} values in the graph: eps "
                f"{self.eps:.2e}, step {self.rel_step:.2e} relative)")


def _value_types(graphs):
    """The types of every value in `graphs` and in the graphs their nodes hold."""
    todo = list(graphs)
    while todo:
        g = todo.pop()
        yield from g.in_types
        yield from g.out_types
        for node in g.nodes:
            yield from (a.type for a in node.inputs)
            yield from (v.type for v in node.outputs)
            todo.extend(node.subgraphs)


def _rel_error(got: list, want: list, out_scale: float,
               noise: float = 0.0) -> tuple[float, float]:
    """`(|got - want| / max(|got|, |want|), the part of that ratio that the
    absolute allowance `noise` makes up)`."""
    num = _norm([np.asarray(g) - np.asarray(w) for g, w in zip(got, want)])
    den = max(_norm(got), _norm(want))
    floor = 1e-12 * max(1.0, out_scale)
    if den <= floor:
        if num <= max(floor, noise):
            return 0.0, 0.0
        if noise == 0.0:
            return float("inf"), 0.0
    den = max(den, 1e-300)
    return num / den, noise / den


def _describe(args) -> str:
    return ", ".join(type_of(a).str_short() for a in args)


@api_boundary
def check_rules(p_or_fn: Primitive | Callable, *args, rtol: float = 1e-6,
                dot_tol: float = 1e-10, seed: int | None = None,
                second_order: bool = True, batch: bool = True, gauge=None,
                **params) -> RuleReport:
    """Checks the derivative rules of a primitive (or of a whole function).

    **Arguments:**

    - `p_or_fn`: a `Primitive` (its rules are checked on one application
      with `params`) or a function of arrays written with sciad ops (every
      rule it uses is checked together; `params` are passed as keywords).
    - `*args`: the inputs, as arrays. Float and complex inputs are
      differentiated and must be float64 / complex128; other inputs are held
      fixed.
    - `rtol`, `dot_tol`: tolerances (see the module docstring).
    - `seed`: for the random directions; fresh ones by default (the seed used
      is in the report and in any error).
    - `second_order`: also check the JVP of the VJP.
    - `batch`: also check `sd.vmap` of the function against a loop over
      examples and against eager calls.
    - `gauge`: for outputs defined up to a sign or phase per vector (the
      eigenvectors of `linalg.eigh`, the singular vectors of `linalg.svd`), a
      mapping from the output's index to `"columns"` (each column is such a
      vector) or `"rows"`. Each of those vectors is multiplied by the sign
      (the unit phase) that makes its entry of largest magnitude at the given
      inputs real and positive; that entry's index is fixed, so the result is
      a smooth function of the input where the vector is determined, and
      every check runs on it. This checks the whole derivative of the
      vectors, not only of a gauge-invariant function of them.

    **Returns:**

    A `RuleReport`. Raises `RuleError` on the first check that fails
    (`NonFiniteError` where the function's outputs are not finite).
    """
    if isinstance(p_or_fn, Primitive):
        prim = p_or_fn
        name = prim.name

        def fn(*xs):
            return prim.bind(*xs, **params)
    else:
        name = getattr(p_or_fn, "__name__", "function")

        def fn(*xs):
            return p_or_fn(*xs, **params)

    args = [np.asarray(a) for a in args]
    if gauge:
        fn = _fixing_gauge(fn, args, gauge)
    diff = [i for i, a in enumerate(args) if is_differentiable(type_of(a))]
    for i in diff:
        if args[i].dtype not in (np.float64, np.complex128):
            raise DTypeError(f"rule checks run in float64: input {i} is "
                             f"{type_of(args[i]).str_short()}; pass float64 or "
                             "complex128 arrays.", op="check_rules")
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    rng = np.random.default_rng(seed)
    report = RuleReport(name)
    where = f"on inputs ({_describe(args)}), seed={seed}"
    if not diff:
        report.skipped["all"] = "no float or complex input"
        return report

    graph = trace(fn, *args)
    outs = _run(graph, args)
    out_scale = _norm(outs)
    if not np.isfinite(out_scale):  # (finite differences there are NaN: nothing to check)
        raise NonFiniteError(f"the function's outputs hold NaN or infinite values at the "
                             f"inputs, where its derivatives cannot be checked; choose "
                             f"inputs inside its domain, {where}.", op=name)
    if batch:
        _check_batching(fn, graph, args, outs, rng, report, where, name,
                        eager=isinstance(p_or_fn, Primitive))
    diff_out = [k for k, a in enumerate(graph.outputs) if is_differentiable(a.type)]
    if not diff_out:
        report.skipped["all"] = "no float or complex output"
        return report
    dirs = [_random_like(rng, args[i]) for i in diff]
    jg = None
    try:
        jg = jvp_graph(graph)
    except MissingRuleError as e:
        report.skipped["jvp"] = str(e)
    except NotSupportedError as e:  # an op that is not differentiated on purpose
        report.skipped["all"] = f"not differentiable: {e}"
        return report
    prec = _Precision([graph] if jg is None else [graph, jg], rtol, dot_tol)
    fd, h = _fd_directional(graph, args, diff, dirs, prec.rel_step)
    noise = prec.noise(graph, args, diff, dirs, outs, diff_out)

    # 1. JVP against finite differences
    jv = None
    if jg is not None:
        res = _run(jg, args + dirs)
        jv = res[len(graph.outputs):]
        err, allowance = _rel_error([jv[k] for k in diff_out], [fd[k] for k in diff_out],
                                    out_scale, 30 * noise / h)
        tol = prec.rtol + allowance
        report.jvp_error = err
        if prec.low:
            prec.note(report, f"jvp: finite differences with step {prec.rel_step:.2e} "
                              f"relative; tolerance {tol:.2e} = rtol {prec.rtol:.2e} + "
                              f"{allowance:.2e} for the measured rounding noise "
                              f"{noise:.2e} of the outputs")
        if not err <= tol:
            raise RuleError(f"the JVP rule disagrees with central finite differences: "
                            f"relative error {err:.3e} > {tol:.3g}{prec.why()}, {where}.",
                            op=name)

    # 2. VJP against JVP: <w, J v> = <J^T w, v>
    ws = [_random_like(rng, outs[k]) for k in diff_out]
    vg = vjp_graph(graph)
    # the VJP's own values may be less precise than the function's
    prec = _Precision([g for g in (graph, jg, vg.forward, vg.backward) if g is not None],
                      rtol, dot_tol)
    fwd = _run(vg.forward, args)
    saved = fwd[len(graph.outputs):]
    cts = _run(vg.backward, saved + ws)
    jv_used = jv if jv is not None else fd
    lhs = sum(_pair(w, jv_used[k]) for w, k in zip(ws, diff_out))
    rhs = sum(_pair(c, d) for c, d in zip(cts, dirs))
    wv = _norm(ws) * _norm(dirs)
    if prec.low:  # rounding is relative to the size of J: not 1 in general
        jw = _norm([jv_used[k] for k in diff_out]) / max(_norm(dirs), 1e-300)
        jtw = _norm(cts) / max(_norm(ws), 1e-300)
        wv *= max(1.0, jw, jtw)
    tol = (prec.dot_tol if jv is not None else prec.rtol) * wv
    if jv is None:
        tol += 30 * noise / h * _norm(ws)
    err = abs(lhs - rhs) / max(_norm(ws) * _norm(dirs), 1e-300)
    report.vjp_error = err
    if prec.low:
        prec.note(report, f"vjp: dot-product tolerance {tol:.2e} (absolute)")
    if not abs(lhs - rhs) <= tol:
        against = "the JVP" if jv is not None else "finite differences (no JVP rule)"
        raise RuleError(f"the VJP disagrees with {against} in the dot-product test: "
                        f"<w, J v> = {lhs:.12e} but <J^T w, v> = {rhs:.12e} (difference "
                        f"{abs(lhs - rhs):.3e} > {tol:.3e}){prec.why()}, {where}.", op=name)

    # 3. second order: the JVP of x -> J(x)^T w
    if second_order:
        _second_order(graph, args, diff, diff_out, ws, rng, report, rtol, dot_tol, where,
                      name)

    # 4. a primitive's sparsity rule: its pattern holds every nonzero of the JVP's
    if isinstance(p_or_fn, Primitive) and p_or_fn.sparsity_rule is not None \
            and jg is not None:
        _check_sparsity(graph, jg, args, diff, diff_out, report, where, name)
    return report


#: inputs up to this many elements get their sparsity rule checked (one JVP
#: per element)
SPARSITY_CHECK_SIZE = 256


def _check_sparsity(graph, jg, args, diff, diff_out, report, where: str, name: str) -> None:
    """The Jacobian, one JVP per input element, against the pattern the
    primitive's sparsity rule gives: a nonzero outside it is an error (a
    numerical zero inside it is not: the pattern is structural)."""
    for pos, i in enumerate(diff):
        size = int(np.size(args[i]))
        if size > SPARSITY_CHECK_SIZE:
            report.skipped["sparsity"] = (f"input {i} has {size} elements (more than "
                                          f"{SPARSITY_CHECK_SIZE}, one JVP each)")
            continue
        deps = sparsity_eval(graph, input_deps(graph.in_types,
                                               [k == i for k in range(len(args))]))
        pattern = np.vstack([deps[k].matrix.toarray() for k in diff_out])
        nonzero = np.zeros(pattern.shape, bool)
        zeros = [np.zeros_like(args[k]) for k in diff]
        for j in range(size):
            d = list(zeros)
            d[pos] = np.zeros_like(args[i])
            d[pos].flat[j] = 1
            res = _run(jg, args + d)[len(graph.outputs):]
            nonzero[:, j] = np.concatenate([np.ravel(res[k]) for k in diff_out]) != 0
        missed = np.argwhere(nonzero & ~pattern)
        report.sparsity_checked = True
        if missed.size:
            raise RuleError(f"the sparsity rule misses Jacobian entries: (output element, "
                            f"input element) {missed[:5].tolist()} of input {i} are nonzero "
                            f"in the JVP but outside the declared pattern, {where}.", op=name)


def _fixing_gauge(fn: Callable, args: list, gauge) -> Callable:
    """`fn` with the vectors that `gauge` names given a fixed sign or phase
    (see `check_rules`)."""
    base = fn(*args)
    multiple = isinstance(base, (tuple, list))
    outs = list(base) if multiple else [base]
    picks = {}
    for i, how in dict(gauge).items():
        if how not in ("columns", "rows") or not -len(outs) <= i < len(outs):
            raise InvalidOptionError(f"`gauge` maps an output index (of {len(outs)}) to "
                                     f"'columns' or 'rows', got {i!r}: {how!r}.", op="check_rules")
        v = np.asarray(outs[i])
        axis = -2 if how == "columns" else -1  # the axis each vector runs along
        idx = np.expand_dims(np.argmax(np.abs(v), axis=axis), axis)
        shape = [1] * v.ndim
        shape[axis] = v.shape[axis]
        picks[i % len(outs)] = ((np.arange(v.shape[axis]).reshape(shape) == idx).astype(
            v.dtype), axis)

    def fixed(*xs):
        res = fn(*xs)
        out = list(res) if multiple else [res]
        for i, (onehot, axis) in picks.items():
            p = snp.sum(out[i] * onehot, axis=axis, keepdims=True)
            out[i] = out[i] * (snp.conj(p) / snp.abs(p))
        return tuple(out) if multiple else out[0]

    return fixed


def _check_batching(fn, graph, args, outs, rng, report, where, name, eager: bool) -> None:
    """Check 4 (see the module docstring): batched, looped and eager agree.
    Only the float inputs are batched; the others reach `fn` as they are
    (a static count, an index array). `eager`: also call `fn` on arrays
    outside a trace (a primitive's eager path; a function written for
    traced values may use what arrays lack, such as `x.at`)."""
    floats = [isinstance(a, np.ndarray) and a.dtype.kind in "fc" for a in args]
    if not any(floats):
        report.skipped["batch"] = "no float or complex input to batch"
        return
    second = [a * (1 + 0.01 * rng.standard_normal(a.shape)).astype(a.dtype) if f else a
              for a, f in zip(args, floats)]
    stacked = [np.stack([a, b]) for a, b, f in zip(args, second, floats) if f]

    def of_floats(*xs):
        it = iter(xs)
        return fn(*[next(it) if f else a for a, f in zip(args, floats)])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BatchFallbackWarning)
        bgraph = trace(vmap(of_floats), *stacked)
    if any(issubclass(w.category, BatchFallbackWarning) for w in caught):
        report.notes.append("batch: a primitive without a batch rule was mapped over the "
                            "examples (a `map` node)")
    batched = _leaves(_run(bgraph, stacked))
    looped = [_leaves(outs), _leaves(_run(graph, second))]
    eager = _leaves(fn(*args)) if eager else _leaves(outs)
    low = min((np.finfo(x.dtype).eps for x in looped[0] if x.dtype.kind in "fc"),
              default=np.finfo(np.float64).eps)
    tol = max(1e-10, 100 * low)

    def rel(got, want) -> float:
        # (np.max, not Python's max: max(0.0, nan) is 0.0, so a NaN in any
        # output but the first passed)
        diffs = [np.max(np.abs(np.asarray(g, np.complex128) - np.asarray(w, np.complex128)),
                        initial=0.0) for g, w in zip(got, want)]
        return float(np.max(diffs, initial=0.0)) / max(_norm(want), 1e-300)

    if len(batched) != len(looped[0]) or len(eager) != len(looped[0]):
        raise RuleError(f"the batched function returns {len(batched)} arrays and the eager "
                        f"one {len(eager)}, the traced one {len(looped[0])}, {where}.",
                        op=name)
    errs = [rel([b[k] for b in batched], looped[k]) for k in range(2)]
    e_eager = rel(eager, looped[0])
    report.batch_error = max(errs + [e_eager])
    for what, err in (("sd.vmap against a loop over examples, example 0", errs[0]),
                      ("sd.vmap against a loop over examples, example 1", errs[1]),
                      ("an eager call against the traced graph", e_eager)):
        if not err <= tol:
            raise RuleError(f"batching: {what}: relative error {err:.3e} > {tol:.3g}, "
                            f"{where}.", op=name)


def _leaves(x) -> list[np.ndarray]:
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(x)]


def _second_order(graph, args, diff, diff_out, ws, rng, report, rtol, dot_tol, where,
                  name):
    def with_diff(xs):
        vals = list(args)
        for i, x in zip(diff, xs):
            vals[i] = x
        return vals

    def pullback(*xs):
        outs, vjp_fn = sd_vjp(lambda *d: list(call(graph, *with_diff(d))), *xs)
        cts = [Zero(type_of(o).update()) for o in outs]
        for w, k in zip(ws, diff_out):
            cts[k] = w
        return list(vjp_fn([instantiate(c) for c in cts]))

    xs = [args[i] for i in diff]
    try:
        g2 = trace(pullback, *xs)
        jg2 = jvp_graph(g2)
    except MissingRuleError as e:
        report.skipped["second_order"] = str(e)
        return
    dirs = [_random_like(rng, x) for x in xs]
    prec = _Precision([graph, g2, jg2], rtol, dot_tol)
    res = _run(jg2, xs + dirs)
    n = len(g2.outputs)
    every = list(range(len(xs)))
    fd, h = _fd_directional(g2, xs, every, dirs, prec.rel_step)
    noise = prec.noise(g2, xs, every, dirs, res[:n], list(range(n)))
    err, allowance = _rel_error(res[n:], fd, _norm(res[:n]), 30 * noise / h)
    tol = prec.rtol + allowance
    report.second_order_error = err
    if prec.low:
        prec.note(report, f"second order: finite differences of the VJP with step "
                          f"{prec.rel_step:.2e} relative; tolerance {tol:.2e}")
    if not err <= tol:
        raise RuleError(f"second order (the JVP of the VJP) disagrees with finite "
                        f"differences of the VJP: relative error {err:.3e} > {tol:.3g}"
                        f"{prec.why()}, {where}.", op=name)


def taylor_test(f: Callable, x, dx, *, grad: Callable | None = None, h0: float | None = None,
                steps: int = 4) -> np.ndarray:
    """The convergence rates of the first-order Taylor remainder.

    `r(h) = |f(x + h dx) - f(x) - h Re<grad f(x), dx>|` for `h = h0, h0/2, ...`;
    returns `log2(r(h_k) / r(h_{k+1}))`, about 2 when the gradient is right
    and about 1 when it is wrong. `f` is a real scalar function of one array,
    `grad` defaults to `sd.grad(f)`.
    """
    x = np.asarray(x)
    dx = np.asarray(dx)
    if x.shape != dx.shape:
        raise ShapeError(f"`dx` must have the shape of `x` {x.shape}, got {dx.shape}.",
                         op="taylor_test")
    f_c = function(f)
    g = np.asarray((grad or sd_grad(f))(x))
    f0 = float(f_c(x))
    slope = _pair(g, dx)
    if h0 is None:
        h0 = 1e-2 * max(1.0, float(np.max(np.abs(x)))) / max(float(np.max(np.abs(dx))),
                                                             1e-300)
    hs = h0 * 0.5 ** np.arange(steps + 1)
    r = np.array([abs(float(f_c(x + h * dx)) - f0 - h * slope) for h in hs])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log2(r[:-1] / r[1:])
