"""The rotary pattern of the load-time rewrites: `transformers`' apply_rotary_pos_emb,
q * cos + rotate_half(q) * sin with rotate_half(x) = Concat(-x[..., h:], x[..., :h]), as one ai.ember.RotateHalf
node (one kernel instead of Neg, Concat's two copies and the Mul/Add kernel). The slice bounds stay inputs:
the TorchScript exporter computes h from the input's shape, which is known only while planning."""

from __future__ import annotations

from ..ir import Node
from .patterns import EMBER_DOMAIN, Match, _Matcher


def _slice_axis(m: _Matcher, n: Node) -> int | str:
    """The axis of Slice `n` if it is a unit-step slice of one constant axis with its bounds as inputs, else why not."""
    if n.opset < 10 or len(n.inputs) < 4:
        return "the Slice gives its bounds as attributes (opset < 10) or no axes"
    axes = m.graph.initializers.get(n.inputs[3])
    if axes is None or axes.size != 1:
        return "the Slice's axes are not one constant axis"
    if len(n.inputs) > 4 and n.inputs[4]:
        steps = m.graph.initializers.get(n.inputs[4])
        if steps is None or steps.size != 1 or int(steps.reshape(-1)[0]) != 1:
            return "the Slice's steps are not a constant 1"
    return int(axes.reshape(-1)[0])


def match_rotary(m: _Matcher, neg: Node) -> Match:
    """Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, h:)), Slice(x, :h), axis=-1), sin)) -> ai.ember.RotateHalf(x, cos,
    sin, starts and ends of both slices), anchored at the Neg of a Slice that a Concat reads first."""
    s2 = m.node(neg.inputs[0], "Slice")
    cat = m.reader(neg.outputs[0], "Concat")
    if s2 is None or cat is None or len(cat.inputs) != 2 or cat.inputs[0] != neg.outputs[0]:
        return None
    x = s2.inputs[0]
    s1 = m.node(cat.inputs[1], "Slice")
    if s1 is None or s1.inputs[0] != x:
        return f"the Concat's second part is {m.op_of(cat.inputs[1])}, not a Slice of the negated tensor's input"
    axes = [_slice_axis(m, sl) for sl in (s1, s2)]
    for a in axes:
        if isinstance(a, str):
            return a
    if axes[0] != axes[1]:
        return f"the two Slices cut different axes ({axes[0]} and {axes[1]})"
    mul_r = m.reader(cat.outputs[0], "Mul")
    if mul_r is None:
        return "the rotated half is not multiplied (no Mul reads the Concat)"
    sin = m.other(mul_r, cat.outputs[0])
    add = m.reader(mul_r.outputs[0], "Add")
    if sin is None or add is None:
        return "rotate_half(x) * sin is not added to x * cos"
    mul_c = m.node(m.other(add, mul_r.outputs[0]) or "", "Mul")
    cos = m.other(mul_c, x) if mul_c is not None else None
    if cos is None:
        return "the other addend is not x * cos (the same x the halves come from)"
    inner = [neg.outputs[0], cat.outputs[0], mul_r.outputs[0], mul_c.outputs[0], s1.outputs[0], s2.outputs[0]]
    if not all(m.single(v) for v in inner):
        return "a value inside the rotation has readers outside the chain"
    new = Node("RotateHalf", EMBER_DOMAIN, [x, cos, sin, s1.inputs[1], s1.inputs[2], s2.inputs[1], s2.inputs[2]],
               list(add.outputs), {"slice_axis": axes[0], "axis": int(cat.attrs.get("axis", 0))},
               f"{neg.name}/rotary", 1)
    return set(inner), new, add
