"""Checking an ONNX model's bytes before onnxruntime reads them: a protocol buffer, with every weight inside.

onnxruntime trusts its model: a damaged file ends in its own traceback, and
a tensor whose ``data_location`` is ``EXTERNAL`` names a file
(``external_data``'s ``location``: ``/etc/passwd``, ``../../secret``) that
onnxruntime would go and read. An ONNX file mxfp16 writes holds every
tensor in itself (``raw_data``), so :func:`check_model_bytes` parses the
bytes with protobuf (a dependency of onnxruntime: no ``onnx`` package
needed) against the part of ``onnx.proto`` that leads to a tensor
(:data:`_SCHEMA`), and refuses a file that does not parse, holds no graph,
or stores any tensor outside itself. Nothing named there is opened.
"""
from .output import shown

__all__ = ["ONNXFileError", "check_model_bytes"]

#: ``TensorProto.DataLocation.EXTERNAL``.
_EXTERNAL = 1
#: The messages of ``onnx.proto`` (field numbers as there) that lead to a tensor, and their fields that do.
_SCHEMA = {
    "Model": {"graph": (7, "Graph", False), "training_info": (20, "TrainingInfo", True),
              "functions": (25, "Function", True)},
    "TrainingInfo": {"initialization": (1, "Graph", False), "algorithm": (2, "Graph", False)},
    "Function": {"node": (7, "Node", True), "attribute_proto": (11, "Attribute", True)},
    "Graph": {"node": (1, "Node", True), "initializer": (5, "Tensor", True),
              "sparse_initializer": (15, "Sparse", True)},
    "Node": {"attribute": (5, "Attribute", True)},
    "Attribute": {"t": (5, "Tensor", False), "g": (6, "Graph", False), "tensors": (10, "Tensor", True),
                  "graphs": (11, "Graph", True), "sparse_tensor": (22, "Sparse", False),
                  "sparse_tensors": (23, "Sparse", True)},
    "Sparse": {"values": (1, "Tensor", False), "indices": (2, "Tensor", False)},
    "Tensor": {"external_data": (13, "Entry", True), "data_location": (14, None, False)},
    "Entry": {},
}
_CLASSES = {}


class ONNXFileError(ValueError):
    """ONNX bytes that onnxruntime should not be given; the message names the file and the problem."""


def _message_classes():
    """The protobuf classes of :data:`_SCHEMA`, built once (other fields of the file stay unknown, unparsed)."""
    if not _CLASSES:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        found = descriptor_pb2.FieldDescriptorProto
        proto = descriptor_pb2.FileDescriptorProto(name="mxfp16_onnx_subset.proto", package="mxfp16_onnx_subset",
                                                   syntax="proto2")
        for name, fields in _SCHEMA.items():
            message = proto.message_type.add(name=name)
            for field, (number, kind, repeated) in fields.items():
                entry = message.field.add(name=field, number=number,
                                          label=found.LABEL_REPEATED if repeated else found.LABEL_OPTIONAL)
                if kind is None:
                    entry.type = found.TYPE_INT32  # an enum on the wire: a varint
                else:
                    entry.type, entry.type_name = found.TYPE_MESSAGE, f".mxfp16_onnx_subset.{kind}"
        pool = descriptor_pool.DescriptorPool()
        pool.Add(proto)
        for name in _SCHEMA:
            _CLASSES[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"mxfp16_onnx_subset.{name}"))
    return _CLASSES


def _tensors(message, kind):
    """Every tensor reachable from ``message`` (of :data:`_SCHEMA` type ``kind``)."""
    if kind == "Tensor":
        yield message
        return
    for field, (_, child, repeated) in _SCHEMA[kind].items():
        if child is None:
            continue
        values = getattr(message, field) if repeated else ([getattr(message, field)] if message.HasField(field)
                                                            else [])
        for value in values:
            yield from _tensors(value, child)


def check_model_bytes(data, path, fix):
    """Refuse (:class:`ONNXFileError`) ONNX model bytes that do not parse, hold no graph, or keep a tensor elsewhere.

    Parameters
    ----------
    data : bytes
        The model, as it will be handed to onnxruntime.
    path : str or Path
        Where it was read from, for the messages.
    fix : str
        What the user should do; ends every message.
    """
    from google.protobuf.message import DecodeError

    model = _message_classes()["Model"]()
    try:
        model.ParseFromString(data)
    except (DecodeError, RecursionError, ValueError):
        raise ONNXFileError(f"{shown(path)} is not an ONNX model (its protocol buffer does not parse: damaged or "
                            f"cut short); {fix}") from None
    if not model.HasField("graph"):
        raise ONNXFileError(f"{shown(path)} holds no ONNX graph (damaged, or not a model file); {fix}")
    outside = sum(1 for t in _tensors(model, "Model") if t.data_location == _EXTERNAL or len(t.external_data))
    if outside:
        raise ONNXFileError(f"{shown(path)} keeps {outside} tensor(s) in other files (ONNX external data); an "
                            "mxfp16 export keeps every weight inside its model file, so those files were not read; "
                            f"{fix}")
