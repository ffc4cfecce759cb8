"""JSON round trip of graphs.

The format is versioned (`"format": "sciad.graph", "version": 1`). Loading
never executes code: ops are looked up by name in the primitive registry
(an unknown name is a `SerializationError`), params are decoded by a fixed
table of tags, and arrays are raw little-endian bytes in base64.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any, Callable

import numpy as np

from ..errors import SerializationError, VerificationError
from ._core import Graph, Literal, Node, Var, lookup_primitive
from ._source import SourceInfo
from ._types import TensorType, runtime_type, type_from_json

FORMAT = "sciad.graph"
VERSION = 1

# tag -> (class, encode, decode): how a param class becomes JSON and back.
_PARAM_CODECS: dict[str, tuple[type, Callable[[Any], Any], Callable[[Any], Any]]] = {}


def register_param_type(cls: type, tag: str, encode: Callable[[Any], Any],
                        decode: Callable[[Any], Any]) -> None:
    """Makes params of class `cls` serializable as `{tag: encode(value)}`.

    `decode` must rebuild the value from plain JSON data, without executing
    anything named by the data.
    """
    _PARAM_CODECS[tag] = (cls, encode, decode)


def _encode_array(a: np.ndarray) -> dict:
    a = np.asarray(a)  # (not ascontiguousarray: it makes 0-d arrays 1-d)
    data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
    return {"dtype": a.dtype.name, "shape": list(a.shape),
            "data": base64.b64encode(data).decode("ascii")}


def _decode_array(d: dict) -> np.ndarray:
    dtype = np.dtype(d["dtype"])
    if dtype.kind not in "biufc":
        raise SerializationError(f"unsupported array dtype {dtype}.", op="from_json")
    raw = base64.b64decode(d["data"], validate=True)
    shape = tuple(int(s) for s in d["shape"])
    arr = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype)
    if arr.size != int(np.prod(shape, dtype=np.int64)):
        raise SerializationError(f"array data of {arr.size} elements does not fit shape "
                                 f"{shape}.", op="from_json")
    return arr.reshape(shape)


def _encode_float(v: float):
    if math.isfinite(v):
        return v
    return {"float": repr(v)}  # 'nan', 'inf', '-inf'


class _Encoder:
    def __init__(self):
        self.ids: dict[Var, int] = {}

    def var_id(self, v: Var) -> int:
        i = self.ids.get(v)
        if i is None:
            i = self.ids[v] = len(self.ids)
        return i

    def atom(self, a) -> dict:
        if isinstance(a, Literal):
            if not isinstance(a.type, TensorType):
                return {"literal": _encode_array(a.value), "type": a.type.to_json()}
            return {"literal": _encode_array(a.value)}
        return {"var": self.var_id(a)}

    def param(self, v: Any):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return _encode_float(v)
        if isinstance(v, complex):
            return {"complex": [_encode_float(v.real), _encode_float(v.imag)]}
        if isinstance(v, np.generic):
            return {"scalar": _encode_array(np.asarray(v))}
        if isinstance(v, np.dtype):
            return {"dtype": v.name}
        if isinstance(v, tuple):
            return {"tuple": [self.param(x) for x in v]}
        if isinstance(v, frozenset):
            return {"frozenset": sorted((self.param(x) for x in v), key=json.dumps)}
        if isinstance(v, Graph):
            return {"graph": self.graph(v)}
        for tag, (cls, encode, _) in _PARAM_CODECS.items():
            if type(v) is cls:
                return {tag: encode(v)}
        raise SerializationError(
            f"param value {v!r} of type {type(v).__name__} has no JSON form; register "
            "one with `sciad.graph.register_param_type`.", op="to_json")

    def graph(self, g: Graph) -> dict:
        inputs = [{"id": self.var_id(v), "type": v.type.to_json(),
                   **({"hint": v.hint} if v.hint else {})} for v in g.inputs]
        nodes = []
        for n in g.nodes:
            item = {
                "op": n.primitive.name,
                "inputs": [self.atom(a) for a in n.inputs],
                "outputs": [{"id": self.var_id(v), "type": v.type.to_json()}
                            for v in n.outputs],
                "params": {k: self.param(v) for k, v in sorted(n.params.items())},
            }
            if n.effects:
                item["effects"] = sorted(n.effects)
            if n.source is not None:
                item["source"] = n.source.to_json()
            nodes.append(item)
        return {"name": g.name, "inputs": inputs, "nodes": nodes,
                "outputs": [self.atom(a) for a in g.outputs]}


def graph_to_json(graph: Graph, *, indent: int | None = None) -> str:
    doc = {"format": FORMAT, "version": VERSION, "graph": _Encoder().graph(graph)}
    return json.dumps(doc, indent=indent, allow_nan=False)


class _Decoder:
    def __init__(self):
        self.vars: dict[int, Var] = {}

    def new_var(self, d: dict, hint=None) -> Var:
        i = int(d["id"])
        if i in self.vars:
            raise SerializationError(f"value id {i} is defined twice.", op="from_json")
        v = self.vars[i] = Var(type_from_json(d["type"]), hint)
        return v

    def atom(self, d: dict):
        if "literal" in d:
            value = _decode_array(d["literal"])
            if "type" not in d:
                return Literal(value)
            t = type_from_json(d["type"])
            rt = runtime_type(t)
            if rt is None or rt.shape != value.shape or rt.dtype != value.dtype:
                raise SerializationError(f"a constant of type {t.str_short()} cannot hold "
                                         f"a {value.dtype}{list(value.shape)} array.",
                                         op="from_json")
            return Literal(value, t)
        i = int(d["var"])
        try:
            return self.vars[i]
        except KeyError:
            raise SerializationError(f"value id {i} is used before it is defined.",
                                     op="from_json") from None

    def param(self, v):
        if v is None or isinstance(v, (bool, str, int, float)):
            return v
        if isinstance(v, list):
            raise SerializationError("a param is a bare list; tuples are tagged.",
                                     op="from_json")
        if not isinstance(v, dict) or len(v) != 1:
            raise SerializationError(f"malformed param {v!r}.", op="from_json")
        (tag, payload), = v.items()
        if tag == "float":
            if payload not in ("nan", "inf", "-inf"):
                raise SerializationError(f"bad float {payload!r}.", op="from_json")
            return float(payload)
        if tag == "complex":
            re_, im = (self.param(x) for x in payload)
            return complex(re_, im)
        if tag == "scalar":
            return _decode_array(payload)[()]
        if tag == "dtype":
            return np.dtype(payload)
        if tag == "tuple":
            return tuple(self.param(x) for x in payload)
        if tag == "frozenset":
            return frozenset(self.param(x) for x in payload)
        if tag == "graph":
            return _Decoder().graph(payload)
        if tag in _PARAM_CODECS:
            return _PARAM_CODECS[tag][2](payload)
        raise SerializationError(f"unknown param tag {tag!r}.", op="from_json")

    def graph(self, d: dict) -> Graph:
        inputs = tuple(self.new_var(x, x.get("hint")) for x in d["inputs"])
        nodes = []
        for item in d["nodes"]:
            prim = lookup_primitive(item["op"])
            if prim is None:
                raise SerializationError(
                    f"unknown op {item['op']!r}: no primitive of that name is registered. "
                    "Import the module that defines it before loading the graph.",
                    op="from_json")
            ins = tuple(self.atom(a) for a in item["inputs"])
            params = {k: self.param(v) for k, v in item.get("params", {}).items()}
            outs = tuple(self.new_var(o) for o in item["outputs"])
            nodes.append(Node(prim, ins, outs, params, frozenset(item.get("effects", ())),
                              SourceInfo.from_json(item.get("source"))))
        outputs = tuple(self.atom(a) for a in d["outputs"])
        return Graph(inputs, tuple(nodes), outputs, str(d.get("name", "graph")))


def graph_from_json(text: str) -> Graph:
    """Rebuilds a graph from `graph_to_json` output and verifies it."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError) as e:
        raise SerializationError(f"not valid JSON: {e}", op="from_json") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SerializationError(f"not a sciad graph (expected \"format\": \"{FORMAT}\").",
                                 op="from_json")
    if doc.get("version") != VERSION:
        raise SerializationError(
            f"graph format version {doc.get('version')!r} is not supported; this sciad "
            f"reads version {VERSION}.", op="from_json")
    try:
        graph = _Decoder().graph(doc["graph"])
    except SerializationError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SerializationError(f"malformed graph: {type(e).__name__}: {e}",
                                 op="from_json") from None
    from ._verify import verify

    try:
        verify(graph)
    except VerificationError as e:
        raise SerializationError(f"the graph does not verify: {e}", op="from_json") from None
    return graph
