"""JSON round trip of graphs.

The format is versioned (`"format": "sciad.graph", "version": 2`). Loading
never executes code: ops are looked up by name in the primitive registry
(an unknown name is a `SerializationError`), params are decoded by a fixed
table of tags, and arrays are raw little-endian bytes in base64.

A file states every param a primitive declares, defaults included, and the
loader checks each node's params against the declaration (`Param`), so a
param deleted from a file is an error, not a node that computes something
else. An optional `"sha256"` of the document's canonical form detects a file
modified or corrupted after it was written.

A node's body (`sciad.graph.Body`) is written as its graph with a
`"layout"`, `[num_consts, num_carry, num_xs]`. Version 1 files (written
before bodies were a type) still load: a primitive whose params changed
registers a migration (`register_v1_migration`) that rewrites a node's
version-1 params into today's (`graph` renamed `body`, `num_consts` and
`num_carry` moved into the body).

The loader is safe on files from elsewhere. It refuses a text longer than
`max_bytes` before parsing it, and counts while the JSON parser reads (one
call per object): nodes against `max_nodes`, and the declared elements of
arrays and the items of param tuples against `max_elements`; past the first
`READ_BEFORE_STOPPING` values it stops the parse at the first object over a
limit (a file of 1e6 nodes had been parsed whole, 59 s and 1.7 GB, before
its node count was read). Then it checks how deeply the file nests
(`max_depth`), and, while it decodes, the same limits per graph and node
(naming where), before it builds what the file describes: elements from the
declared shapes, before any base64 is decoded. A file over a limit is a
`ResourceLimitError`. Any other problem is a `SerializationError`: those two
are the only exceptions `graph_from_json` raises for bad input.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import hashlib
import json
import math
import re
from typing import Any, Callable

import numpy as np

from ..errors import ResourceLimitError, SerializationError, VerificationError
from ._body import Body
from ._core import Graph, Literal, Node, Var, lookup_primitive
from ._params import describe_value, shown_params
from ._source import SourceInfo
from ._types import _SHORT, AbstractType, TensorType, runtime_type, type_from_json
from ._verify import verify

FORMAT = "sciad.graph"
VERSION = 2
#: the versions the loader reads (older ones through `register_v1_migration`)
READABLE_VERSIONS = (1, 2)

#: Default limits of `graph_from_json`. A real graph has about a hundred
#: nodes (more after differentiating an unrolled loop) and arrays of 1e5 to
#: 1e6 elements (a sparse pattern and its index maps); it nests a few levels
#: (a `call` in a `call`, a tuple of pairs). The defaults leave two to three
#: orders of magnitude of room and still bound what a file can make the
#: loader do: 1e5 nodes take about 15 s and 250 MB to load and verify (2-core
#: machine), 1e8 elements at most 1.6 GB (complex128), and
#: 64 levels stay far inside Python's recursion limit in the loader, `verify`
#: and the printer.
MAX_NODES = 100_000
MAX_ELEMENTS = 100_000_000
MAX_DEPTH = 64
#: the longest text the loader parses: room for MAX_ELEMENTS float64
#: elements in base64 (1.07 GB) and MAX_NODES nodes of a few kB each; JSON
#: parsed into Python objects takes several times its length in memory
MAX_BYTES = 2**31

#: NumPy's limit on the number of dimensions of an array.
MAX_NDIM = 64

# The JSON nesting a document of `max_depth` levels of graphs and params may
# have: a graph nested in a param is five JSON levels below its parent (the
# node list, the node, its params, the param's tag, the graph), a tuple two,
# and a type up to eight below its graph. Checked right after `json.loads`
# (which itself gives up near 1000 levels with a RecursionError, caught),
# before anything recurses on the document.
_JSON_LEVELS_PER_DEPTH = 8
_JSON_LEVELS_SLACK = 16

_DOC_KEYS = frozenset({"format", "version", "sha256", "graph"})
_GRAPH_KEYS = frozenset({"name", "inputs", "nodes", "outputs"})
_BODY_KEYS = _GRAPH_KEYS | {"layout"}
_NODE_KEYS = frozenset({"op", "inputs", "outputs", "params", "effects", "source"})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

# tag -> (class, encode, decode): how a param class becomes JSON and back.
_PARAM_CODECS: dict[str, tuple[type, Callable[[Any], Any], Callable[[Any], Any]]] = {}


def register_param_type(cls: type, tag: str, encode: Callable[[Any], Any],
                        decode: Callable[[Any], Any]) -> None:
    """Makes params of class `cls` serializable as `{tag: encode(value)}`.

    `decode` must rebuild the value from plain JSON data, without executing
    anything named by the data. Arrays inside the payload should go through
    `_encode_array` / `_decode_array`, so that the loader's element budget
    counts them.
    """
    _PARAM_CODECS[tag] = (cls, encode, decode)


#: op name -> the function that rewrites a version-1 node's decoded params
_V1_MIGRATIONS: dict[str, Callable[[dict], dict]] = {}


def register_v1_migration(op: str, migrate: Callable[[dict], dict]) -> None:
    """Makes version-1 files with `op` nodes load: `migrate` takes such a
    node's decoded params (graphs as plain `Graph`s) and returns today's."""
    _V1_MIGRATIONS[op] = migrate


def graph_param_v1(as_body: Callable[["Graph"], "Graph"]) -> Callable[[dict], dict]:
    """The version-1 migration of a node whose body was the param `graph`:
    the param renamed `body`, its graph made a `Body` by `as_body`."""
    def migrate(params: dict) -> dict:
        params = dict(params)
        body = as_body(params.pop("graph"))
        return {**params, "body": body}

    return migrate


# --------------------------------------------------------------------------
# The loader's limits and where it is in the file


class _Frame:
    """One graph being decoded: its name, and the node and part of it
    ("param `index`", "operand 1") being decoded."""

    __slots__ = ("graph", "node", "op", "part")

    def __init__(self, graph: str):
        self.graph = graph
        self.node: int | None = None
        self.op: str | None = None
        self.part: str | None = None

    def __str__(self) -> str:
        text = f"graph {self.graph!r}"
        if self.node is not None:
            text = f"node {self.node} ({self.op}) of {text}"
        return text if self.part is None else f"{self.part} of {text}"


class _Budget:
    """The limits of one `graph_from_json` call, what it has used of them, and
    the stack of graphs it is in (for messages)."""

    def __init__(self, max_nodes: int, max_elements: int, max_depth: int):
        self.max_nodes = max_nodes
        self.max_elements = max_elements
        self.max_depth = max_depth
        self.nodes = 0
        self.elements = 0
        self.depth = 0
        self.frames: list[_Frame] = []

    def where(self) -> str:
        """Where the loader is, innermost graph first, then the nodes holding
        it: "param `index` of node 2 (sparse.assemble) of graph 'f'"."""
        return ", in ".join(str(f) for f in reversed(self.frames)) or "the document"

    def error(self, message: str) -> SerializationError:
        return SerializationError(f"{self.where()}: {message}", op="from_json")

    def over(self, message: str) -> ResourceLimitError:
        return ResourceLimitError(f"{self.where()}: {message} Pass a larger limit to "
                                  "`Graph.from_json` if you trust the file.",
                                  op="from_json")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            raise self.over(f"graphs and params nest {self.depth} levels deep, over "
                            f"max_depth={self.max_depth}.")

    def leave(self) -> None:
        self.depth -= 1

    def add_nodes(self, n: int) -> None:
        self.nodes += n
        if self.nodes > self.max_nodes:
            raise self.over(f"its {n:_} nodes bring the file's nodes to {self.nodes:_}, "
                            f"over max_nodes={self.max_nodes:_}.")

    def add_elements(self, n: int, what: str) -> None:
        self.elements += n
        if self.elements > self.max_elements:
            raise self.over(f"{what} brings the elements decoded to {self.elements:_}, "
                            f"over max_elements={self.max_elements:_}.")


# The budget of the `graph_from_json` call running in this context, so that
# type decoders and param codecs (which decode arrays and patterns) count
# against it too.
_ACTIVE: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "sciad_graph_loader", default=None)


#: values the JSON parser reads (objects, and the items of param tuples)
#: before `_Reader` may stop it: about 0.1 s of parsing. A file that small is
#: parsed whole, and the decoder names the graph and node over a limit.
READ_BEFORE_STOPPING = 100_000


class _Reader:
    """`json.loads`'s `object_hook`: counts what the file holds as the parser
    reads it, object by object, and past `READ_BEFORE_STOPPING` values stops
    the parse at the first object over a limit. A node is an object with an
    `"op"` and its `"inputs"` or `"outputs"` (a params object may hold an
    `"op"`, not those); an array's elements are those of its declared shape;
    a param tuple's, its items (the decoder counts the same, per graph and
    node)."""

    __slots__ = ("max_nodes", "max_elements", "nodes", "elements", "read")

    def __init__(self, max_nodes: int, max_elements: int):
        self.max_nodes, self.max_elements = max_nodes, max_elements
        self.nodes = self.elements = self.read = 0

    def __call__(self, d: dict) -> dict:
        self.read += 1
        if "op" in d and ("inputs" in d or "outputs" in d):
            self.nodes += 1
            if self.nodes > self.max_nodes and self.read > READ_BEFORE_STOPPING:
                raise self.over(f"it holds more than max_nodes={self.max_nodes:_} nodes")
        elif len(d) == 1 and isinstance(d.get("tuple", d.get("frozenset")), list):
            items = len(next(iter(d.values())))
            self.read += items
            self.count(items)
        elif "data" in d and isinstance(d.get("shape"), list) and all(
                isinstance(n, int) and n > 0 for n in d["shape"]):
            self.count(math.prod(d["shape"]))  # (a bad shape: the decoder says why)
        return d

    def count(self, n: int) -> None:
        self.elements += n
        if self.elements > self.max_elements and self.read > READ_BEFORE_STOPPING:
            raise self.over(f"its arrays and param tuples hold more than "
                            f"max_elements={self.max_elements:_} elements")

    def over(self, what: str) -> ResourceLimitError:
        return ResourceLimitError(f"{what} (counted while the file is read: the parser "
                                  f"stopped there). Pass a larger limit to `Graph.from_json` "
                                  "if you trust the file.", op="from_json")


def _fail(message: str) -> SerializationError:
    budget = _ACTIVE.get()
    if budget is not None:
        return budget.error(message)
    return SerializationError(message, op="from_json")


def _decode_shape(value, what: str, *, limit: str | None = "size") -> tuple[int, ...]:
    """A declared shape from JSON, checked: a list of at most `MAX_NDIM`
    non-negative ints (not floats, not bools). While a file loads, `limit`
    bounds it by `max_elements`: its `"size"` (a dense value's elements) or
    each `"dim"` (a factorization, whose run-time size is not `n * m`)."""
    if not isinstance(value, (list, tuple)):
        raise _fail(f"{what}: a shape is a list of ints, got {describe_value(value)}.")
    if len(value) > MAX_NDIM:
        raise _fail(f"{what}: a shape has at most {MAX_NDIM} dimensions, got "
                    f"{len(value)}.")
    for d in value:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise _fail(f"{what}: dimensions are non-negative ints, got "
                        f"{describe_value(d)} in shape {describe_value(value)}.")
    shape = tuple(value)
    budget = _ACTIVE.get()
    if budget is not None and limit is not None:
        size = math.prod(shape) if limit == "size" else max(shape, default=0)
        if size > budget.max_elements:
            noun = "elements" if limit == "size" else "rows or columns"
            shown = list(shape) if len(shape) <= 8 else f"[{shape[0]}, ... ({len(shape)} dims)]"
            raise budget.over(f"{what} of shape {shown} has {size:_} {noun}, over "
                              f"max_elements={budget.max_elements:_}.")
    return shape


def _charge(n: int, what: str) -> None:
    """Counts `n` elements the loader is about to allocate against its budget
    (nothing outside `graph_from_json`)."""
    budget = _ACTIVE.get()
    if budget is not None:
        budget.add_elements(n, what)


def _dtype_named(name, what: str) -> np.dtype:
    if not isinstance(name, str) or name not in _SHORT:
        raise _fail(f"{what}: unsupported dtype {describe_value(name)}; one of "
                    f"{', '.join(sorted(_SHORT))} is expected.")
    return np.dtype(name)


def _encode_array(a: np.ndarray) -> dict:
    a = np.asarray(a)  # (not ascontiguousarray: it makes 0-d arrays 1-d)
    data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
    return {"dtype": a.dtype.name, "shape": list(a.shape),
            "data": base64.b64encode(data).decode("ascii")}


def _decode_array(d) -> np.ndarray:
    """An array from `_encode_array`'s form. Its size is checked against the
    loader's element budget, and the base64 text against that size, before
    anything is decoded."""
    if not isinstance(d, dict) or set(d) != {"dtype", "shape", "data"}:
        raise _fail(f"an array is {{\"dtype\", \"shape\", \"data\"}}, got "
                    f"{describe_value(d)}.")
    dtype = _dtype_named(d["dtype"], "an array")
    shape = _decode_shape(d["shape"], "an array", limit=None)
    size = math.prod(shape)
    _charge(size, f"a {dtype.name} array of shape {list(shape)}")
    data = d["data"]
    nbytes = size * dtype.itemsize
    if not isinstance(data, str) or len(data) != 4 * -(-nbytes // 3):
        got = f"{len(data)} base64 characters" if isinstance(data, str) else \
            describe_value(data)
        raise _fail(f"a {dtype.name} array of shape {list(shape)} ({nbytes} bytes) takes "
                    f"{4 * -(-nbytes // 3)} base64 characters, got {got}.")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise _fail(f"array data is not base64: {e}.") from None
    if len(raw) != nbytes:
        raise _fail(f"array data of {len(raw)} bytes does not fit a {dtype.name} array of "
                    f"shape {list(shape)} ({nbytes} bytes).")
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _encode_float(v: float):
    if math.isfinite(v):
        return v
    return {"float": repr(v)}  # 'nan', 'inf', '-inf'


# --------------------------------------------------------------------------
# Writing


class _Encoder:
    def __init__(self):
        self.ids: dict[Var, int] = {}
        self.next = 0

    def var_id(self, v: Var) -> int:
        i = self.ids.get(v)
        if i is None:
            i = self.define(v)
        return i

    def define(self, v: Var) -> int:
        """A new id for `v` where a graph defines it: two bodies may share a
        `Var` object (a loop's forward body and its adjoint's), and in the
        file, as once loaded, each defines its own value."""
        i = self.ids[v] = self.next
        self.next += 1
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
        if isinstance(v, Body):
            return {"body": {**self.graph(v), "layout": list(v.layout)}}
        if isinstance(v, Graph):
            return {"graph": self.graph(v)}
        for tag, (cls, encode, _) in _PARAM_CODECS.items():
            if type(v) is cls:
                return {tag: encode(v)}
        raise SerializationError(
            f"param value {v!r} of type {type(v).__name__} has no JSON form; register "
            "one with `sciad.graph.register_param_type`.", op="to_json")

    def params(self, g: Graph, i: int, n: Node) -> dict:
        """The node's params, checked against its primitive's declaration, with
        every declared param stated (defaults included)."""
        prim = n.primitive
        problem = prim.param_problem(n.params)
        if problem is not None:
            raise SerializationError(
                f"node {i} ({prim.name}) of graph {g.name!r}: {problem} A file with it "
                "would not load.", op="to_json")
        params = dict(n.params)
        for k, spec in (prim.params or {}).items():
            params.setdefault(k, spec.default)
        return {k: self.param(v) for k, v in sorted(params.items())}

    def graph(self, g: Graph) -> dict:
        inputs = [{"id": self.define(v), "type": v.type.to_json(),
                   **({"hint": v.hint} if v.hint else {})} for v in g.inputs]
        nodes = []
        for i, n in enumerate(g.nodes):
            item = {
                "op": n.primitive.name,
                "inputs": [self.atom(a) for a in n.inputs],
                "outputs": [{"id": self.define(v), "type": v.type.to_json()}
                            for v in n.outputs],
                "params": self.params(g, i, n),
            }
            if n.effects:
                item["effects"] = sorted(n.effects)
            if n.source is not None:
                item["source"] = n.source.to_json()
            nodes.append(item)
        return {"name": g.name, "inputs": inputs, "nodes": nodes,
                "outputs": [self.atom(a) for a in g.outputs]}


def _digest(doc: dict) -> str:
    """The sha256 of the document's canonical form: every key but `sha256`,
    keys sorted, no spaces, ASCII (so indentation and key order do not
    matter, and any change to what the file says does)."""
    body = {k: v for k, v in doc.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def graph_to_json(graph: Graph, *, indent: int | None = None, hash: bool = False) -> str:
    """The graph as JSON text, which `graph_from_json` turns back into an equal graph.

    **Arguments:**

    - `graph`: the graph; every param must have a JSON form (see
        `register_param_type`), and a declared primitive's params must match
        its declaration (the file would not load otherwise).
    - `indent`: as `json.dumps`'s, for a file meant to be read.
    - `hash`: add `"sha256"`, the hash of the document's canonical form, so
        that the loader detects a file modified or corrupted since. It guards
        against accidents, not against someone who rewrites the hash too.

    **Returns:**

    The JSON text.
    """
    body = _Encoder().graph(graph)
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    if hash:
        doc["sha256"] = _digest({**doc, "graph": body})
    doc["graph"] = body
    return json.dumps(doc, indent=indent, allow_nan=False)


# --------------------------------------------------------------------------
# Reading


def _obj(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(f"{what} is a JSON object, got {describe_value(value)}.")
    return value


def _list(value, what: str) -> list:
    if not isinstance(value, list):
        raise _fail(f"{what} is a JSON array, got {describe_value(value)}.")
    return value


def _keys(d: dict, allowed: frozenset, required: tuple[str, ...], what: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise _fail(f"unknown key {extra[0]!r} in {what} (allowed: "
                    f"{', '.join(sorted(allowed))}).")
    for k in required:
        if k not in d:
            raise _fail(f"{what} has no {k!r}.")


def _int(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(f"{what} is an int, got {describe_value(value)}.")
    return value


class _Decoder:
    """Decodes one graph and the graphs in its params, within `budget`."""

    def __init__(self, budget: _Budget, version: int = VERSION):
        self.budget = budget
        self.version = version
        self.vars: dict[int, Var] = {}

    # -- values ----------------------------------------------------------------
    def value_type(self, d) -> AbstractType:
        d = _obj(d, "a value type")
        kind = d.get("kind")
        if kind in ("tensor", "factor"):
            _decode_shape(d.get("shape"), f"a {kind} type",
                          limit="size" if kind == "tensor" else "dim")
        if "dtype" in d and not isinstance(d["dtype"], str):
            raise _fail(f"a value type's dtype is a string, got "
                        f"{describe_value(d['dtype'])}.")
        return type_from_json(d)

    def new_var(self, d, what: str) -> Var:
        d = _obj(d, what)
        hint = d.get("hint")
        if hint is not None and not isinstance(hint, str):
            raise _fail(f"{what}: a hint is a string, got {describe_value(hint)}.")
        extra = set(d) - {"id", "type", "hint"}
        if extra or "id" not in d or "type" not in d:
            raise _fail(f"{what} is {{\"id\", \"type\"}} (and an optional \"hint\"), got "
                        f"the keys {sorted(d)}.")
        i = _int(d["id"], f"{what}'s id")
        if i in self.vars:
            raise _fail(f"value id {i} is defined twice.")
        v = self.vars[i] = Var(self.value_type(d["type"]), hint)
        return v

    def atom(self, d, what: str):
        d = _obj(d, what)
        if "literal" in d:
            if set(d) - {"literal", "type"}:
                raise _fail(f"{what}: a constant is {{\"literal\"}} and an optional "
                            f"\"type\", got the keys {sorted(d)}.")
            t = self.value_type(d["type"]) if "type" in d else None
            value = _decode_array(d["literal"])
            if t is None:
                return Literal(value)
            rt = runtime_type(t)
            if rt is None or rt.shape != value.shape or rt.dtype != value.dtype:
                raise _fail(f"{what}: a constant of type {t.str_short()} cannot hold a "
                            f"{value.dtype}{list(value.shape)} array.")
            return Literal(value, t)
        if set(d) != {"var"}:
            raise _fail(f"{what} is {{\"var\": id}} or {{\"literal\": array}}, got the "
                        f"keys {sorted(d)}.")
        i = _int(d["var"], f"{what}'s var")
        try:
            return self.vars[i]
        except KeyError:
            raise _fail(f"value id {i} is used before it is defined.") from None

    # -- params ----------------------------------------------------------------
    def param(self, v):
        if v is None or isinstance(v, (bool, str, int, float)):
            return v
        if isinstance(v, list):
            raise _fail("a param is a bare JSON array; tuples are tagged {\"tuple\": [...]}.")
        if not isinstance(v, dict) or len(v) != 1:
            raise _fail(f"a param is a plain value or {{tag: payload}}, got "
                        f"{describe_value(v)}.")
        (tag, payload), = v.items()
        if tag == "float":
            if payload not in ("nan", "inf", "-inf"):
                raise _fail(f"bad float {describe_value(payload)} (\"nan\", \"inf\" or "
                            "\"-inf\" expected).")
            return float(payload)
        if tag == "complex":
            parts = _list(payload, "a complex param")
            parts = [self.param(x) for x in parts]
            if len(parts) != 2 or not all(isinstance(x, (int, float)) and
                                          not isinstance(x, bool) for x in parts):
                raise _fail(f"a complex param is [real, imag], got {describe_value(payload)}.")
            return complex(*parts)
        if tag == "scalar":
            value = _decode_array(payload)
            if value.shape != ():
                raise _fail(f"a scalar param has shape [], got {list(value.shape)}.")
            return value[()]
        if tag == "dtype":
            return _dtype_named(payload, "a dtype param")
        if tag in ("tuple", "frozenset"):
            items = _list(payload, f"a {tag} param")
            self.budget.add_elements(len(items), f"a {tag} param of {len(items):_} items")
            self.budget.enter()
            try:
                values = [self.param(x) for x in items]
            finally:
                self.budget.leave()
            if tag == "tuple":
                return tuple(values)
            try:
                return frozenset(values)
            except TypeError:
                raise _fail("a frozenset param holds an unhashable value.") from None
        if tag == "graph":
            return _Decoder(self.budget, self.version).graph(payload)
        if tag == "body" and self.version >= 2:
            return _Decoder(self.budget, self.version).graph(payload, body=True)
        if tag in _PARAM_CODECS:
            try:
                return _PARAM_CODECS[tag][2](payload)
            except SerializationError:
                raise
            except Exception as e:
                raise _fail(f"bad {tag!r} param: {type(e).__name__}: {e}") from None
        raise _fail(f"unknown param tag {tag!r}.")

    # -- nodes and graphs --------------------------------------------------------
    def node(self, frame: _Frame, i: int, item) -> Node:
        frame.node, frame.op, frame.part = i, "?", None
        item = _obj(item, "a node")
        op = item.get("op")
        if not isinstance(op, str):
            raise _fail(f"a node's \"op\" is a string, got {describe_value(op)}.")
        frame.op = op
        _keys(item, _NODE_KEYS, ("op", "inputs", "outputs"), "a node")
        prim = lookup_primitive(op)
        if prim is None:
            raise _fail(f"unknown op {op!r}: no primitive of that name is registered. "
                        "Import the module that defines it before loading the graph.")
        ins = []
        for k, a in enumerate(_list(item["inputs"], "a node's \"inputs\"")):
            frame.part = f"operand {k}"
            ins.append(self.atom(a, "an operand"))
        frame.part = None
        raw = _obj(item.get("params", {}), "a node's \"params\"")
        migrate = _V1_MIGRATIONS.get(op) if self.version == 1 else None
        if prim.params is not None and migrate is None:
            # unknown names first, before decoding their values
            unknown = [k for k in raw if k not in prim.params]
            if unknown:
                raise _fail(prim.param_problem({unknown[0]: None}))
        params = {}
        for k, v in raw.items():
            frame.part = f"param `{k}`"
            params[k] = self.param(v)
        frame.part = None
        if migrate is not None:
            try:
                params = migrate(params)
            except Exception as e:
                raise _fail(f"cannot read this version-1 node: {type(e).__name__}: "
                            f"{e}") from None
        problem = prim.param_problem(params, explicit=True)
        if problem is not None:
            raise _fail(problem)
        params = shown_params(prim.params, params)  # in memory, defaults are left out
        outs = []
        for k, o in enumerate(_list(item["outputs"], "a node's \"outputs\"")):
            frame.part = f"result {k}"
            outs.append(self.new_var(o, "a result"))
        frame.part = None
        effects = _list(item.get("effects", []), "a node's \"effects\"")
        if not all(isinstance(e, str) for e in effects):
            raise _fail(f"effects are strings, got {describe_value(effects)}.")
        return Node(prim, tuple(ins), tuple(outs), params, frozenset(effects),
                    _source(item.get("source")))

    def graph(self, d, body: bool = False) -> Graph:
        budget = self.budget
        d = _obj(d, "a graph")
        name = d.get("name", "graph")
        if not isinstance(name, str):
            raise _fail(f"a graph's name is a string, got {describe_value(name)}.")
        frame = _Frame(name)
        budget.frames.append(frame)
        budget.enter()
        try:
            if body:
                _keys(d, _BODY_KEYS, ("inputs", "nodes", "outputs", "layout"), "a body")
                layout = _list(d["layout"], "a body's \"layout\"")
                if len(layout) != 3 or any(_int(n, "a body's count") < 0 for n in layout):
                    raise _fail(f"a body's \"layout\" is [num_consts, num_carry, num_xs], "
                                f"counts >= 0, got {describe_value(layout)}.")
            else:
                _keys(d, _GRAPH_KEYS, ("inputs", "nodes", "outputs"), "a graph")
            nodes_json = _list(d["nodes"], "a graph's \"nodes\"")
            budget.add_nodes(len(nodes_json))
            inputs = []
            for k, x in enumerate(_list(d["inputs"], "a graph's \"inputs\"")):
                frame.part = f"input {k}"
                inputs.append(self.new_var(x, "an input"))
            frame.part = None
            nodes = []
            for i, item in enumerate(nodes_json):
                try:
                    nodes.append(self.node(frame, i, item))
                except (SerializationError, RecursionError):
                    raise
                except Exception as e:
                    raise _fail(f"malformed node: {type(e).__name__}: {e}") from None
            frame.node = frame.op = None
            outputs = []
            for k, a in enumerate(_list(d["outputs"], "a graph's \"outputs\"")):
                frame.part = f"output {k}"
                outputs.append(self.atom(a, "an output"))
            frame.part = None
            if body:
                return Body(tuple(inputs), tuple(nodes), tuple(outputs), name, *layout)
            return Graph(tuple(inputs), tuple(nodes), tuple(outputs), name)
        finally:
            budget.leave()
            budget.frames.pop()


def _source(data) -> SourceInfo | None:
    if data is None:
        return None
    if (not isinstance(data, dict) or set(data) - {"file", "line", "function"}
            or not isinstance(data.get("file"), str)
            or not isinstance(data.get("line"), int) or isinstance(data.get("line"), bool)
            or not isinstance(data.get("function", ""), str)):
        raise _fail(f"a source is {{\"file\": str, \"line\": int, \"function\": str}}, got "
                    f"{describe_value(data)}.")
    return SourceInfo.from_json(data)


def _nests_deeper(doc, limit: int) -> bool:
    """Whether the JSON arrays and objects of `doc` nest more than `limit`
    levels deep (walked without recursion, stopping at the first too deep)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in (node.values() if isinstance(node, dict) else node):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _reject_constant(name: str):
    raise SerializationError(f"not valid JSON: {name} is not a JSON value (sciad writes "
                             "non-finite floats as {\"float\": \"nan\"}).", op="from_json")


def _check_limit(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SerializationError(f"`{name}` must be a positive int, got "
                                 f"{describe_value(value)}.", op="from_json")
    return value


def graph_from_json(text: str | bytes, *, max_nodes: int = MAX_NODES,
                    max_elements: int = MAX_ELEMENTS, max_depth: int = MAX_DEPTH,
                    max_bytes: int = MAX_BYTES, require_hash: bool = False) -> Graph:
    """Rebuilds a graph from `graph_to_json` output and verifies it.

    Safe on files from elsewhere: it executes nothing the file names, and it
    checks the limits below before it allocates what the file asks for.

    **Arguments:**

    - `text`: the JSON text (`str`, or UTF-8 `bytes`).
    - `max_nodes`: the most nodes the file may hold, over all its graphs
        (subgraphs in params included). Default `MAX_NODES` (100_000).
    - `max_elements`: the most array elements the loader decodes (constants,
        sparse patterns and their columns, index maps, scalar params), counted
        from the declared shapes before any data is decoded (and the items of
        param tuples); also the most elements any one declared value type
        may have. Default `MAX_ELEMENTS`
        (100_000_000).
    - `max_depth`: how deeply graphs (in params of nodes such as `call`) and
        param tuples may nest; the JSON text may nest at most
        `8 * max_depth + 16` levels. Default `MAX_DEPTH` (64).
    - `max_bytes`: the longest text parsed (bytes, or characters of a
        `str`), checked before parsing. Default `MAX_BYTES` (2**31).
    - `require_hash`: refuse a file without a `"sha256"` content hash
        (`graph.to_json(hash=True)` writes one). A hash that is present is
        always checked.

    **Returns:**

    The `Graph`, verified.

    **Raises:**

    `ResourceLimitError` for a file over a limit, naming the limit and the
    node (op and index) where it was exceeded; `SerializationError` for any
    other problem: text that is not JSON, an unknown op, a param that breaks
    its primitive's declaration, a hash that does not match, a graph that
    does not verify. `ResourceLimitError` is a `SerializationError`, so one
    `except SerializationError` catches both.
    """
    max_nodes = _check_limit("max_nodes", max_nodes)
    max_elements = _check_limit("max_elements", max_elements)
    max_depth = _check_limit("max_depth", max_depth)
    max_bytes = _check_limit("max_bytes", max_bytes)
    size = text.nbytes if isinstance(text, memoryview) else \
        len(text) if isinstance(text, (str, bytes, bytearray)) else 0
    if size > max_bytes:
        unit = "characters" if isinstance(text, str) else "bytes"
        raise ResourceLimitError(f"the text is {size:_} {unit} long, over max_bytes="
                                 f"{max_bytes:_} (checked before parsing it). Pass a larger "
                                 "limit to `Graph.from_json` if you trust the file.",
                                 op="from_json")
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SerializationError(f"not valid JSON: not UTF-8 text ({e}).",
                                     op="from_json") from None
    if not isinstance(text, str):
        raise SerializationError(f"expects JSON text (str or bytes), got "
                                 f"{describe_value(text)}.", op="from_json")
    json_limit = _JSON_LEVELS_PER_DEPTH * max_depth + _JSON_LEVELS_SLACK
    too_deep = ResourceLimitError(
        f"the document's JSON arrays and objects nest more than {json_limit} levels deep, "
        f"the most a graph file of max_depth={max_depth} has. Pass a larger limit to "
        "`Graph.from_json` if you trust the file.", op="from_json")
    try:
        doc = json.loads(text, parse_constant=_reject_constant,
                         object_hook=_Reader(max_nodes, max_elements))
    except RecursionError:  # (C's parser gives up near 1000 levels)
        raise too_deep from None
    except SerializationError:
        raise
    except (TypeError, ValueError) as e:
        raise SerializationError(f"not valid JSON: {e}", op="from_json") from None
    # nothing below recurses on the document before this check (the hash, the
    # decoder, the error messages that show a value)
    if text.count("[") + text.count("{") > json_limit and _nests_deeper(doc, json_limit):
        raise too_deep
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SerializationError(f"not a sciad graph (expected \"format\": \"{FORMAT}\").",
                                 op="from_json")
    version = doc.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise SerializationError(
            f"graph format version {version!r:.40} is not supported; this sciad reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))}.", op="from_json")
    extra = sorted(set(doc) - _DOC_KEYS)
    if extra or "graph" not in doc:
        raise SerializationError(
            f"a graph document has the keys {', '.join(sorted(_DOC_KEYS))} (\"sha256\" "
            f"optional), got {sorted(doc)}.", op="from_json")
    _check_hash(doc, require_hash)
    budget = _Budget(max_nodes, max_elements, max_depth)
    token = _ACTIVE.set(budget)
    try:
        graph = _Decoder(budget, version).graph(doc["graph"])
    except RecursionError:
        raise ResourceLimitError(
            f"the graph nests too deeply for Python's recursion limit (with "
            f"max_depth={max_depth}); lower `max_depth`.", op="from_json") from None
    except SerializationError:
        raise
    except Exception as e:
        raise SerializationError(f"{budget.where()}: malformed graph: "
                                 f"{type(e).__name__}: {e}", op="from_json") from e
    finally:
        _ACTIVE.reset(token)
    try:
        verify(graph)
    except VerificationError as e:
        raise SerializationError(f"the graph does not verify: {e}", op="from_json") from None
    except RecursionError:
        raise ResourceLimitError(
            f"the graph nests too deeply for Python's recursion limit (with "
            f"max_depth={max_depth}); lower `max_depth`.", op="from_json") from None
    except Exception as e:  # a shape rule that fails on what a file can say
        raise SerializationError(f"the graph does not verify: {type(e).__name__}: {e}",
                                 op="from_json") from e
    return graph


def _check_hash(doc: dict, require: bool) -> None:
    stored = doc.get("sha256")
    if stored is None:
        if require:
            raise SerializationError(
                "the file has no content hash (\"sha256\") and `require_hash=True`; "
                "write it with `graph.to_json(hash=True)`.", op="from_json")
        return
    if not isinstance(stored, str) or not _SHA256.match(stored):
        raise SerializationError(f"\"sha256\" is 64 lowercase hex digits, got "
                                 f"{describe_value(stored)}.", op="from_json")
    try:
        actual = _digest(doc)
    except (TypeError, ValueError, RecursionError) as e:
        raise SerializationError(f"cannot hash the document: {e}", op="from_json") from None
    if actual != stored:
        raise SerializationError(
            f"the content hash does not match: the file was modified or corrupted after "
            f"it was written (it says sha256 {stored[:12]}..., its content hashes to "
            f"{actual[:12]}...).", op="from_json")
