"""`verify(graph)`: the invariants every pass and transform must keep.

- SSA: every `Var` is defined once (a graph input or a node output);
- every operand is defined before it is used;
- every node's params fit its primitive's declaration (`Param`s), if it has one;
- every node's output types are what its primitive's shape rule gives for
  its input types and params;
- subgraphs (params that are graphs) verify on their own;
- a `Body`'s counts add up to its number of inputs.
"""

from __future__ import annotations

from ..errors import SciadError, VerificationError
from ._body import Body
from ._core import Graph, Literal, Node, Primitive, Var
from ._print import Namer, format_node


def _fail(msg: str, node: Node | None, namer: Namer, graph: Graph) -> VerificationError:
    where = ""
    if node is not None:
        where = f"\n  in: {format_node(node, namer)}"
    return VerificationError(f"graph {graph.name!r}: {msg}{where}", op="verify",
                             source=node.source if node is not None else None)


def verify(graph: Graph) -> None:
    """Raises `VerificationError` naming the first broken invariant."""
    namer = Namer()
    if isinstance(graph, Body) and sum(graph.layout) != len(graph.inputs):
        raise _fail(f"the body's layout ({graph.num_consts} consts, {graph.num_carry} "
                    f"carries, {graph.num_xs} xs) does not add up to its "
                    f"{len(graph.inputs)} inputs.", None, namer, graph)
    defined: set[Var] = set()
    for i, v in enumerate(graph.inputs):
        if not isinstance(v, Var):
            raise _fail(f"input {i} is {v!r}, not a Var.", None, namer, graph)
        if v in defined:
            raise _fail(f"input {namer.input(v, i)} is listed twice.", None, namer, graph)
        namer.input(v, i)
        defined.add(v)
    for node in graph.nodes:
        if not isinstance(node.primitive, Primitive):
            raise _fail(f"node op {node.primitive!r} is not a Primitive.", node, namer, graph)
        for a in node.inputs:
            if isinstance(a, Var):
                if a not in defined:
                    raise _fail(f"{namer(a)} is used before it is defined.", node, namer,
                                graph)
            elif not isinstance(a, Literal):
                raise _fail(f"operand {a!r} is neither a Var nor a Literal.", node, namer,
                            graph)
        for v in node.outputs:
            if v in defined:
                raise _fail(f"{namer(v)} is defined twice (SSA).", node, namer, graph)
        problem = node.primitive.param_problem(node.params)
        if problem is not None:
            raise _fail(f"{node.primitive.name}: {problem}", node, namer, graph)
        try:
            expected = node.primitive.abstract_eval(*(a.type for a in node.inputs),
                                                    **node.params)
        except SciadError as e:
            raise _fail(f"the op's shape rule rejects its operands: {e.message}", node,
                        namer, graph) from None
        except TypeError as e:
            raise _fail(f"the op's shape rule failed: {e}", node, namer, graph) from None
        got = tuple(v.type for v in node.outputs)
        if got != tuple(expected):
            exp = ", ".join(t.str_short() for t in expected)
            have = ", ".join(t.str_short() for t in got)
            raise _fail(f"output types ({have}) disagree with the shape rule of "
                        f"{node.primitive.name!r}, which gives ({exp}).", node, namer, graph)
        for sub in node.subgraphs:
            verify(sub)
        defined.update(node.outputs)
    for k, a in enumerate(graph.outputs):
        if isinstance(a, Var) and a not in defined:
            raise _fail(f"output {k} ({namer(a)}) is never defined.", None, namer, graph)
        if not isinstance(a, (Var, Literal)):
            raise _fail(f"output {k} is {a!r}, neither a Var nor a Literal.", None, namer,
                        graph)
