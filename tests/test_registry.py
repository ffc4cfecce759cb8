"""Walks the whole primitive registry: every built-in primitive has an example,
declares its params, its shape rule agrees with `jax.eval_shape` of its
implementation, and graphs using it round-trip through JSON and run
identically afterwards."""

import json

import jax
import numpy as np
import pytest

import sciad as sd
from registry_examples import EXAMPLES, builtin_primitives, elementwise_representatives

BUILTINS = sorted(builtin_primitives())


def test_every_builtin_primitive_has_an_example():
    missing = sorted(set(BUILTINS) - set(EXAMPLES))
    assert not missing, f"add examples to tests/registry_examples.py for: {missing}"


def test_every_builtin_primitive_declares_its_params():
    undeclared = {name for name in BUILTINS
                  if sd.graph.lookup_primitive(name).params is None}
    assert not undeclared, ("declare the params of these primitives (`Primitive(name, "
                            f"params={{...}})`, see `sciad.graph.Param`): {sorted(undeclared)}")


@pytest.mark.parametrize("name", [name for name in BUILTINS
                                  if sd.graph.lookup_primitive(name).params is not None])
def test_files_state_every_declared_param(name):
    fn, args = EXAMPLES[name]
    doc = json.loads(sd.trace(fn, *args).to_json())
    for node in doc["graph"]["nodes"]:
        declared = sd.graph.lookup_primitive(node["op"]).params
        if declared is not None:
            assert set(node["params"]) == set(declared), node["op"]


@pytest.mark.parametrize("name", BUILTINS)
def test_shape_rule_matches_implementation(name):
    fn, args = EXAMPLES[name]
    graph = sd.trace(fn, *args)
    nodes = [n for n in graph.nodes if n.primitive.name == name]
    assert nodes, f"the example for {name!r} does not use it:\n{graph}"
    rt = sd.graph.runtime_type
    with sd.config.x64_scope():
        for node in nodes:
            if any(rt(v.type) is None for v in node.inputs + node.outputs):
                continue  # a factorization: its run-time form is the backend's own
            # implementations see run-time arrays (a sparse matrix's data vector)
            ins = [jax.ShapeDtypeStruct(rt(a.type).shape, rt(a.type).dtype)
                   for a in node.inputs]
            out = jax.eval_shape(lambda *xs: node.primitive.impl_rule(*xs, **node.params), *ins)
            outs = out if node.primitive.multiple_results else (out,)
            got = [(tuple(o.shape), np.dtype(o.dtype)) for o in outs]
            want = [(rt(v.type).shape, rt(v.type).dtype) for v in node.outputs]
            assert got == want, f"{name}: impl gives {got}, shape rule says {want}"


@pytest.mark.parametrize("name", elementwise_representatives(BUILTINS))
def test_json_round_trip(name):
    fn, args = EXAMPLES[name]
    graph = sd.trace(fn, *args)
    text = graph.to_json()
    back = sd.Graph.from_json(text)
    assert back.to_json() == text
    assert str(back) == str(graph)
    want = sd.graph.evaluate(graph, *args)
    got = sd.graph.evaluate(back, *args)
    for w, g in zip(want, got):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
