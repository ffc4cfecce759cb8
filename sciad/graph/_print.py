"""The SSA text form and Graphviz DOT export.

```
graph f(%x: f64[3,4], %y: f64[4,5]) {
  %0 = sin %x                : f64[3,4]   # model.py:4
  %1 = matmul %0, %y         : f64[3,5]   # model.py:4
  return %1
}
```

Inputs are named after the function's arguments where possible; other
values are numbered in order of definition. The text is stable: the same
program prints the same text.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import numpy as np

from ._body import Body
from ._core import Graph, Literal, Node, Var
from ._params import shown_params
from ._types import TensorType, dtype_short

_DEFAULT_KIND_DTYPE = {"f": "float64", "c": "complex128", "i": "int64", "b": "bool"}
_VALID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_INLINE = 4


class Namer:
    """Assigns printed names to vars, scoped per graph."""

    def __init__(self):
        self.names: dict[Var, str] = {}
        self.count = 0
        self.taken: set[str] = set()

    def input(self, var: Var, index: int) -> str:
        hint = var.hint if var.hint and _VALID.match(var.hint) else None
        name = hint if hint and hint not in self.taken and not hint.isdigit() else f"arg{index}"
        while name in self.taken:
            name = name + "_"
        self.taken.add(name)
        self.names[var] = name
        return "%" + name

    def __call__(self, var: Var) -> str:
        name = self.names.get(var)
        if name is None:
            name = str(self.count)
            self.count += 1
            self.names[var] = name
        return "%" + name


def format_scalar(v) -> str:
    v = v.item() if isinstance(v, np.generic) else v
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, complex):
        return repr(v).strip("()")
    return repr(v)


def format_literal(lit: Literal) -> str:
    value = lit.value
    if not isinstance(lit.type, TensorType):
        return f"const<{lit.type.str_short()} #{lit.fingerprint()}>"
    dt = value.dtype
    suffix = "" if _DEFAULT_KIND_DTYPE.get(dt.kind) == dt.name else ":" + dtype_short(dt)
    if value.ndim == 0:
        return format_scalar(value[()]) + suffix
    if value.size <= _MAX_INLINE:
        inner = ", ".join(format_scalar(v) for v in value.ravel())
        return f"{lit.type.str_short()}{{{inner}}}"
    return f"const<{lit.type.str_short()} #{lit.fingerprint()}>"


def _layout(body) -> str:
    return f"consts={body.num_consts}, carry={body.num_carry}, xs={body.num_xs}"


def format_param(v: Any) -> str:
    if isinstance(v, Body):
        return f"<body {v.name}>"  # (its layout is printed with it, nested)
    if isinstance(v, Graph):
        return f"<graph {v.name}>"
    if isinstance(v, np.dtype) or isinstance(v, type) and issubclass(v, np.generic):
        return dtype_short(v)
    if isinstance(v, enum.Enum):
        return v.name
    if isinstance(v, tuple):
        inner = ", ".join(format_param(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, frozenset):
        return "{" + ", ".join(sorted(format_param(x) for x in v)) + "}"
    if isinstance(v, (float, complex, np.generic)):
        return format_scalar(v)
    if isinstance(v, str):
        return repr(v)
    return str(v)  # ints, bools, None, and param classes with their own __str__


def _atom(a, namer: Namer) -> str:
    return format_literal(a) if isinstance(a, Literal) else namer(a)


def _node_parts(node: Node, namer: Namer) -> tuple[str, str]:
    params = ""
    # a param at its declared default is not shown, whether the node holds it
    # or leaves it out: one text for one computation
    shown = shown_params(node.primitive.params, node.params)
    if shown:
        params = "[" + ", ".join(f"{k}={format_param(v)}"
                                 for k, v in sorted(shown.items())) + "]"
    args = ", ".join(_atom(a, namer) for a in node.inputs)
    outs = ", ".join(namer(v) for v in node.outputs) or "()"
    effects = f" !{{{', '.join(sorted(node.effects))}}}" if node.effects else ""
    lhs = f"{outs} = {node.primitive.name}{params}{effects}" + (f" {args}" if args else "")
    if len(node.outputs) == 1:
        ty = node.outputs[0].type.str_short()
    else:
        ty = "(" + ", ".join(v.type.str_short() for v in node.outputs) + ")"
    return lhs, ty


def format_node(node: Node, namer: Namer | None = None) -> str:
    """One node as a line of text, e.g. `%3 = sin %2 : f64[4]`."""
    lhs, ty = _node_parts(node, namer or Namer())
    src = f"   # {node.source}" if node.source else ""
    return f"{lhs} : {ty}{src}"


def format_graph(graph: Graph, *, source: bool = True, indent: str = "",
                 namer: Namer | None = None) -> str:
    namer = Namer() if namer is None else namer
    ins = ", ".join(f"{namer.input(v, i)}: {v.type.str_short()}"
                    for i, v in enumerate(graph.inputs))
    layout = f" [{_layout(graph)}]" if isinstance(graph, Body) else ""
    lines = [f"{indent}graph {graph.name}({ins}){layout} {{"]
    rows = [(*_node_parts(n, namer), n) for n in graph.nodes]
    w1 = min(max((len(r[0]) for r in rows), default=0), 60)
    w2 = min(max((len(r[1]) for r in rows), default=0), 28)
    for lhs, ty, node in rows:
        line = f"{indent}  {lhs:<{w1}} : {ty:<{w2}}"
        if source and node.source is not None:
            line += f"  # {node.source}"
        lines.append(line.rstrip())
        for sub in node.subgraphs:
            lines.append(format_graph(sub, source=source, indent=indent + "    "))
    outs = ", ".join(_atom(a, namer) for a in graph.outputs)
    lines.append(f"{indent}  return {outs}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Graphviz


def _dot_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def to_dot(graph: Graph) -> str:
    """The graph in Graphviz DOT: inputs as ellipses, ops as boxes, edges
    labelled with the types of the values they carry."""
    namer = Namer()
    lines = [f'digraph "{_dot_escape(graph.name)}" {{', "  rankdir=TB;",
             '  node [fontname="monospace", fontsize=10];',
             '  edge [fontname="monospace", fontsize=9];']
    producer: dict[Var, str] = {}
    for i, v in enumerate(graph.inputs):
        name = namer.input(v, i)
        nid = f"in{i}"
        producer[v] = nid
        lines.append(f'  {nid} [shape=ellipse, label="{_dot_escape(name)}\\n'
                     f'{v.type.str_short()}"];')
    lit_count = 0
    for j, node in enumerate(graph.nodes):
        nid = f"n{j}"
        params = ""
        if node.params:
            params = "\\n" + _dot_escape(", ".join(
                f"{k}={format_param(v)}" for k, v in sorted(node.params.items())))[:120]
        src = f"\\n{_dot_escape(str(node.source))}" if node.source else ""
        lines.append(f'  {nid} [shape=box, label="{_dot_escape(node.primitive.name)}'
                     f'{params}{src}"];')
        for a in node.inputs:
            if isinstance(a, Literal):
                lid = f"lit{lit_count}"
                lit_count += 1
                lines.append(f'  {lid} [shape=plaintext, label="{_dot_escape(format_literal(a))}"];')
                lines.append(f"  {lid} -> {nid};")
            else:
                src_id = producer.get(a, "undefined")
                lines.append(f'  {src_id} -> {nid} [label="{a.type.str_short()}"];')
        for v in node.outputs:
            namer(v)
            producer[v] = nid
    for k, a in enumerate(graph.outputs):
        oid = f"out{k}"
        lines.append(f'  {oid} [shape=doublecircle, label="out{k}"];')
        if isinstance(a, Literal):
            lines.append(f'  {oid} [label="{_dot_escape(format_literal(a))}"];')
        else:
            lines.append(f'  {producer.get(a, "undefined")} -> {oid} '
                         f'[label="{a.type.str_short()}"];')
    lines.append("}")
    return "\n".join(lines)
