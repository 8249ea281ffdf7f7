"""KServe v2 / Open Inference Protocol tensors over HTTP: JSON and the binary tensor data extension.

Why a codec of its own: the routes and the gRPC service both hand the batcher numpy arrays by input name, and
every way a body can be wrong (not JSON, a datatype the protocol lacks, a shape whose element count disagrees with
`data`, `binary_data_size` values that do not add up to the bytes after the JSON header) must become one 400 with
a message naming the tensor, never a 500. Binary inputs are wrapped with `np.frombuffer` (no copy).

Request: `{id?, parameters?, inputs: [{name, shape, datatype, parameters?: {binary_data_size?}, data?}],
outputs?: [{name, parameters?: {binary_data?}}]}`; with binary data, the `Inference-Header-Content-Length`
header gives the JSON's length and the raw little-endian tensors follow it in input order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from dynshape.serve.errors import InferError, bad

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_NAMES = {dt: name for name, dt in DATATYPES.items()}
MAX_DIMS = 32  # no model here has more; a longer shape is a malformed (or hostile) request


def datatype_of(dtype: np.dtype) -> str:
    """The protocol's name for a numpy dtype (`FP32`); a dtype it lacks (bfloat16) is a model the server refuses."""
    name = _NAMES.get(np.dtype(dtype))
    if name is None:
        raise InferError(500, f"dtype {dtype} has no KServe v2 datatype")
    return name


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: the request's `binary_data_output` decides


@dataclass
class InferRequest:
    """A decoded request: arrays by input name, the outputs asked for (None: all), the request's parameters."""

    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput] | None = None
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def priority(self) -> int:
        return _int_param(self.parameters, "priority", 0)

    @property
    def timeout_us(self) -> int:
        return _int_param(self.parameters, "timeout", 0)


def _int_param(params: dict, key: str, default: int) -> int:
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise bad(f"parameter {key!r} must be a non-negative integer, got {v!r}")
    return v


def check_shape(name: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or \
            not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape):
        raise bad(f"input {name!r}: 'shape' must be a list of at most {MAX_DIMS} non-negative integers, got "
                  f"{str(shape)[:80]}")
    return tuple(shape)


def dtype_of(name: str, datatype: Any) -> np.dtype:
    dt = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dt is None:
        raise bad(f"input {name!r}: unknown datatype {str(datatype)[:40]!r}; expected one of {', '.join(DATATYPES)}")
    return dt


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def array_from_json(name: str, dt: np.dtype, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """`data` (flat or nested, row-major) as an array of `dt` and `shape`; values of the wrong kind are refused."""
    if not isinstance(data, list):
        data = [data]
    if dt.kind == "O":
        flat = _flatten(data)
        if not all(isinstance(x, str) for x in flat):
            raise bad(f"input {name!r}: BYTES data must be strings")
        arr = np.empty(len(flat), dtype=object)
        arr[:] = [x.encode() for x in flat]
    else:
        try:
            arr = np.asarray(data)
        except (ValueError, TypeError):
            raise bad(f"input {name!r}: 'data' is ragged or mixes types") from None
        kind = arr.dtype.kind
        ok = kind == "b" if dt.kind == "b" else (kind in "iub" if dt.kind in "iu" else kind in "iubf")
        if arr.size and not ok:
            raise bad(f"input {name!r}: 'data' holds {'non-numeric' if kind not in 'iubf' else arr.dtype.name} "
                      f"values but the datatype is {datatype_of(dt)}")
        try:
            with np.errstate(all="ignore"):
                arr = arr.astype(dt, casting="unsafe").reshape(-1)
        except (ValueError, OverflowError):
            raise bad(f"input {name!r}: 'data' does not convert to {datatype_of(dt)}") from None
        if dt.kind in "iu" and arr.size and kind in "iu" and not np.array_equal(arr, np.asarray(data).reshape(-1)):
            raise bad(f"input {name!r}: 'data' has values out of range for {datatype_of(dt)}")
    if arr.size != _count(shape):
        raise bad(f"input {name!r}: 'data' has {arr.size} elements but shape {list(shape)} needs {_count(shape)}")
    return arr.reshape(shape)


def _flatten(x: Any) -> list:
    if not isinstance(x, list):
        return [x]
    out: list = []
    for e in x:
        out.extend(_flatten(e))
    return out


def array_from_bytes(name: str, dt: np.dtype, shape: tuple[int, ...], raw: bytes | memoryview) -> np.ndarray:
    """Raw little-endian row-major bytes (BYTES: each element a 4-byte length then its bytes) as an array."""
    n = _count(shape)
    if dt.kind == "O":
        items, pos, mv = [], 0, memoryview(raw)
        while pos < len(mv):
            if pos + 4 > len(mv):
                raise bad(f"input {name!r}: truncated BYTES element length")
            (k,) = struct.unpack_from("<I", mv, pos)
            if pos + 4 + k > len(mv):
                raise bad(f"input {name!r}: BYTES element of {k} bytes overruns the tensor")
            items.append(bytes(mv[pos + 4:pos + 4 + k]))
            pos += 4 + k
        if len(items) != n:
            raise bad(f"input {name!r}: {len(items)} BYTES elements but shape {list(shape)} needs {n}")
        arr = np.empty(n, dtype=object)
        arr[:] = items
        return arr.reshape(shape)
    if len(raw) != n * dt.itemsize:
        raise bad(f"input {name!r}: binary_data_size is {len(raw)} bytes but shape {list(shape)} of "
                  f"{datatype_of(dt)} needs {n * dt.itemsize}")
    return np.frombuffer(raw, dtype=dt.newbyteorder("<")).astype(dt, copy=False).reshape(shape)


def bytes_of(arr: np.ndarray) -> bytes | memoryview:
    """An output's raw bytes as the binary extension sends them (BYTES: length-prefixed elements): for a numeric
    array a view of its memory when it is already little-endian and contiguous, so the response's one join is
    its only copy (a 1 MiB output cost two copies before, `tobytes` then the join, ~25 us each)."""
    if arr.dtype.kind == "O":
        parts = []
        for x in arr.reshape(-1):
            b = x if isinstance(x, bytes) else str(x).encode()
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    flat = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).reshape(-1)
    return memoryview(flat.view(np.uint8))


