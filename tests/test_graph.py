"""The IR's text form, DOT export, JSON format and verifier."""

import json

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import SerializationError, VerificationError
from sciad.graph import Graph, Literal, Node, TensorType, Var


def f(x, y, z):
    a = snp.sin(x) @ y + z
    return snp.sum(snp.exp(-a * a), axis=0) - snp.max(a, axis=0)


@pytest.fixture
def xyz(rng):
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)


GOLDEN_F = """\
graph f(%x: f64[3,4], %y: f64[4,5], %z: f64[5]) {
  %0 = sin %x                   : f64[3,4]
  %1 = matmul %0, %y            : f64[3,5]
  %2 = add %1, %z               : f64[3,5]
  %3 = neg %2                   : f64[3,5]
  %4 = mul %3, %2               : f64[3,5]
  %5 = exp %4                   : f64[3,5]
  %6 = reduce_sum[axes=(0,)] %5 : f64[5]
  %7 = reduce_max[axes=(0,)] %2 : f64[5]
  %8 = sub %6, %7               : f64[5]
  return %8
}"""


def test_golden_text(xyz):
    g = sd.trace(f, *xyz)
    assert g.pretty(source=False) == GOLDEN_F


def test_text_names_source_lines(xyz):
    g = sd.trace(f, *xyz)
    lines = str(g).splitlines()
    line_a = f.__code__.co_firstlineno + 1
    assert lines[1].endswith(f"# test_graph.py:{line_a}")
    assert lines[9].endswith(f"# test_graph.py:{line_a + 1}")
    assert g.nodes[0].source.function == "f"


def test_text_is_stable(xyz):
    assert str(sd.trace(f, *xyz)) == str(sd.trace(f, *xyz))


def test_literals_params_and_pytrees_print(rng):
    def g(params, x):
        h = snp.tanh(params["w"] @ x + params["b"])
        return {"out": 0.5 * h[::2] ** 2, "n": snp.astype(snp.sum(h), np.float32)}

    params = {"w": rng.standard_normal((4, 3)), "b": rng.standard_normal(4)}
    text = sd.trace(g, params, rng.standard_normal(3)).pretty(source=False)
    assert text == """\
graph g(%params_b: f64[4], %params_w: f64[4,3], %x: f64[3]) {
  %0 = matmul %params_w, %x      : f64[4]
  %1 = add %0, %params_b         : f64[4]
  %2 = tanh %1                   : f64[4]
  %3 = getitem[index=[0:4:2]] %2 : f64[2]
  %4 = pow %3, 2.0               : f64[2]
  %5 = mul 0.5, %4               : f64[2]
  %6 = reduce_sum[axes=(0,)] %2  : f64[]
  %7 = convert[dtype=f32] %6     : f32[]
  return %7, %5
}"""

def test_constants_print_compactly(rng):
    big = rng.standard_normal(100)
    g = sd.trace(lambda x: x * big + snp.matmul(np.array([1.0, 2.0]), np.ones(2)), big)
    text = g.pretty(source=False)
    assert "const<f64[100] #" in text
    assert "matmul f64[2]{1.0, 2.0}, f64[2]{1.0, 1.0}" in text
    # a float32 scalar keeps its dtype in the text
    g32 = sd.trace(lambda x: x + np.float32(3), big.astype(np.float32))
    assert "add %x, 3.0:f32" in g32.pretty(source=False)


def test_subgraph_prints_nested(rng):
    x = rng.standard_normal(3)
    inner = sd.trace(lambda a: (snp.sin(a),), x)
    g = sd.trace(lambda a: sd.call(inner, a)[0] * 2.0, x)
    text = g.pretty(source=False)
    assert "call[body=<body lambda>] %a" in text
    assert "    graph lambda(%a: f64[3]) [consts=1, carry=0, xs=0] {" in text
    assert "      %0 = sin %a" in text


def test_dot_export(xyz):
    dot = sd.trace(f, *xyz).to_dot()
    assert dot.startswith('digraph "f" {') and dot.rstrip().endswith("}")
    assert 'in0 [shape=ellipse, label="%x\\nf64[3,4]"]' in dot
    assert 'n1 [shape=box, label="matmul' in dot
    assert 'in1 -> n1 [label="f64[4,5]"]' in dot
    assert dot.count("shape=box") == 9


# ---------------------------------------------------------------------------
# JSON

def test_json_round_trip_is_lossless(xyz):
    g = sd.trace(f, *xyz)
    text = g.to_json()
    doc = json.loads(text)
    assert doc["format"] == "sciad.graph" and doc["version"] == 2
    back = Graph.from_json(text)
    assert back.to_json() == text and str(back) == str(g)
    np.testing.assert_array_equal(sd.graph.evaluate(back, *xyz)[0],
                                  sd.graph.evaluate(g, *xyz)[0])


def test_json_keeps_constants_exactly(rng):
    c = rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3))
    g = sd.trace(lambda x: x * c + np.inf, rng.standard_normal(3))
    back = Graph.from_json(g.to_json())
    lits = [a for n in back.nodes for a in n.inputs if isinstance(a, Literal)]
    np.testing.assert_array_equal(lits[0].value, c)
    assert lits[1].value.shape == () and np.isinf(lits[1].value)


