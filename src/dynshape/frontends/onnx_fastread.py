"""Reading an ONNX file's weights straight into their arrays.

`onnx.load` parses the whole file into protobuf messages: every initializer's `raw_data` is copied out of the
file's bytes into a message field, and `numpy_helper.to_array` then copies it again into an array. On VGG-19
(548 MB of weights) that was 0.9-3 s of a warm `load_onnx + compile` whose compile half takes 0.4 s: the goal
is 0.5 s from the build cache. Here the file is walked at the protobuf wire level instead (only the model's
and the main graph's own fields, a few hundred), each large `raw_data` is read with one `pread` straight into
a fresh array, and the rest (nodes, value infos, small tensors), with those fields left out, is parsed by
protobuf as usual: a few kilobytes.

Nothing stays mapped or open after the load (a file rewritten later cannot change or crash a loaded graph).
Anything unexpected (a wire type the walk does not know, lengths past the end, a data size that does not
match the dims, a big-endian host) returns None and the caller falls back to `onnx.load`, which reports the
problem the way it always has: this path is a shortcut, never a second parser with its own errors.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto

#: `raw_data` at least this long is read into its array directly; smaller tensors stay in the parsed message.
DIRECT_BYTES = 1 << 16
#: weights this large in all are read on two threads
PARALLEL_BYTES = 64 << 20
#: the unit of work of those threads (VGG-19's first classifier layer alone is 411 MB)
CHUNK_BYTES = 16 << 20

_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_TENSOR_RAW_DATA = 9  # TensorProto.raw_data
_TENSOR_DATA_LOCATION = 14  # TensorProto.data_location
_DIRECT_DTYPES = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
                  TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
                  TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.INT64: np.int64,
                  TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64}


class _Unexpected(Exception):
    """The file is not laid out the way this walk expects: the caller uses onnx.load instead."""


class _File:
    """Positioned reads of one open file, with protobuf's varint decoding on top."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size

    def read(self, off: int, n: int) -> bytes:
        if off < 0 or n < 0 or off + n > self.size:
            raise _Unexpected
        data = os.pread(self.fd, n, off)
        if len(data) != n:
            raise _Unexpected
        return data

    def field(self, off: int, end: int) -> tuple[int, int, int, int]:
        """(field number, wire type, start of the value, end of the field) of the field at `off`."""
        head = os.pread(self.fd, min(20, end - off), off)
        tag, k = _varint(head, 0)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, k2 = _varint(head, k)
            return number, wire, off + k, off + k2
        if wire == 1:
            return number, wire, off + k, off + k + 8
        if wire == 5:
            return number, wire, off + k, off + k + 4
        if wire == 2:
            length, k2 = _varint(head, k)
            if off + k2 + length > end:
                raise _Unexpected
            return number, wire, off + k2, off + k2 + length
        raise _Unexpected  # groups (3, 4) and invalid wire types


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise _Unexpected
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def read_direct(path: str) -> tuple[onnx.ModelProto, dict[int, np.ndarray]] | None:
    """The model at `path` with its large initializers' `raw_data` left out, and those tensors as arrays
    keyed by their index in `graph.initializer`; None where `onnx.load` must do it (see the module doc)."""
    if sys.byteorder != "little" or not path.endswith(".onnx"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        f = _File(fd, os.fstat(fd).st_size)
        spans: list[tuple[int, int, int]] = []  # (initializer index, offset, length)
        pieces = []
        off = 0
        while off < f.size:
            number, wire, start, end = f.field(off, f.size)
            if number == _MODEL_GRAPH and wire == 2:
                pieces.append(_len_field(_MODEL_GRAPH, _graph(f, start, end, spans)))
            else:
                pieces.append(f.read(off, end - off))
            off = end
        if not spans:
            return None  # nothing large: onnx.load is as fast and this path adds nothing
        proto = onnx.ModelProto()
        proto.ParseFromString(b"".join(pieces))
        inits = proto.graph.initializer
        bufs = {i: _buffer(inits[i], n) for i, _, n in spans}
        chunks = [(bufs[i], o, lo, min(n, lo + CHUNK_BYTES)) for i, o, n in spans for lo in range(0, n, CHUNK_BYTES)]
        if len(chunks) < 2 or sum(n for _, _, n in spans) < PARALLEL_BYTES:
            for c in chunks:
                _fill(f, *c)
        else:  # two readers: preadv drops the GIL, and the copy and the first touch of fresh pages are the cost
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                for _ in pool.map(lambda c: _fill(f, *c), chunks):
                    pass
        return proto, {i: np.frombuffer(bufs[i], dtype=_DIRECT_DTYPES[inits[i].data_type]).reshape(tuple(inits[i].dims))
                       for i, _, _ in spans}  # each array keeps its mapping alive
    except (_Unexpected, IndexError, OSError, ValueError, MemoryError):
        return None
    except Exception as e:  # protobuf's DecodeError and friends: let onnx.load report the file
        if type(e).__name__ == "DecodeError":
            return None
        raise
    finally:
        os.close(fd)


def _graph(f: _File, start: int, end: int, spans: list) -> bytes:
    pieces = []
    index = 0
    off = start
    while off < end:
        number, wire, vstart, vend = f.field(off, end)
        if number == _GRAPH_INITIALIZER and wire == 2:
            pieces.append(_len_field(_GRAPH_INITIALIZER, _tensor(f, vstart, vend, index, spans)))
            index += 1
        else:
            pieces.append(f.read(off, vend - off))
        off = vend
    return b"".join(pieces)


def _tensor(f: _File, start: int, end: int, index: int, spans: list) -> bytes:
    pieces = []
    direct = None
    off = start
    while off < end:
        number, wire, vstart, vend = f.field(off, end)
        if number == _TENSOR_RAW_DATA and wire == 2 and vend - vstart >= DIRECT_BYTES:
            if direct is not None:
                raise _Unexpected  # a repeated scalar field: protobuf keeps the last; not worth the subtlety
            direct = (index, vstart, vend - vstart)
        else:
            if number == _TENSOR_DATA_LOCATION:
                raise _Unexpected  # external data (or a stated default): the usual path handles it
            pieces.append(f.read(off, vend - off))
        off = vend
    if direct is not None:
        spans.append(direct)
    return b"".join(pieces)


def _buffer(t: TensorProto, n: int) -> mmap.mmap:
    """Fresh pages for tensor `t`'s `n` bytes of raw data, after checking they are what its dims say."""
    dtype = _DIRECT_DTYPES.get(t.data_type)
    if dtype is None or any(d < 0 for d in t.dims):
        raise _Unexpected
    count = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
    if count * np.dtype(dtype).itemsize != n:
        raise _Unexpected  # to_array's error message is the one the user should see
    # anonymous pages of our own rather than np.empty: numpy advises huge pages for large arrays, and with the
    # kernel's THP defrag on "madvise" their first touch compacts memory (VGG-19: 1.5 s instead of 0.2 s)
    return mmap.mmap(-1, n)


def _fill(f: _File, buf: mmap.mmap, off: int, lo: int, hi: int) -> None:
    """Bytes lo..hi of `buf` from the file's bytes off + lo.."""
    with memoryview(buf) as view:
        while lo < hi:
            got = os.preadv(f.fd, [view[lo:hi]], off + lo)
            if got <= 0:
                raise _Unexpected
            lo += got