def decode_http(body: bytes, header_length: str | None) -> InferRequest:
    """An HTTP request body (and its `Inference-Header-Content-Length`) as an `InferRequest`."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise bad(f"Inference-Header-Content-Length {header_length[:40]!r} is not an integer") from None
        if not 0 < n <= len(body):
            raise bad(f"Inference-Header-Content-Length {n} is outside the body's {len(body)} bytes")
        head, tail = body[:n], memoryview(body)[n:]
    else:
        head, tail = body, memoryview(b"")
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as e:
        raise bad(f"malformed JSON: {e}") from None
    if not isinstance(doc, dict):
        raise bad("the request body must be a JSON object")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise bad("'parameters' must be an object")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise bad("'inputs' must be a non-empty list of tensors")
    feed: dict[str, np.ndarray] = {}
    pos = 0
    for t in inputs:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise bad("each input must be an object with a string 'name'")
        name = t["name"]
        if name in feed:
            raise bad(f"input {name!r} is given twice")
        dt, shape = dtype_of(name, t.get("datatype")), check_shape(name, t.get("shape"))
        tp = t.get("parameters") or {}
        if not isinstance(tp, dict):
            raise bad(f"input {name!r}: 'parameters' must be an object")
        size = tp.get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise bad(f"input {name!r}: binary_data_size must be a non-negative integer")
            if "data" in t:
                raise bad(f"input {name!r}: both 'data' and binary_data_size given")
            if pos + size > len(tail):
                raise bad(f"input {name!r}: binary_data_size {size} overruns the {len(tail)} bytes of binary data "
                          "after the JSON header (check Inference-Header-Content-Length)")
            feed[name] = array_from_bytes(name, dt, shape, tail[pos:pos + size])
            pos += size
        elif "data" in t:
            feed[name] = array_from_json(name, dt, shape, t["data"])
        else:
            raise bad(f"input {name!r}: no 'data' and no binary_data_size")
    if pos != len(tail):
        raise bad(f"{len(tail) - pos} bytes of binary data after the JSON header are claimed by no input "
                  "(binary_data_size values disagree with the body)")
    outs = doc.get("outputs")
    requested = None
    if outs is not None:
        if not isinstance(outs, list):
            raise bad("'outputs' must be a list")
        requested = []
        for o in outs:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise bad("each requested output must be an object with a string 'name'")
            op = o.get("parameters") or {}
            if not isinstance(op, dict):
                raise bad(f"output {o['name']!r}: 'parameters' must be an object")
            if op.get("classification"):
                raise bad(f"output {o['name']!r}: the classification extension is not supported")
            b = op.get("binary_data")
            requested.append(RequestedOutput(o["name"], None if b is None else bool(b)))
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise bad("'id' must be a string")
    req = InferRequest(feed, requested, rid, params)
    req.priority, req.timeout_us  # noqa: B018 (validated now: a bad value is this request's 400)
    return req


def encode_http(model: str, version: str, req: InferRequest, outputs: dict[str, np.ndarray],
                parts: bool = False) -> tuple[bytes | list, dict]:
    """The response body and its headers; binary outputs follow the JSON (`Inference-Header-Content-Length`).
    With `parts`, a body with binary outputs comes as a list (the JSON header, then each output's bytes, views of
    the arrays where they allow it) for a sender that writes them one after another: no copy of the tensors at
    all (a 1 MiB output's join cost as much as copying it)."""
    default_binary = bool(req.parameters.get("binary_data_output", False))
    wanted = req.outputs if req.outputs is not None else [RequestedOutput(n) for n in outputs]
    entries, blobs = [], []
    for o in wanted:
        arr = outputs[o.name]
        entry: dict[str, Any] = {"name": o.name, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
        if (default_binary if o.binary is None else o.binary):
            raw = bytes_of(arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif arr.dtype.kind == "O":
            entry["data"] = [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in arr.reshape(-1)]
        elif arr.dtype == np.float16:
            entry["data"] = arr.reshape(-1).astype(np.float32)
        else:
            entry["data"] = np.ascontiguousarray(arr).reshape(-1)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if req.id is not None:
        doc["id"] = req.id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return head, {"content-type": "application/json"}
    return [head, *blobs] if parts else b"".join([head, *blobs]), {"content-type": "application/octet-stream",
                                    "inference-header-content-length": str(len(head))}
