"""The ONNX reader (``tts.onnx_file``) against the ``onnx`` package itself: what herald
reads of a file is what onnx reads of it, for every element type and either way a tensor
may hold its values, and what it cannot read is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tts.errors import VoiceError
from tts.onnx_file import read_model, to_array
from tts.voice import read_onnx

DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32",
          "int64", "uint32", "uint64", "bool"]


def _values(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _save(path: Path, tensors: list[TensorProto], nodes: list[onnx.NodeProto] = ()) -> None:
    graph = helper.make_graph(list(nodes), "g", [], [], initializer=tensors)
    onnx.save(helper.make_model(graph), str(path))


@pytest.mark.parametrize("raw", [True, False], ids=["raw_data", "typed_fields"])
def test_every_element_type_reads_as_onnx_reads_it(raw: bool, tmp_path: Path) -> None:
    tensors = []
    for dtype in DTYPES:
        values = _values(dtype, (3, 5))
        if raw:
            tensors.append(numpy_helper.from_array(values, dtype))
        else:  # as a writer that does not pack its values into raw bytes stores them
            kind = helper.np_dtype_to_tensor_dtype(values.dtype)
            flat = values.flatten()
            if dtype == "float16":
                flat = flat.view(np.uint16)  # onnx holds float16's bits in int32_data
            tensors.append(helper.make_tensor(dtype, kind, values.shape, flat.tolist()))
    assert all(bool(t.raw_data) == raw for t in tensors)
    path = tmp_path / "types.onnx"
    _save(path, tensors)
    theirs = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    ours = {t.name: to_array(t) for t in read_model(path).graph.initializer}
    assert ours.keys() == theirs.keys() == set(DTYPES)
    for name, got in ours.items():
        assert got.dtype == theirs[name].dtype and got.shape == (3, 5), name
        assert np.array_equal(got, theirs[name]), name
        assert got.flags.owndata and got.flags.writeable, name  # nothing shared with the file


def test_the_bundled_voice_reads_as_onnx_reads_it(catalog) -> None:  # type: ignore[no-untyped-def]
    """Every weight herald takes from the bundled voice, bit for bit what onnx reads for
    the same initializer, and every convolution's dilations and strides."""
    path = catalog.resolve().model_path
    weights, attrs = read_onnx(path)
    model = onnx.load(str(path))
    theirs = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert len(weights) > 300
    by_value = {v.tobytes(): k for k, v in theirs.items()}
    for name, got in weights.items():
        if name == "dp.flows.0.logs":  # the one weight read back from a folded constant
            continue
        assert got.tobytes() in by_value, name
        assert got.dtype == theirs[by_value[got.tobytes()]].dtype, name
    convs = {".".join(n.name.strip("/").split("/")[:-1]): n for n in model.graph.node
             if n.op_type in ("Conv", "ConvTranspose")}
    assert attrs.keys() == convs.keys()
    for path_, node in convs.items():
        expected = {a.name: list(helper.get_attribute_value(a)) for a in node.attribute
                    if a.name in ("dilations", "strides")}
        assert attrs[path_] == expected, path_


def test_values_kept_in_another_file_are_refused_by_name(tmp_path: Path) -> None:
    tensor = numpy_helper.from_array(np.ones((4, 4), np.float32), "dec.conv_pre.weight")
    path = tmp_path / "external.onnx"
    model = helper.make_model(helper.make_graph([], "g", [], [], initializer=[tensor]))
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    [stored] = read_model(path).graph.initializer
    with pytest.raises(VoiceError, match=r"'dec.conv_pre.weight' is stored outside"):
        to_array(stored)


def test_an_element_type_herald_does_not_read_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "bf16.onnx"
    _save(path, [helper.make_tensor("enc_p.emb.weight", TensorProto.BFLOAT16, [2], [1, 2])])
    [stored] = read_model(path).graph.initializer
    with pytest.raises(VoiceError, match=r"'enc_p.emb.weight' has ONNX element type 16"):
        to_array(stored)


def test_a_file_that_is_not_a_model_with_weights_is_refused_saying_what_to_do(
        tmp_path: Path) -> None:
    tensor = numpy_helper.from_array(np.ones(1000, np.float32), "w")
    data = helper.make_model(helper.make_graph([], "g", [], [], initializer=[tensor]))
    (tmp_path / "cut.onnx").write_bytes(data.SerializeToString()[:-100])  # inside the tensor
    (tmp_path / "text.onnx").write_text("this is not a model")
    (tmp_path / "empty.onnx").write_bytes(b"")
    for name in ("cut", "text", "empty"):
        with pytest.raises(VoiceError, match=r"cannot read ONNX voice .* not an ONNX model "
                           r"\(damaged, cut short or another kind of file\): download or copy "
                           "the voice again"):
            read_model(tmp_path / f"{name}.onnx")
    with pytest.raises(VoiceError, match="cannot read ONNX voice .*missing.onnx.*No such file"):
        read_model(tmp_path / "missing.onnx")
