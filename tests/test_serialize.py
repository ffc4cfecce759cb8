"""The graph-file loader on files from elsewhere: its limits (depth, nodes,
array elements), the params each primitive declares, the content hash, and a
fuzz test: whatever the bytes, `Graph.from_json` returns a graph or raises
`SerializationError` (`ResourceLimitError` is one), nothing else."""

import copy
import json
import re

import numpy as np
import pytest

import sciad as sd
import sciad.numpy as snp
from sciad.errors import (RegistrationError, ResourceLimitError, SerializationError,
                          VerificationError)
from sciad.graph import Graph, Node, Param, Pattern, SparseArray, SparseType, TensorType, Var
from sciad.primitives._sparse import sparse_matmul_p

# a 3 x 4 matrix in COO form, not in CSR order, so `sparse.assemble` carries an
# index map (a permutation: without it the same data is another matrix)
_ROW = np.array([2, 0, 1, 0, 2, 1])
_COL = np.array([0, 3, 1, 0, 2, 3])


def _sparse_graph(rng):
    """`sparse.assemble` (with an index map) and `sparse.matmul` (both ways)."""
    d, x, y = rng.standard_normal(6), rng.standard_normal(4), rng.standard_normal(3)

    def f(d, x, y):
        A = sd.sparse.coo_matrix((d, (_ROW, _COL)), shape=(3, 4))
        return A @ x, y @ A

    return sd.trace(f, d, x, y), (d, x, y)


def _call_graph(rng):
    x, y = rng.standard_normal(3), rng.standard_normal(3)
    body = sd.trace(lambda a, b: (snp.sin(a) * b, a - b), x, y)
    return sd.trace(lambda a, b: sd.call(body, a, b)[0] * 2.0, x, y), (x, y)


def _fft_graph(rng):
    x = rng.standard_normal((4, 6))
    return sd.trace(lambda x: sd.fft.irfft(sd.fft.rfft(x) * 0.5, n=6), x), (x,)


def _const_graph(n=20):
    c = np.linspace(0.0, 1.0, n)
    return sd.trace(lambda x: x * c, np.ones(n))


def _node(doc_graph: dict, op: str) -> dict:
    """The first node of `op` in a graph's JSON."""
    return next(n for n in doc_graph["nodes"] if n["op"] == op)


def _load_doc(doc, **kw):
    return Graph.from_json(json.dumps(doc), **kw)


def _nested_calls(depth: int) -> str:
    """A file of `depth` `call`s, each in the `body` param of the one around it
    (built as text: `json.dumps` itself would recurse too deeply)."""
    x = np.ones(3)
    leaf = sd.trace(lambda a: (snp.sin(a),), x)
    wrapper = json.loads(sd.trace(lambda a: sd.call(leaf, a), x).to_json())
    wrapper["graph"]["nodes"][0]["params"]["body"]["body"] = "@@"
    layout = {"layout": [1, 0, 0]}  # (a body: its graph and its layout)
    inner = json.dumps({**json.loads(leaf.to_json())["graph"], **layout})
    middle = json.dumps({**wrapper["graph"], **layout})
    for _ in range(depth - 1):
        inner = middle.replace('"@@"', inner)
    inner = json.dumps(wrapper["graph"]).replace('"@@"', inner)
    return json.dumps({"format": "sciad.graph", "version": 2, "graph": "@@"}).replace(
        '"@@"', inner)


# ---------------------------------------------------------------------------
# The four defects found by trying the loader as a user would


def test_defect_deep_nesting_is_a_limit_not_a_recursion_error():
    for text in ("[" * 100_000 + "]" * 100_000, '{"a": ' * 800 + "1" + "}" * 800):
        with pytest.raises(ResourceLimitError, match="nest more than 528 levels deep, the "
                                                     "most a graph file of max_depth=64 has"):
            Graph.from_json(text)
    # a `call` in a `call` in ... 300 deep
    with pytest.raises(ResourceLimitError, match="max_depth=64"):
        Graph.from_json(_nested_calls(300))


