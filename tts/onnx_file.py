"""What a voice is read from in an ONNX file: the graph's initializers (its weights) and its
nodes' names, inputs and integer-list attributes.

The file is parsed by protobuf against a schema of just those fields, declared here with
the field numbers of ONNX's own (``onnx/onnx.proto``, whose fields ONNX never renumbers);
protobuf skips every other field unread. The ``onnx`` package would parse it with its whole
schema, but importing it imports ``ml_dtypes``, whose extension alone took 0.7-0.96 s to
import here: a fifth of every herald start (the daemon's, ``herald say``'s), for a file
read once.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message
from google.protobuf.message_factory import GetMessageClass

from .errors import VoiceError

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# Each message's fields herald reads: (number, name, type, label, message type or "").
_SCHEMA: dict[str, list[tuple[int, str, int, int, str]]] = {
    "ModelProto": [(7, "graph", _F.TYPE_MESSAGE, _OPTIONAL, "GraphProto")],
    "GraphProto": [(1, "node", _F.TYPE_MESSAGE, _REPEATED, "NodeProto"),
                   (5, "initializer", _F.TYPE_MESSAGE, _REPEATED, "TensorProto")],
    "NodeProto": [(1, "input", _F.TYPE_STRING, _REPEATED, ""),
                  (3, "name", _F.TYPE_STRING, _OPTIONAL, ""),
                  (4, "op_type", _F.TYPE_STRING, _OPTIONAL, ""),
                  (5, "attribute", _F.TYPE_MESSAGE, _REPEATED, "AttributeProto")],
    "AttributeProto": [(1, "name", _F.TYPE_STRING, _OPTIONAL, ""),
                       (8, "ints", _F.TYPE_INT64, _REPEATED, "")],
    "TensorProto": [(1, "dims", _F.TYPE_INT64, _REPEATED, ""),
                    (2, "data_type", _F.TYPE_INT32, _OPTIONAL, ""),
                    (4, "float_data", _F.TYPE_FLOAT, _REPEATED, ""),
                    (5, "int32_data", _F.TYPE_INT32, _REPEATED, ""),
                    (7, "int64_data", _F.TYPE_INT64, _REPEATED, ""),
                    (8, "name", _F.TYPE_STRING, _OPTIONAL, ""),
                    (9, "raw_data", _F.TYPE_BYTES, _OPTIONAL, ""),
                    (10, "double_data", _F.TYPE_DOUBLE, _REPEATED, ""),
                    (11, "uint64_data", _F.TYPE_UINT64, _REPEATED, ""),
                    (14, "data_location", _F.TYPE_INT32, _OPTIONAL, "")],
}
_PACKAGE = "herald.onnx_subset"

# ONNX's element types herald reads (``TensorProto.DataType``): the numpy type, and the
# typed field that holds the values when ``raw_data`` does not (``int32_data`` holds the
# narrower integers, booleans and float16's bits as int32 each).
_TYPES: dict[int, tuple[str, str]] = {
    1: ("float32", "float_data"), 2: ("uint8", "int32_data"), 3: ("int8", "int32_data"),
    4: ("uint16", "int32_data"), 5: ("int16", "int32_data"), 6: ("int32", "int32_data"),
    7: ("int64", "int64_data"), 9: ("bool", "int32_data"), 10: ("float16", "int32_data"),
    11: ("float64", "double_data"), 12: ("uint32", "uint64_data"),
    13: ("uint64", "uint64_data"),
}
_DAMAGED = ("not an ONNX model (damaged, cut short or another kind of file): download or "
            "copy the voice again")
_EXTERNAL = 1  # ``TensorProto.DataLocation.EXTERNAL``: the values are in another file


@cache
def _model_class() -> Any:
    """The protobuf class of the schema above (built once, in a pool of its own)."""
    proto = descriptor_pb2.FileDescriptorProto(name="herald_onnx_subset.proto",
                                               package=_PACKAGE, syntax="proto2")
    for name, fields in _SCHEMA.items():
        msg = proto.message_type.add(name=name)
        for number, field_name, kind, label, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    return GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.ModelProto"))


def read_model(path: Path) -> Any:
    """``path``'s ONNX model: ``.graph.node`` and ``.graph.initializer`` as ONNX names
    them, with the fields above. Raises ``VoiceError`` for a file that is not a model with
    weights."""
    model = _model_class()()
    try:
        model.ParseFromString(path.read_bytes())
    except OSError as e:
        raise VoiceError(f"cannot read ONNX voice {path}: {e}") from e
    except message.DecodeError as e:
        raise VoiceError(f"cannot read ONNX voice {path}: {_DAMAGED}") from e
    if not model.graph.initializer:  # an empty file parses, as an empty model
        raise VoiceError(f"cannot read ONNX voice {path}: it holds no weights; {_DAMAGED}")
    return model


def to_array(tensor: Any) -> np.ndarray:
    """An initializer's values as a numpy array of its own (nothing shared with the
    parsed file, which may then be dropped). Raises ``VoiceError`` for values herald
    cannot read: another element type, or values kept in a file of their own."""
    if tensor.data_location == _EXTERNAL:
        raise VoiceError(f"weight {tensor.name!r} is stored outside the .onnx file (ONNX "
                         "external data); herald reads voices whose weights are in the file, "
                         "as Piper exports them")
    kind = _TYPES.get(tensor.data_type)
    if kind is None:
        raise VoiceError(f"weight {tensor.name!r} has ONNX element type {tensor.data_type}, "
                         "which herald does not read (Piper voices are float32)")
    dtype = np.dtype(kind[0])
    shape = tuple(tensor.dims)
    if tensor.raw_data:  # little-endian, as ONNX stores it
        values = np.frombuffer(tensor.raw_data, dtype=dtype.newbyteorder("<"))
    else:
        typed = getattr(tensor, kind[1])
        if dtype == np.float16:  # float16's bits, one per int32
            values = np.array(typed, np.int32).astype(np.uint16).view(np.float16)
        else:
            values = np.array(typed)
    if values.size != int(np.prod(shape)):
        raise VoiceError(f"weight {tensor.name!r}: {values.size} values for shape {shape}")
    return values.reshape(shape).astype(dtype, copy=True)
