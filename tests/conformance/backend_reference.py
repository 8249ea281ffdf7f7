"""Node-suite backend: full load (frontend + shape inference), then the reference executor.

Two choices, both about what the suite feeds rather than about dynshape:
- named dims get min=0: the suite's symbolic mode turns every input dim into a dim_param, and some cases
  feed empty tensors;
- dynshape needs static ranks. When a graph input is a shape tensor (Reshape's shape, Unsqueeze's axes, ...)
  its length is a rank; if inference rejects the model with that length symbolic, the load is retried with
  the lengths of exactly those inputs fixed to what the case feeds (`dims=`), every other dim staying symbolic.
"""

from __future__ import annotations

import onnx

import dynshape as ds

# (op, input index) whose 1-D integer input's length is a rank or a number of axes.
SHAPE_INPUTS = {
    "Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Squeeze": (1,), "Unsqueeze": (1,), "Tile": (1,),
    "Pad": (1, 3), "Slice": (1, 2, 3, 4), "Resize": (1, 2, 3), "Split": (1,), "ReduceSum": (1,),
    "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,),
    "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
}


def _rank_dims(model: onnx.ModelProto, inputs: list) -> dict[str, int]:
    """dim_param -> fed length, for graph inputs that some node reads as a shape/axes tensor."""
    feeds = {n.input[i] for n in model.graph.node for i in SHAPE_INPUTS.get(n.op_type, ()) if i < len(n.input)}
    inits = {t.name for t in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in inits]
    dims: dict[str, int] = {}
    for vi, x in zip(graph_inputs, inputs):
        if vi.name in feeds and getattr(x, "ndim", None) == 1:
            d = vi.type.tensor_type.shape.dim
            if len(d) == 1 and d[0].dim_param:
                dims[d[0].dim_param] = int(x.shape[0])
    return dims


def load(model_path: str, inputs: list) -> ds.Graph:
    """The graph with every dim symbolic, except shape-tensor lengths inference needs as ranks."""
    try:
        return ds.load_onnx(model_path, default_min=0)
    except ds.ShapeError:
        dims = _rank_dims(onnx.load(model_path), inputs)
        if not dims:
            raise
        return ds.load_onnx(model_path, dims=dims, default_min=0)


def run(model_path: str, inputs: list) -> list:
    graph = load(model_path, inputs)
    out = graph.run({v.name: x for v, x in zip(graph.inputs, inputs)})
    return [out[v.name] for v in graph.outputs]