def test_defect_huge_declared_shapes_are_errors_not_overflow():
    doc = json.loads(_const_graph().to_json())
    lit = _node(doc["graph"], "mul")["inputs"][1]["literal"]
    for shape, error in (([1e30], SerializationError), ([10**30], ResourceLimitError),
                         ([2**40, 2**40], ResourceLimitError), ([-1], SerializationError)):
        lit["shape"] = shape
        with pytest.raises(error, match=r"node 0 \(mul\)"):
            _load_doc(doc)
    for shape, error in (([1e30], SerializationError), ([10**30], ResourceLimitError)):
        doc = json.loads(_const_graph().to_json())
        doc["graph"]["inputs"][0]["type"]["shape"] = shape
        doc["graph"]["nodes"][0]["outputs"][0]["type"]["shape"] = shape
        with pytest.raises(error, match="input 0 of graph"):
            _load_doc(doc)


def test_defect_deleting_an_optional_param_is_an_error(rng):
    g, args = _sparse_graph(rng)
    doc = json.loads(g.to_json())
    assert "index_map" in _node(doc["graph"], "sparse.assemble")["params"]["index"]
    del _node(doc["graph"], "sparse.assemble")["params"]["index"]
    with pytest.raises(SerializationError,
                       match=r"node \d+ \(sparse\.assemble\) of graph 'f': missing param "
                             r"`index` \(expected IndexMap \| None = None\); a graph file "
                             "states every declared param"):
        _load_doc(doc)
    # the same for `transpose` of `y @ A` (A.T @ y without it: another product)
    doc = json.loads(g.to_json())
    mm = [n for n in doc["graph"]["nodes"] if n["op"] == "sparse.matmul"]
    assert mm[1]["params"]["transpose"] is True
    del mm[1]["params"]["transpose"]
    with pytest.raises(SerializationError, match="missing param `transpose`"):
        _load_doc(doc)


def test_defect_node_count_has_a_default_limit():
    g = sd.trace(lambda a: snp.sin(a), np.ones(3))
    doc = json.loads(g.to_json())
    doc["graph"]["nodes"] = ["@@"]
    node = '{"op":"sin"}'  # (counted before any node is read)
    text = json.dumps(doc).replace('"@@"', ",".join([node] * 100_001))
    with pytest.raises(ResourceLimitError, match=r"graph 'lambda': its 100_001 nodes .* "
                                                 r"over max_nodes=100_000"):
        Graph.from_json(text)


def test_a_million_node_file_is_refused_while_it_is_read(monkeypatch):
    """It had been parsed whole (59 s, 1.7 GB for one as `to_json` writes it)
    before its node count was read: the parser now counts nodes as it reads
    them and stops at the first one over `max_nodes`."""
    from sciad.graph import _serialize

    node = '{"op": "neg", "inputs": [{"var": 0}], "outputs": []}'
    text = ('{"format": "sciad.graph", "version": 1, "graph": {"name": "g", "inputs": [], '
            '"nodes": [' + ", ".join([node] * 1_000_000) + '], "outputs": []}}')
    seen = {"objects": 0}
    read = _serialize._Reader.__call__

    def counted(self, d):
        seen["objects"] += 1
        return read(self, d)

    monkeypatch.setattr(_serialize._Reader, "__call__", counted)
    with pytest.raises(ResourceLimitError, match="more than max_nodes=100_000 nodes "
                                                 r"\(counted while the file is read"):
        Graph.from_json(text)
    assert seen["objects"] == 2 * 100_001  # (each node and its operand: then it stopped)


def test_limits_while_reading_bytes_and_param_tuples():
    text = sd.trace(lambda a: snp.sum(a, axis=0), np.ones((2, 3))).to_json()
    Graph.from_json(text, max_bytes=len(text))
    with pytest.raises(ResourceLimitError, match=f"the text is {len(text) + 3} bytes long, "
                                                 f"over max_bytes={len(text) + 2}"):
        Graph.from_json(text.encode() + b"   ", max_bytes=len(text) + 2)
    with pytest.raises(SerializationError, match="`max_bytes` must be a positive int"):
        Graph.from_json(text, max_bytes=0)
    doc = json.loads(text)  # a param tuple of 10**6 items (its JSON is 3 MB)
    _node(doc["graph"], "reduce_sum")["params"]["axes"] = {"tuple": [0] * 10**6}
    with pytest.raises(ResourceLimitError, match="param tuples hold more than "
                                                 "max_elements=1_000 elements"):
        _load_doc(doc, max_elements=1000)
    # a small file is parsed whole: the decoder names where it is over
    _node(doc["graph"], "reduce_sum")["params"]["axes"] = {"tuple": [0] * 2000}
    with pytest.raises(ResourceLimitError, match=r"param `axes` of node 0 \(reduce_sum\).*"
                                                 "a tuple param of 2_000 items brings"):
        _load_doc(doc, max_elements=1000)


