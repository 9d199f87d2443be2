"""Ops whose output shape depends on the data: NonZero, NonMaxSuppression. A plan fixes every shape, so these run
on the host between the plans of the graph's stages (ember.plan.stages): the inputs are read back, `compute`
runs in numpy, and the outputs feed the next stage. With inputs known while planning they fold like any op."""

from __future__ import annotations

import numpy as np

from .base import Context, Op, Tensor, register


class HostOp(Op):
    host_op = True

    def compute(self, *inputs: np.ndarray | None) -> list[np.ndarray]:
        raise NotImplementedError

    def run(self, ctx: Context, *inputs: Tensor | None) -> list[Tensor]:
        if not all(t is None or t.is_const for t in inputs):
            raise self.fail("its output shape depends on data computed on the device; it runs between the "
                            "graph's stages (ember.plan.stages), not inside a plan")
        return [ctx.const(v) for v in self.compute(*(None if t is None else np.asarray(t.value) for t in inputs))]


@register("NonZero", 9)
class NonZero(HostOp):
    def compute(self, x: np.ndarray | None) -> list[np.ndarray]:
        assert x is not None
        return [np.array(np.nonzero(np.atleast_1d(x)), dtype=np.int64).reshape(max(x.ndim, 1), -1)]


@register("NonMaxSuppression", 10)
class NonMaxSuppression(HostOp):
    """Per batch and class, boxes by descending score (ties: lower index first), each kept unless its IoU with a
    kept one exceeds iou_threshold; at most max_output_boxes_per_class, scores above score_threshold only."""

    attrs = {"center_point_box": 0}

    def compute(self, boxes: np.ndarray | None, scores: np.ndarray | None, max_out: np.ndarray | None = None,
                iou: np.ndarray | None = None, score_min: np.ndarray | None = None) -> list[np.ndarray]:
        assert boxes is not None and scores is not None
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
                or scores.shape[2] != boxes.shape[1]:
            raise ValueError(f"{self.node.describe()}: boxes must be [batch, n, 4] and scores [batch, classes, n], "
                             f"got {list(boxes.shape)} and {list(scores.shape)}")
        limit = int(max_out.reshape(-1)[0]) if max_out is not None and max_out.size else 0
        iou_t = float(iou.reshape(-1)[0]) if iou is not None and iou.size else 0.0
        if not 0.0 <= iou_t <= 1.0:
            raise ValueError(f"{self.node.describe()}: iou_threshold must lie in [0, 1], got {iou_t}")
        smin = float(score_min.reshape(-1)[0]) if score_min is not None and score_min.size else None
        b = boxes.astype(np.float64)
        if self.attr["center_point_box"]:
            xy, wh = b[..., :2], b[..., 2:]  # [x_center, y_center, width, height]
            lo, hi = xy - wh / 2, xy + wh / 2
        else:  # [y1, x1, y2, x2], either corner first
            lo, hi = np.minimum(b[..., :2], b[..., 2:]), np.maximum(b[..., :2], b[..., 2:])
        area = np.prod(hi - lo, axis=-1)
        out = []
        for n in range(boxes.shape[0]):
            for c in range(scores.shape[1]):
                s = scores[n, c].astype(np.float64)
                order = np.argsort(-s, kind="stable")
                if smin is not None:
                    order = order[s[order] > smin]
                kept: list[int] = []
                for i in order:
                    if len(kept) >= limit:  # the default, 0, selects none
                        break
                    if kept:
                        k = np.array(kept)
                        inter = np.prod(np.clip(np.minimum(hi[n, k], hi[n, i]) - np.maximum(lo[n, k], lo[n, i]),
                                                0, None), axis=-1)
                        union = area[n, k] + area[n, i] - inter
                        ious = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
                        if (ious > iou_t).any():
                            continue
                    kept.append(int(i))
                out += [(n, c, i) for i in kept]
        return [np.array(out, dtype=np.int64).reshape(-1, 3)]


@register("Unique", 11)
class Unique(HostOp):
    """The distinct values (or slices along `axis`), sorted or in order of first occurrence, with the index of
    each one's first occurrence, each input element's index into them, and their counts (all int64)."""

    attrs = {"axis": None, "sorted": 1}

    def compute(self, x: np.ndarray | None) -> list[np.ndarray]:
        assert x is not None
        axis = self.attr["axis"]
        if axis is not None:
            if not -x.ndim <= axis < x.ndim:
                raise ValueError(f"{self.node.describe()}: axis {axis} is out of range for rank {x.ndim}")
            axis %= x.ndim
        flat = x.reshape(-1) if axis is None else x
        y, first, inverse, counts = np.unique(flat, return_index=True, return_inverse=True, return_counts=True,
                                              axis=axis)
        inverse = inverse.reshape(-1)
        if not self.attr["sorted"]:  # in order of first occurrence
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            first, counts, inverse = first[order], counts[order], rank[inverse]
            y = np.take(flat, first, axis=0 if axis is None else axis)
        return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]
