"""Sparsity rules over the whole primitive registry: every rule is sound (the
pattern it gives holds every nonzero of the Jacobian, computed by JAX on the
registry example at random points), and the primitives without a rule are
exactly those listed."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

import sciad as sd
from registry_examples import EXAMPLES, builtin_primitives
from sciad.graph._sparsity import input_deps, sparsity_eval

BUILTINS = sorted(builtin_primitives())
WITH_RULE = [n for n in BUILTINS if sd.graph.lookup_primitive(n).sparsity_rule is not None]

# Built-in primitives without a sparsity rule: a graph holding one gets a
# dense pattern for its outputs, with a warning. The list must match the
# registry exactly: a rule added removes its name here.
PENDING = {
    "dynamic_slice", "dynamic_update_slice", "fft", "linalg.backsolve", "linalg.eigh",
    "linalg.eigh_apply", "linalg.eigh_guard", "linalg.eigsh", "linalg.eigsh_operator",
    "linalg.factor", "linalg.factor_rcond", "linalg.rcond", "linalg.solve",
    "linalg.solve_operator", "linalg.svd", "linalg.svd_guard", "map", "scan", "scan_adjoint",
    "scatter_add", "scatter_set", "sort", "take", "while",
}
# no operands, or no float output: the interpretation never asks for a rule
NEVER_ASKED = {"arange", "eye", "full", "linspace", "zeros", "argsort", "searchsorted",
               "index_bounds"}


def test_sparsity_rule_coverage_is_as_listed():
    missing = {n for n in BUILTINS
               if sd.graph.lookup_primitive(n).sparsity_rule is None} - NEVER_ASKED
    assert missing == PENDING, (
        f"with no sparsity rule but not listed: {sorted(missing - PENDING)}; listed but "
        f"with a rule now: {sorted(PENDING - missing)}")


def _inexact(a) -> bool:
    return np.asarray(a).dtype.kind in "fc"


@pytest.mark.parametrize("name", WITH_RULE)
def test_sparsity_rule_is_sound(name, rng):
    fn, args = EXAMPLES[name]
    graph = sd.trace(fn, *args)
    lowered = sd.graph.lower(graph)
    outs = [i for i, a in enumerate(graph.outputs)
            if np.dtype(sd.graph.runtime_type(a.type).dtype).kind in "fc"]
    wrt = [i for i, a in enumerate(args) if _inexact(a)]
    if not (outs and wrt):
        pytest.skip("the example has no float or complex input and output")
    for i in wrt:
        with warnings.catch_warnings():
            warnings.simplefilter("error", sd.errors.SparsityWarning)
            deps = sparsity_eval(graph, input_deps(graph.in_types,
                                                   [k == i for k in range(len(args))]))
        pattern = np.vstack([deps[o].matrix.toarray() for o in outs])
        x0 = np.asarray(args[i])
        nonzero = np.zeros(pattern.shape, bool)
        # real perturbations (and imaginary ones of a complex argument), at two
        # random points so that no entry is zero by chance; the derivative of
        # an output's real and imaginary parts
        for direction in ([1.0, 1j] if x0.dtype.kind == "c" else [1.0]):
            def f(t, x, i=i, direction=direction):
                full = [jax.numpy.asarray(a) for a in args]
                full[i] = x + direction * t
                res = lowered(*full)
                flat = jax.numpy.concatenate([jax.numpy.ravel(res[o]) for o in outs])
                return jax.numpy.stack([flat.real, flat.imag])

            with sd.config.x64_scope():
                for _ in range(2):
                    x = x0 * (1 + 0.05 * rng.standard_normal(x0.shape))
                    jac = np.asarray(jax.jacfwd(f)(np.zeros(x0.shape), x))
                    assert np.isfinite(jac).all(), f"{name}: a non-finite Jacobian"
                    nonzero |= (jac != 0).any(axis=0).reshape(pattern.shape)
        missed = np.argwhere(nonzero & ~pattern)
        assert not missed.size, (f"{name}: the pattern misses Jacobian entries (output "
                                 f"element, input element) {missed[:5].tolist()} of "
                                 f"argument {i}")