# ---------------------------------------------------------------------------
# Limits, with small overrides


def test_node_limit_counts_subgraphs_and_names_the_node(rng):
    g, _ = _call_graph(rng)  # 2 nodes outside, 3 in the body
    Graph.from_json(g.to_json(), max_nodes=5)
    with pytest.raises(ResourceLimitError,
                       match=r"graph 'lambda', in param `body` of node 0 \(call\) of "
                             r"graph 'lambda': its 3 nodes bring the file's nodes to 5, over "
                             "max_nodes=4"):
        Graph.from_json(g.to_json(), max_nodes=4)
    with pytest.raises(ResourceLimitError, match="over max_nodes=1"):
        Graph.from_json(g.to_json(), max_nodes=1)


def test_element_limit_counts_declared_shapes_before_decoding():
    c1, c2 = np.arange(12.0), np.ones(12)
    text = sd.trace(lambda x: x * c1 + c2, 2.0).to_json()
    Graph.from_json(text, max_elements=24)
    with pytest.raises(ResourceLimitError,
                       match=r"operand 1 of node 1 \(add\) of graph 'lambda': a float64 "
                             r"array of shape \[12\] brings the elements decoded to 24, "
                             "over max_elements=23"):
        Graph.from_json(text, max_elements=23)
    # a declared value type larger than the budget, though nothing is decoded for it
    text = sd.trace(lambda x: snp.sin(x), np.ones(12)).to_json()
    with pytest.raises(ResourceLimitError, match=r"input 0 of graph 'lambda': a tensor type of "
                                                 r"shape \[12\] has 12 elements, over "
                                                 "max_elements=11"):
        Graph.from_json(text, max_elements=11)


def test_array_data_must_fit_the_declared_shape():
    doc = json.loads(_const_graph(20).to_json())
    lit = _node(doc["graph"], "mul")["inputs"][1]["literal"]
    good = lit["data"]
    for data, match in ((good[:-4], r"\(160 bytes\) takes 216 base64 characters, got 212"),
                        ("A" * 10**6, "got 1000000 base64 characters"),
                        (good[:-1] + "*", "not base64"), (7, "got int 7")):
        lit["data"] = data
        with pytest.raises(SerializationError, match=match):
            _load_doc(doc)
    lit["data"], lit["dtype"] = good, "object"
    with pytest.raises(SerializationError, match="unsupported dtype str 'object'"):
        _load_doc(doc)


def test_a_wide_sparse_pattern_counts_its_columns():
    # (the shape rules build per-column index maps: a file declaring 1e9
    # columns and no entries must not make the loader allocate them)
    pattern = Pattern((1, 10**9), [0, 0], [])
    A = SparseArray(np.zeros(0), SparseType(pattern, np.float64))
    text = sd.trace(lambda a: a, A).to_json()
    with pytest.raises(ResourceLimitError, match="input 0 of graph 'lambda': a sparse "
                                                 "pattern of shape"):
        Graph.from_json(text)
    with pytest.raises(ResourceLimitError, match="brings the elements decoded to "
                                                 "1_000_000_002, over max_elements"):
        Graph.from_json(text, max_elements=10**9)
    assert Graph.from_json(text, max_elements=10**9 + 10).inputs[0].type.shape == (1, 10**9)


