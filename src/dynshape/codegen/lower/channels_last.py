"""Native lowerings of `dynshape::ChannelsLast` nodes, by the op they wrap.

The lowering table has one entry per (op, backend); every channels-last node is the same op type, so this module
registers that entry once and dispatches on the wrapped op to the rule each kernel module registers here
(`register_channels_last("Resize", rule)` beside the Resize kernel).
"""

from __future__ import annotations

from dynshape.codegen.lowering import BindRequest, NativeRule, register_lowering
from dynshape.ir.graph import Graph, Node

_INNER: dict[str, NativeRule] = {}


def register_channels_last(op: str, rule: NativeRule) -> None:
    if op in _INNER:
        raise RuntimeError(f"ChannelsLast({op}) has two native lowerings")
    _INNER[op] = rule


def _accepts(node: Node, graph: Graph) -> str | None:
    rule = _INNER.get(node.attrs.get("op"))
    return f"no native lowering for channels-last {node.attrs.get('op')}" if rule is None else rule.accepts(node, graph)


def _bind(r: BindRequest) -> list | None:
    return _INNER[r.node.attrs["op"]].bind(r)


def _strided(node: Node) -> bool:
    rule = _INNER.get(node.attrs.get("op"))
    return rule is not None and rule.strided(node)


register_lowering("ChannelsLast", "native", NativeRule(_accepts, _bind, _strided), domain="dynshape")
