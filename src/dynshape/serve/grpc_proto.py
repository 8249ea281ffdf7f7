"""The KServe v2 gRPC messages and service, generated from the vendored public .proto at first use.

Why a descriptor set in a private pool, not `_pb2` modules in the default one: grpcio-tools' protoc compiles
`proto/open_inference_grpc.proto` (cached by content hash under the dynshape cache directory; nothing generated is
committed) and the message classes are built from that descriptor in a pool of our own. The tritonclient package
registers the same `inference.*` names (its grpc_service.proto) in protobuf's default pool, so generated `_pb2`
modules would clash with it in any process that holds both, such as the tests, a bench or an app embedding the
server; the wire format is the same either way.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from dynshape.options import default_cache_dir

PROTO = Path(__file__).with_name("proto") / "open_inference_grpc.proto"
SERVICE = "inference.GRPCInferenceService"


def _descriptor_set() -> bytes:
    """protoc's FileDescriptorSet for the vendored proto: from the cache, else compiled now and cached."""
    text = PROTO.read_bytes()
    from google.protobuf import __version__ as pb_version

    key = hashlib.sha256(text + pb_version.encode()).hexdigest()[:16]
    out = Path(default_cache_dir()) / "serve-grpc" / key / "open_inference_grpc.desc"
    if out.is_file():
        return out.read_bytes()
    from grpc_tools import protoc

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    os.close(fd)
    try:
        rc = protoc.main(["protoc", f"-I{PROTO.parent}", f"--descriptor_set_out={tmp}", PROTO.name])
        if rc != 0:
            raise RuntimeError(f"protoc failed ({rc}) on {PROTO}")
        os.replace(tmp, out)  # atomic: concurrent first uses each write their own temp file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out.read_bytes()


class Protocol:
    """Message classes by short name (`msg("ModelInferRequest")`) and the service's method descriptors."""

    def __init__(self, fds: bytes):
        self.pool = descriptor_pool.DescriptorPool()
        for f in descriptor_pb2.FileDescriptorSet.FromString(fds).file:
            self.pool.Add(f)
        self.service = self.pool.FindServiceByName(SERVICE)

    def msg(self, name: str) -> Any:
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName("inference." + name))

    def method_types(self) -> dict[str, tuple[Any, Any]]:
        """Method name -> (request class, response class), as the .proto declares them."""
        return {m.name: (message_factory.GetMessageClass(m.input_type), message_factory.GetMessageClass(m.output_type))
                for m in self.service.methods}


@functools.lru_cache(maxsize=1)
def protocol() -> Protocol:
    return Protocol(_descriptor_set())
