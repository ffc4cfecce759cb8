"""`Interpreter`: walks a graph node by node.

Lowering, evaluation, type propagation and the autodiff transforms (which
emit nodes into a trace) are interpreters; each overrides `run_node` (and
`literal` if constants need converting, `read` and `write` if values are
kept another way).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import SciadError
from ._core import Atom, Graph, Literal, Node, Var
from ._print import format_node


class Interpreter:
    """Runs `graph` on values; subclasses say what running a node means.

    `run(*args)` binds the inputs, runs each node on the values of its
    operands (`read`) and binds its outputs (`write`). The values live in
    `env` (`Var -> value`), which after a run holds every value it computed,
    for a subclass that walks the graph again (a backward pass).
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.env: dict[Var, Any] = {}

    def literal(self, lit: Literal) -> Any:
        return lit.value

    def read(self, a: Atom) -> Any:
        return self.literal(a) if isinstance(a, Literal) else self.env[a]

    def write(self, v: Var, value: Any) -> None:
        self.env[v] = value

    def run_node(self, node: Node, invals: Sequence[Any]) -> Sequence[Any]:
        raise NotImplementedError

    def run(self, *args) -> list:
        graph = self.graph
        if len(args) != len(graph.inputs):
            raise TypeError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, "
                            f"got {len(args)}.")
        self.env = {}
        read, write = self.read, self.write
        for v, x in zip(graph.inputs, args):
            write(v, x)
        for node in graph.nodes:
            outs = self.run_node(node, [read(a) for a in node.inputs])
            for v, o in zip(node.outputs, outs):
                write(v, o)
        return [read(a) for a in graph.outputs]


def node_error(cls, node: Node, err: BaseException, what: str) -> SciadError:
    """`err` re-raised as `cls`, with the node's printed line and source."""
    msg = f"{what} failed: {type(err).__name__}: {err}\n  while running: {format_node(node)}"
    return cls(msg, op=node.primitive.name, source=node.source)