def test_depth_limit_counts_subgraphs_and_param_tuples():
    x = np.ones(3)
    g = Graph.from_json(_nested_calls(10))
    np.testing.assert_allclose(sd.graph.evaluate(g, x)[0], np.sin(x))
    with pytest.raises(ResourceLimitError,
                       match=r"graph 'lambda', in param `body` of node 0 \(call\) of graph "
                             r"'lambda', in .* nest 6 levels deep, over max_depth=5"):
        Graph.from_json(_nested_calls(7), max_depth=5)
    with pytest.raises(ResourceLimitError, match="JSON arrays and objects nest more than "
                                                 "56 levels deep"):
        Graph.from_json(_nested_calls(10), max_depth=5)
    with pytest.raises(ResourceLimitError, match="over max_depth=64"):
        Graph.from_json(_nested_calls(70))
    Graph.from_json(_nested_calls(100), max_depth=120)
    # nested tuples in a param
    doc = json.loads(sd.trace(lambda a: snp.sum(a, axis=0), np.ones((2, 3))).to_json())
    axes = {"tuple": [0]}
    for _ in range(70):
        axes = {"tuple": [axes]}
    _node(doc["graph"], "reduce_sum")["params"]["axes"] = axes
    with pytest.raises(ResourceLimitError, match=r"param `axes` of node 0 \(reduce_sum\).*"
                                                 "max_depth=64"):
        _load_doc(doc)


def test_limit_arguments_are_checked():
    for kw in ({"max_nodes": 0}, {"max_elements": -1}, {"max_depth": 2.5},
               {"max_depth": True}):
        with pytest.raises(SerializationError, match="must be a positive int"):
            Graph.from_json("{}", **kw)


def test_text_forms():
    text = _const_graph(3).to_json()
    assert str(Graph.from_json(text.encode())) == str(Graph.from_json(text))
    with pytest.raises(SerializationError, match="not UTF-8"):
        Graph.from_json(b"\xff" + text.encode())
    with pytest.raises(SerializationError, match="NaN is not a JSON value"):
        Graph.from_json(text.replace("[3]", "[NaN]", 1))
    with pytest.raises(SerializationError, match="expects JSON text"):
        Graph.from_json(None)
    with pytest.raises(SerializationError, match="unknown key 'extra' in a node"):
        doc = json.loads(text)
        doc["graph"]["nodes"][0]["extra"] = 1
        _load_doc(doc)


# ---------------------------------------------------------------------------
# Declared params