def test_json_subgraph_round_trip(rng):
    x = rng.standard_normal(3)
    inner = sd.trace(lambda a: (snp.cos(a) + 1.0,), x)
    g = sd.trace(lambda a: sd.call(inner, a)[0], x)
    back = Graph.from_json(g.to_json())
    assert str(back) == str(g)
    np.testing.assert_allclose(sd.graph.evaluate(back, x)[0], np.cos(x) + 1.0)


def test_json_unknown_op_is_an_error(xyz):
    doc = json.loads(sd.trace(f, *xyz).to_json())
    doc["graph"]["nodes"][0]["op"] = "os.system"
    with pytest.raises(SerializationError, match="unknown op 'os.system'"):
        Graph.from_json(json.dumps(doc))


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(version=99), "version 99 is not supported"),
    (lambda d: d.update(format="pickle"), "not a sciad graph"),
    (lambda d: d["graph"]["nodes"][1]["inputs"].__setitem__(0, {"var": 77}),
     "used before it is defined"),
    (lambda d: d["graph"]["nodes"][0]["outputs"][0]["type"].update(shape=[9]),
     "disagree with the shape rule"),
    (lambda d: d["graph"]["nodes"][6]["params"].update(axes={"eval": "1"}),
     "unknown param tag 'eval'"),
    (lambda d: d["graph"]["inputs"][0]["type"].update(dtype="object"), "bad value type"),
])
def test_json_rejects_bad_documents(xyz, mutate, match):
    doc = json.loads(sd.trace(f, *xyz).to_json())
    mutate(doc)
    with pytest.raises(SerializationError, match=match):
        Graph.from_json(json.dumps(doc))


def test_json_rejects_non_json():
    with pytest.raises(SerializationError, match="not valid JSON"):
        Graph.from_json("{nope")


# ---------------------------------------------------------------------------
# verify

def _sin_node(x: Var, out: Var) -> Node:
    return Node(sd.graph.lookup_primitive("sin"), (x,), (out,), {})


def test_verify_accepts_traced_graphs(xyz):
    sd.graph.verify(sd.trace(f, *xyz))


def test_verify_rejects_use_before_def():
    x, y, z = (Var(TensorType((3,), np.float64)) for _ in range(3))
    g = Graph((x,), (_sin_node(y, z), _sin_node(x, y)), (z,))
    with pytest.raises(VerificationError, match=r"%0 is used before it is defined.*\n"
                                                r"  in: %1 = sin %0 : f64\[3\]"):
        sd.graph.verify(g)


def test_verify_rejects_double_definition():
    x, y = (Var(TensorType((3,), np.float64)) for _ in range(2))
    g = Graph((x,), (_sin_node(x, y), _sin_node(x, y)), (y,))
    with pytest.raises(VerificationError, match="defined twice"):
        sd.graph.verify(g)


def test_verify_rejects_wrong_types():
    x = Var(TensorType((3,), np.float64))
    y = Var(TensorType((3,), np.float32))
    g = Graph((x,), (_sin_node(x, y),), (y,))
    with pytest.raises(VerificationError, match=r"output types \(f32\[3\]\) disagree with "
                                                r"the shape rule of 'sin', which gives "
                                                r"\(f64\[3\]\)"):
        sd.graph.verify(g)


def test_verify_rejects_operands_the_rule_refuses():
    x = Var(TensorType((3,), np.float64))
    y = Var(TensorType((4,), np.float64))
    out = Var(TensorType((3,), np.float64))
    g = Graph((x, y), (Node(sd.graph.lookup_primitive("add"), (x, y), (out,), {}),), (out,))
    with pytest.raises(VerificationError, match="cannot be broadcast together"):
        sd.graph.verify(g)


def test_verify_rejects_undefined_output():
    x, y = (Var(TensorType((3,), np.float64)) for _ in range(2))
    with pytest.raises(VerificationError, match="output 0 .* is never defined"):
        sd.graph.verify(Graph((x,), (), (y,)))


def test_graphs_are_frozen(xyz):
    g = sd.trace(f, *xyz)
    with pytest.raises(AttributeError):
        g.nodes = ()
    g2 = g.replace(name="renamed")
    assert g2.name == "renamed" and g.name == "f"


def test_body_is_a_graph_with_its_layout(rng):
    from sciad.graph import Body
    from sciad.graph._body import drop_inputs

    x = rng.standard_normal(3)
    g = sd.trace(lambda c, u, k: (u * c + k, u.sum()), x, x, x)
    body = Body.of(g, num_consts=1, num_carry=1)
    assert isinstance(body, sd.graph.Graph) and body.layout == (1, 1, 1)
    renamed = body.replace(name="step")
    assert type(renamed) is Body and renamed.layout == (1, 1, 1)
    assert body.groups("abc") == (["a"], ["b"], ["c"])
    # dropping an input the body does not read: the counts count what stays
    h = sd.trace(lambda c, u: (u * 2.0,), x, x)
    dropped = drop_inputs(Body.of(h, num_consts=1, num_carry=1), [False, True])
    assert dropped.layout == (0, 1, 0)
    sd.graph.verify(dropped)
    with pytest.raises(VerificationError, match="layout"):
        sd.graph.verify(body.replace(num_xs=2))
    assert "[consts=1, carry=1, xs=1]" in body.pretty(source=False)