def test_files_state_defaults_and_memory_leaves_them_out(rng):
    g, args = _sparse_graph(rng)
    doc = json.loads(g.to_json())
    assert _node(doc["graph"], "sparse.assemble")["params"]["tags"] == {"frozenset": []}
    assert _node(doc["graph"], "sparse.matmul")["params"]["transpose"] is False
    back = Graph.from_json(g.to_json())
    assert str(back) == str(g) and back.to_json() == g.to_json()
    assemble = next(n for n in back.nodes if n.primitive.name == "sparse.assemble")
    assert set(assemble.params) == {"pattern", "index"}
    for want, got in zip(sd.graph.evaluate(g, *args), sd.graph.evaluate(back, *args)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_printer_hides_a_param_at_its_default(rng):
    A = sd.sparse.coo_matrix((rng.standard_normal(6), (_ROW, _COL)), shape=(3, 4))
    x = rng.standard_normal(4)
    g = sd.trace(lambda x: sparse_matmul_p.bind(A, x, pattern=A.pattern, transpose=False), x)
    assert g.nodes[-1].params["transpose"] is False
    assert "transpose" not in str(g)
    back = Graph.from_json(g.to_json())
    assert "transpose" not in back.nodes[-1].params and str(back) == str(g)


@pytest.mark.parametrize("op, key, value, match", [
    ("sparse.assemble", "index", 3,
     r"node 0 \(sparse\.assemble\) of graph 'f': param `index` expects IndexMap \| None, "
     "got int 3"),
    ("sparse.assemble", "indx", None,
     r"unknown param `indx` \(declared: `pattern`, `index`, `tags`\)"),
    ("sparse.assemble", "tags", {"frozenset": ["spd", 1]},
     r"param `tags` expects frozenset\[str\], got frozenset .* \(it holds int 1\)"),
    ("sparse.matmul", "transpose", 1, "param `transpose` expects bool, got int 1"),
    ("sparse.matmul", "pattern", {"tuple": []}, "param `pattern` expects Pattern, got tuple"),
])
def test_params_are_checked_against_the_declaration(rng, op, key, value, match):
    g, _ = _sparse_graph(rng)
    doc = json.loads(g.to_json())
    _node(doc["graph"], op)["params"][key] = value
    with pytest.raises(SerializationError, match=match):
        _load_doc(doc)


def test_tuple_params_name_the_bad_element():
    doc = json.loads(sd.trace(lambda a: snp.sum(a, axis=0), np.ones((2, 3))).to_json())
    params = _node(doc["graph"], "reduce_sum")["params"]
    params["axes"] = {"tuple": [0, 1.5]}
    with pytest.raises(SerializationError, match=r"param `axes` expects tuple\[int, \.\.\.\], "
                                                 r"got tuple \(0, 1\.5\) \(element 1 is "
                                                 r"float 1\.5\)"):
        _load_doc(doc)
    params["axes"] = {"tuple": [True]}  # a bool is not an int here
    with pytest.raises(SerializationError, match="element 0 is bool True"):
        _load_doc(doc)
    params["axes"] = [0]
    with pytest.raises(SerializationError, match="bare JSON array"):
        _load_doc(doc)


undeclared_p = sd.primitive("test_serialize_undeclared")
undeclared_p.def_abstract_eval(lambda x, **params: x)
undeclared_p.def_impl(lambda x, **params: x)

scaled_p = sd.primitive("test_serialize_scaled",
                        params={"scale": float, "shift": Param(float, default=0.0)})


@scaled_p.def_abstract_eval
def _scaled_shape(x, *, scale, shift=0.0):
    return x


@scaled_p.def_impl
def _scaled_impl(x, *, scale, shift=0.0):
    return scale * x + shift


def test_user_primitive_without_a_declaration_accepts_any_params():
    assert undeclared_p.params is None
    g = sd.trace(lambda x: undeclared_p(x, anything=(1, "a"), more=2.5), np.ones(2))
    doc = json.loads(g.to_json())
    doc["graph"]["nodes"][0]["params"]["extra"] = None
    back = _load_doc(doc)
    assert back.nodes[0].params == {"anything": (1, "a"), "more": 2.5, "extra": None}


def test_user_primitive_with_a_declaration():
    assert repr(scaled_p) == ("Primitive('test_serialize_scaled', params=(scale: float, "
                              "shift: float = 0.0), rules=[impl, abstract_eval])")
    x = np.arange(3.0)
    g = sd.trace(lambda x: scaled_p(x, scale=2.0), x)
    assert str(g).splitlines()[1].startswith("  %0 = test_serialize_scaled[scale=2.0] %x")
    doc = json.loads(g.to_json())
    assert doc["graph"]["nodes"][0]["params"] == {"scale": 2.0, "shift": 0.0}
    np.testing.assert_array_equal(sd.graph.evaluate(_load_doc(doc), x)[0], 2 * x)
    doc["graph"]["nodes"][0]["params"]["shift"] = 1.0
    np.testing.assert_array_equal(sd.graph.evaluate(_load_doc(doc), x)[0], 2 * x + 1)
    del doc["graph"]["nodes"][0]["params"]["shift"]
    with pytest.raises(SerializationError, match="missing param `shift`"):
        _load_doc(doc)
    doc["graph"]["nodes"][0]["params"].update(scale="2", shift=0.0)
    with pytest.raises(SerializationError, match=r"test_serialize_scaled\) of graph 'lambda': "
                                                 "param `scale` expects float, got str '2'"):
        _load_doc(doc)


def test_verify_and_to_json_check_hand_built_nodes():
    x, out = Var(TensorType((3,), np.float64)), Var(TensorType((3,), np.float64))
    bad = Graph((x,), (Node(scaled_p, (x,), (out,), {"scale": 1}),), (out,), "bad")
    with pytest.raises(VerificationError, match=r"graph 'bad': test_serialize_scaled: param "
                                                r"`scale` expects float, got int 1"):
        sd.graph.verify(bad)
    with pytest.raises(SerializationError, match=r"to_json: node 0 \(test_serialize_scaled\) "
                                                 "of graph 'bad': param `scale`"):
        bad.to_json()
    missing = Graph((x,), (Node(scaled_p, (x,), (out,), {}),), (out,), "bad")
    with pytest.raises(VerificationError, match=r"missing param `scale` \(expected float\)"):
        sd.graph.verify(missing)
    sin = sd.graph.lookup_primitive("sin")
    extra = Graph((x,), (Node(sin, (x,), (out,), {"axis": 0}),), (out,), "bad")
    with pytest.raises(VerificationError, match=r"unknown param `axis` \(declared: none\)"):
        sd.graph.verify(extra)


@pytest.mark.parametrize("params, match", [
    (lambda: {"a": list[int]}, "param `a`: .* is not a type spec"),
    (lambda: {"a": Param(int, default="1")},
     "the default str '1' does not match the declared type int"),
    (lambda: {"a b": int}, "a param name must be an identifier"),
    (lambda: {"a": ()}, "an empty tuple of alternatives"),
    (lambda: [("a", int)], "`params` must map param names"),
])
def test_malformed_declarations_are_registration_errors(params, match):
    with pytest.raises(RegistrationError, match=match):
        sd.primitive("test_serialize_malformed", params=params())
    assert sd.graph.lookup_primitive("test_serialize_malformed") is None


def test_param_specs():
    spec = Param(tuple[tuple[int, int], ...] | None, default=None)
    assert spec.accepts(((0, 1), (2, 3))) and spec.accepts(None) and spec.accepts(())
    assert not spec.accepts(((0, 1, 2),)) and not spec.accepts([(0, 1)])
    assert str(spec) == "tuple[tuple[int, int], ...] | None = None"
    assert spec.is_default(None) and not spec.is_default(())
    flag = Param(bool, default=False)
    assert flag.is_default(False) and not flag.is_default(0) and not flag.accepts(0)
    assert repr(Param(np.dtype)) == "Param(numpy.dtype)" and Param(int).required


# ---------------------------------------------------------------------------
# Content hash


def test_hash_round_trip_and_tamper_detection():
    g = _const_graph(20)
    text = g.to_json(hash=True)
    doc = json.loads(text)
    assert re.fullmatch(r"[0-9a-f]{64}", doc["sha256"])
    assert str(Graph.from_json(text, require_hash=True)) == str(g)
    # the hash is of the document, not of its formatting
    pretty = g.to_json(hash=True, indent=2)
    assert json.loads(pretty)["sha256"] == doc["sha256"]
    Graph.from_json(pretty, require_hash=True)
    # one base64 character changed: still a valid graph, but not the one written
    lit = _node(doc["graph"], "mul")["inputs"][1]["literal"]
    lit["data"] = ("B" if lit["data"][0] != "B" else "C") + lit["data"][1:]
    with pytest.raises(SerializationError, match="modified or corrupted"):
        _load_doc(doc)
    del doc["sha256"]
    _load_doc(doc)  # (without a hash nothing says it changed)
    with pytest.raises(SerializationError, match=r"no content hash .*require_hash=True"):
        _load_doc(doc, require_hash=True)
    doc["sha256"] = "not a hash"
    with pytest.raises(SerializationError, match="64 lowercase hex digits"):
        _load_doc(doc)


# ---------------------------------------------------------------------------
# Fuzz: the only exception out of the loader is SerializationError

_ODD_VALUES = [None, True, False, 0, -1, 1, 2**31, 2**63, 10**30, 1e30, -0.5, "", "x",
               "float64", "sin", [], {}, [0], [[[[]]]], {"tuple": []}, {"tuple": [{}]},
               {"graph": {}}, {"graph": None}, {"float": "nan"}, {"float": "1"},
               {"complex": [1]}, {"scalar": {"dtype": "float64", "shape": [2], "data": ""}},
               {"dtype": "object"}, {"var": 0}, {"var": -1}, {"literal": {}},
               {"kind": "tensor", "shape": [1e30], "dtype": "float64"},
               {"kind": "tensor", "shape": [10**30], "dtype": "float64"},
               {"kind": "sparse"}, {"kind": "factor", "shape": [2, 2]},
               {"index_map": {"dtype": "int64", "shape": [1], "data": "AAAAAAAAAAA="}},
               {"pattern": {"shape": [2, 10**12], "indptr": {}, "indices": {}}},
               {"index": [[0, None, 0]]}, {"index": [{}]}, "A" * 300,
               float("nan"), float("inf")]
_ODD_OPS = ["os.system", "", " sin", "SIN", "sin", "call", "sparse.assemble", "fft",
            "linalg.solve", "add_any", "zeros", "é", "a" * 500]
_ODD_DATA = ["", "=", "====", "@@@@", "AAAA" * 1000, "é", "\x00\x01", "A===", "AA==AA=="]


def _slots(tree):
    """Every (container, key) in a JSON tree, containers of the tree included."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            out.append((node, k))
            if isinstance(v, (dict, list)):
                stack.append(v)
    return out


def _mutate(doc, rng) -> tuple[str, object]:
    """One mutation of a parsed document: (its kind, the mutated document)."""
    doc = copy.deepcopy(doc)
    kind = ("delete", "replace", "op", "data")[rng.integers(4)]
    slots = _slots(doc)
    if kind == "delete":
        dict_slots = [(c, k) for c, k in slots if isinstance(c, dict)]
        container, key = dict_slots[rng.integers(len(dict_slots))]
        del container[key]
    elif kind == "replace":
        container, key = slots[rng.integers(len(slots))]
        container[key] = copy.deepcopy(_ODD_VALUES[rng.integers(len(_ODD_VALUES))])
    elif kind == "op":
        ops = [(c, k) for c, k in slots if k == "op"]
        container, key = ops[rng.integers(len(ops))]
        container[key] = _ODD_OPS[rng.integers(len(_ODD_OPS))]
    else:
        datas = [(c, k) for c, k in slots if k == "data"] or slots
        container, key = datas[rng.integers(len(datas))]
        old = container[key]
        if rng.integers(2) and isinstance(old, str) and old:  # same length, one char odd
            i = rng.integers(len(old))
            container[key] = old[:i] + "=*-_ Az09+/"[rng.integers(11)] + old[i + 1:]
        else:
            container[key] = _ODD_DATA[rng.integers(len(_ODD_DATA))]
    return kind, doc


def _loads_or_serialization_error(text, **kw) -> bool:
    """True if it loaded; False if it raised SerializationError; anything else
    fails the test, with the case."""
    try:
        Graph.from_json(text, **kw)
        return True
    except SerializationError:
        return False
    except BaseException as e:  # pragma: no cover - what the test is for
        shown = text if len(text) < 2000 else text[:2000] + "..."
        raise AssertionError(f"{type(e).__name__}: {e}\nfor the file:\n{shown!r}") from e


def test_fuzz_only_serialization_errors_escape():
    rng = np.random.default_rng(20240611)
    graphs = [_sparse_graph(rng)[0], _call_graph(rng)[0], _fft_graph(rng)[0]]
    loaded = rejected = 0
    for g in graphs:
        text = g.to_json()
        doc = json.loads(text)
        raw = text.encode()
        for _ in range(40):  # truncations
            loaded += _loads_or_serialization_error(text[:rng.integers(len(text))])
        for _ in range(40):  # one byte changed (the result may not be UTF-8)
            b = bytearray(raw)
            b[rng.integers(len(b))] ^= 1 << int(rng.integers(8))
            loaded += _loads_or_serialization_error(bytes(b))
        for _ in range(60):  # keys deleted, values replaced, ops and payloads changed
            _, mutated = _mutate(doc, rng)
            ok = _loads_or_serialization_error(json.dumps(mutated))
            loaded += ok
            rejected += not ok
    assert rejected > 100, "the mutations should mostly make files the loader rejects"


def test_fuzz_hashed_files_reject_every_change():
    rng = np.random.default_rng(7)
    for g in (_sparse_graph(rng)[0], _call_graph(rng)[0]):
        text = g.to_json(hash=True)
        doc = json.loads(text)
        canonical = json.dumps(doc, sort_keys=True)
        for _ in range(40):
            kind, mutated = _mutate(doc, rng)
            mutated_text = json.dumps(mutated)
            if json.dumps(mutated, sort_keys=True) == canonical:
                continue  # (a value replaced by an equal one)
            assert not _loads_or_serialization_error(mutated_text, require_hash=True), kind


def _as_version_1(doc):
    """A document as version 1 wrote it: bodies were plain `graph` params, the
    loops held their counts as `num_consts` (and scan `num_carry`), and
    `call`, the matrix-free operators, `optimize.root` and `ode.odeint` held
    their body as `graph` (what `register_v1_migration` reads)."""
    renamed = {"call", "linalg.eigsh_operator", "linalg.solve_operator", "optimize.root",
               "ode.odeint"}

    def strip(v):
        if isinstance(v, list):
            return [strip(x) for x in v]
        if not isinstance(v, dict):
            return v
        if set(v) == {"body"} and isinstance(v["body"], dict) and "layout" in v["body"]:
            return {"graph": strip({k: x for k, x in v["body"].items() if k != "layout"})}
        out = {k: strip(x) for k, x in v.items()}
        op, params = v.get("op"), v.get("params")
        if op in ("scan", "scan_adjoint", "while", "while_adjoint"):
            nc, nk, _ = params["body"]["body"]["layout"]
            out["params"]["num_consts"] = nc
            if op.startswith("scan"):
                out["params"]["num_carry"] = nk
        if op in ("scan_adjoint", "while_adjoint"):  # (the split is the migration's sum)
            out["params"]["num_ct_carry"] = params["step"]["body"]["layout"][1]
            out["params"]["num_acc"] = 0
        if op in renamed:
            out["params"]["graph"] = out["params"].pop("body")
        return out

    return {**strip(doc), "version": 1}


def _assert_loads_as(old, g, x):
    """The version-1 document `old` loads as today's `g`: same text, same value at `x`."""
    back = _load_doc(old)
    assert back.pretty(source=False) == g.pretty(source=False)
    np.testing.assert_allclose(sd.graph.evaluate(back, x)[0], sd.graph.evaluate(g, x)[0])


def test_version_1_files_still_load(rng):
    x = rng.standard_normal(3)
    inner = sd.trace(lambda a: (snp.sin(a) * 2.0,), x)
    g = sd.trace(lambda a: sd.call(inner, a)[0] + sd.cond(a[0] > 0, lambda b: b * 2.0,
                                                          lambda b: b - 1.0, a), x)
    doc = json.loads(g.to_json())
    assert doc["version"] == 2
    old = _as_version_1(doc)
    assert '"layout"' not in json.dumps(old) and '"graph": {"graph"' in json.dumps(old)
    _assert_loads_as(old, g, x)


def test_version_1_loops_load(rng):
    x = rng.standard_normal(3)
    c = rng.standard_normal(3)

    def f(x):
        u, ys = sd.scan(lambda u, k: (u * c + k, u.sum()), x, x)
        v = sd.while_loop(lambda v: v[0] < 10.0, lambda v: v * 2.0 + c, snp.abs(u) + 1.0,
                          max_steps=50)
        return v + ys.sum()

    g = sd.trace(f, x)
    old = _as_version_1(json.loads(g.to_json()))
    assert '"num_consts"' in json.dumps(old) and '"layout"' not in json.dumps(old)
    _assert_loads_as(old, g, x)


def test_version_1_loop_adjoints_load(rng):
    # scan_adjoint and while_adjoint: their step was a plain graph whose
    # carries `num_ct_carry` and `num_acc` counted
    x = rng.standard_normal(3)
    c = rng.standard_normal(3)

    def f(x):
        u, ys = sd.scan(lambda u, k: (u * c + snp.sin(k), u.sum()), x, x, checkpoints=2)
        v = sd.while_loop(lambda v: v[0] < 10.0, lambda v: v * 2.0 + c * c, snp.abs(u) + 1.0,
                          max_steps=50)
        return (v + ys.sum()).sum()

    g = sd.trace(sd.grad(f), x)
    assert {"scan_adjoint", "while_adjoint"} <= {n.primitive.name for n in g.nodes}
    old = _as_version_1(json.loads(g.to_json()))
    assert '"num_ct_carry"' in json.dumps(old) and '"layout"' not in json.dumps(old)
    _assert_loads_as(old, g, x)


def test_version_1_roots_odes_and_operators_load(rng):
    # optimize.root, ode.odeint and the matrix-free solve held their body as
    # the param `graph`
    x = 1.0 + rng.uniform(size=2)

    def f(a):
        r = sd.optimize.root(lambda y, a: y ** 3 - a, snp.ones(2), (a,)).x
        ys = sd.ode.odeint(lambda t, y, k: -k * y, r, np.array([0.0, 0.5]), a[0])
        op = sd.linalg.operator(lambda v: a * v, (2, 2), tags={"spd"})
        return sd.linalg.solve(op, ys[-1], tol=1e-12)

    g = sd.trace(f, x)
    assert {"optimize.root", "ode.odeint", "linalg.solve_operator"} <= {
        n.primitive.name for n in g.nodes}
    old = _as_version_1(json.loads(g.to_json()))
    assert '"layout"' not in json.dumps(old) and '"graph": {"graph"' in json.dumps(old)
    _assert_loads_as(old, g, x)
