"""ferry's GGUF reader and writer against the PyPI gguf package, an independent implementation.

(a) files written by gguf.GGUFWriter are read by `ferry gguf-dump --json --hash` and compared, key by
    key and tensor by tensor (bytes through xxh64), with what gguf.GGUFReader sees;
(b) files written by ferry's GgufWriter (the GgufWriterFiles gtest, run with FERRY_GGUF_OUT) are read
    by gguf.GGUFReader and compared with the values the C++ test wrote, bytes exactly.
"""
import json
import os
import pathlib
import subprocess

import gguf
import numpy as np
import pytest
import xxhash
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

TYPE_NAMES = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32", V.INT32: "i32",
              V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string", V.ARRAY: "array", V.UINT64: "u64",
              V.INT64: "i64", V.FLOAT64: "f64"}


def dump(ferry_bin, path):
    out = subprocess.run([ferry_bin, "gguf-dump", "--json", "--hash", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def decode(vtype, parts, i):
    """One value from a GGUFReader field's parts, keeping nested arrays nested (the reader flattens
    them in `contents()`, but its parts hold every length and element type in order)."""
    vtype = V(vtype)
    if vtype == V.STRING:
        return bytes(parts[i + 1]), i + 2
    if vtype == V.ARRAY:
        etype, n = V(int(parts[i][0])), int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            item, i = decode(etype, parts, i)
            items.append(item)
        return (etype, items), i
    return parts[i][0], i + 1


def field_value(field):
    vtype = V(int(field.parts[2][0]))
    value, end = decode(vtype, field.parts, 3)
    assert end == len(field.parts)
    return vtype, value


def same_value(vtype, ref, got, where):
    """`ref` as gguf decoded it, `got` as ferry's JSON printed it."""
    if vtype == V.STRING:
        try:
            expected = ref.decode("utf-8")
        except UnicodeDecodeError:
            expected = {"hex": ref.hex()}
        assert got == expected, where
    elif vtype == V.ARRAY:
        etype, items = ref
        assert got["element_type"] == TYPE_NAMES[etype], where
        assert len(got["items"]) == len(items), where
        for k, (r, g) in enumerate(zip(items, got["items"])):
            same_value(etype, r, g, f"{where}[{k}]")
    elif vtype in (V.FLOAT32, V.FLOAT64):
        x = float(ref)
        if np.isnan(x):
            assert got == "nan", where
        elif np.isinf(x):
            assert got == ("inf" if x > 0 else "-inf"), where
        else:
            assert isinstance(got, float) and got == x, where  # ferry prints the exact value
    elif vtype == V.BOOL:
        assert got is bool(ref), where
    else:
        assert isinstance(got, int) and not isinstance(got, bool) and got == int(ref), where


def compare_with_gguf(ferry_bin, path):
    """Everything ferry reads from `path` equals what gguf.GGUFReader reads."""
    got = dump(ferry_bin, path)
    ref = gguf.GGUFReader(path)
    assert got["version"] == int(ref.fields["GGUF.version"].parts[0][0])
    assert got["alignment"] == ref.alignment
    assert got["data_offset"] == ref.data_offset
    assert got["file_size"] == os.path.getsize(path)
    ref_fields = [f for name, f in ref.fields.items() if not name.startswith("GGUF.")]
    assert [m["key"] for m in got["metadata"]] == [f.name for f in ref_fields]
    for meta, field in zip(got["metadata"], ref_fields):
        vtype, value = field_value(field)
        assert meta["type"] == TYPE_NAMES[vtype], field.name
        same_value(vtype, value, meta["value"], field.name)
    assert len(got["tensors"]) == len(ref.tensors)
    for t, r in zip(got["tensors"], ref.tensors):
        assert t["name"] == r.name
        assert t["dims"] == [int(d) for d in r.shape]  # both in file order, ne0 first
        assert t["type_id"] == int(r.tensor_type)
        assert t["type"].lower() == r.tensor_type.name.lower()
        assert t["file_offset"] == r.data_offset
        assert t["n_elements"] == r.n_elements
        assert t["n_bytes"] == r.n_bytes
        assert t["xxh64"] == xxhash.xxh64(r.data.tobytes()).hexdigest(), r.name
    return got


def raw_blocks(rng, qtype, rows, blocks_per_row):
    """Random bytes for `rows` rows of a block type, shaped as gguf's writer expects raw data."""
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, size=(rows, blocks_per_row * block_bytes), dtype=np.uint8)


def write_with_gguf(path, alignment=None):
    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(str(path), "glm5next")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("s.u8", 200)
    w.add_int8("s.i8", -7)
    w.add_uint16("s.u16", 65535)
    w.add_int16("s.i16", -32768)
    w.add_uint32("s.u32", 4294967295)
    w.add_int32("s.i32", -2147483648)
    w.add_float32("s.f32", 0.1)
    w.add_uint64("s.u64", 2**64 - 1)
    w.add_int64("s.i64", -(2**63))
    w.add_float64("s.f64", -2.5e-300)
    w.add_bool("s.true", True)
    w.add_bool("s.false", False)
    w.add_string("s.utf8", "h\u00e9llo \u2713")
    w.add_string("s.empty", "")
    w.add_key_value("s.not_utf8", b"\xff\xfeok", V.STRING)  # GGUF says UTF-8; ferry keeps the bytes
    w.add_float32("s.nan", float("nan"))
    w.add_float64("s.neg_inf", float("-inf"))
    typed = {V.UINT8: [0, 255], V.INT8: [-128, 127], V.UINT16: [1, 65535], V.INT16: [-1, 2],
             V.UINT32: [7, 4294967295], V.INT32: [-5, 5], V.FLOAT32: [0.5, 1e-45, -3.0],
             V.UINT64: [2**64 - 1, 0], V.INT64: [-(2**63), 2**63 - 1], V.FLOAT64: [1.0 / 3.0, 1e308],
             V.BOOL: [True, False, False]}
    for vtype, values in typed.items():
        w.add_key_value(f"a.{TYPE_NAMES[vtype]}", values, V.ARRAY, sub_type=vtype)
    w.add_array("a.strings", ["x", "", "\u00fc\u00df", "tab\tand\nnewline \"quoted\""])
    w.add_array("a.nested.ints", [[1, 2], [3], [4, 5, 6]])
    w.add_array("a.nested.mixed", [[1], ["x", "y"], [0.5]])
    w.add_array("a.nested.deep", [[[True, False]], [[False]]])
    w.add_array("a.nested.strings", [["a"], ["b", "c"]])

    w.add_tensor("f32.2d", np.arange(15, dtype=np.float32).reshape(3, 5))
    w.add_tensor("f16.1d", rng.standard_normal(10).astype(np.float16))
    w.add_tensor("f32.3d", rng.standard_normal((2, 3, 4)).astype(np.float32))
    w.add_tensor("f32.4d", rng.standard_normal((2, 1, 3, 2)).astype(np.float32))
    w.add_tensor("i32.1d", np.array([1, -2, 3], dtype=np.int32))
    w.add_tensor("i8.2d", np.array([[1, -2], [3, 4]], dtype=np.int8))
    w.add_tensor("f64.1d", np.array([1.5, -2.25], dtype=np.float64))
    w.add_tensor("bf16.2d", raw_blocks(rng, Q.BF16, 2, 4), raw_dtype=Q.BF16)
    for qtype, rows, blocks in [(Q.Q8_0, 2, 2), (Q.Q4_0, 1, 3), (Q.Q4_K, 3, 1), (Q.Q5_K, 1, 2), (Q.Q6_K, 2, 1),
                                (Q.IQ4_XS, 1, 1), (Q.IQ3_S, 2, 2), (Q.IQ2_XXS, 1, 1)]:
        w.add_tensor(f"{qtype.name.lower()}.w", raw_blocks(rng, qtype, rows, blocks), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_ferry_reads_what_gguf_writes(ferry_bin, tmp_path):
    path = tmp_path / "from_gguf.gguf"
    write_with_gguf(path)
    got = compare_with_gguf(ferry_bin, path)
    assert got["alignment"] == 32
    assert len(got["metadata"]) == 33  # general.architecture + 32
    assert len(got["tensors"]) == 16
    meta = {m["key"]: m for m in got["metadata"]}
    assert meta["s.not_utf8"]["value"] == {"hex": "fffe6f6b"}
    assert meta["a.nested.mixed"]["value"]["items"][1] == {"element_type": "string", "items": ["x", "y"]}
    assert meta["a.bool"]["value"]["items"] == [True, False, False]
    f32 = next(t for t in got["tensors"] if t["name"] == "f32.2d")
    assert f32["dims"] == [5, 3] and f32["type"] == "f32"
    q4k = next(t for t in got["tensors"] if t["name"] == "q4_k.w")
    assert q4k["dims"] == [256, 3] and q4k["n_bytes"] == 3 * 144


def test_ferry_honours_a_custom_alignment_from_gguf(ferry_bin, tmp_path):
    path = tmp_path / "aligned.gguf"
    write_with_gguf(path, alignment=128)
    got = compare_with_gguf(ferry_bin, path)
    assert got["alignment"] == 128
    assert all(t["file_offset"] % 128 == 0 for t in got["tensors"])


def test_ferry_refuses_truncated_gguf_files(ferry_bin, tmp_path):
    path = tmp_path / "whole.gguf"
    write_with_gguf(path)
    data = path.read_bytes()
    # gguf pads the last tensor too: only a cut before the end of some tensor's data is a truncation.
    end = max(t["file_offset"] + t["n_bytes"] for t in dump(ferry_bin, path)["tensors"])
    cut = tmp_path / "cut.gguf"
    for n in [0, 3, 10, 23, 100, 500, 1000, end // 2, end - 1]:
        cut.write_bytes(data[:n])
        out = subprocess.run([ferry_bin, "gguf-dump", str(cut)], capture_output=True, text=True)
        assert out.returncode == 1, (n, out.stderr)
        assert f"{cut}: at byte " in out.stderr, out.stderr


# ---- (b) ferry writes, gguf reads -----------------------------------------------------------------

def pattern(k, n):
    """Byte j of the k-th tensor of GgufWriterFiles (tests/model/gguf_writer_test.cpp)."""
    j = np.arange(n, dtype=np.uint64)
    return ((j * 131 + k * 17 + 7) & 0xFF).astype(np.uint8).tobytes()


ALL_TYPES_METADATA = [
    ("general.architecture", V.STRING, "glm5next"),
    ("general.name", V.STRING, "h\u00e9llo \u2713"),
    ("t.empty_string", V.STRING, ""),
    ("t.u8", V.UINT8, 255), ("t.i8", V.INT8, -128), ("t.u16", V.UINT16, 65535), ("t.i16", V.INT16, -32768),
    ("t.u32", V.UINT32, 4294967295), ("t.i32", V.INT32, -2147483648), ("t.f32", V.FLOAT32, np.float32(-1.25e-7)),
    ("t.bool_true", V.BOOL, True), ("t.bool_false", V.BOOL, False),
    ("t.u64", V.UINT64, 2**64 - 1), ("t.i64", V.INT64, -(2**63)), ("t.f64", V.FLOAT64, 3.141592653589793),
    ("t.arr.u8", V.ARRAY, (V.UINT8, [0, 1, 255])),
    ("t.arr.i8", V.ARRAY, (V.INT8, [-128, 0, 127])),
    ("t.arr.u16", V.ARRAY, (V.UINT16, [0, 65535])),
    ("t.arr.i16", V.ARRAY, (V.INT16, [-32768, 32767])),
    ("t.arr.u32", V.ARRAY, (V.UINT32, [0, 4294967295])),
    ("t.arr.i32", V.ARRAY, (V.INT32, [-2147483648, 2147483647])),
    ("t.arr.f32", V.ARRAY, (V.FLOAT32, [0.5, -2.0, np.float32(1e30)])),
    ("t.arr.bool", V.ARRAY, (V.BOOL, [True, False, True])),
    ("t.arr.string", V.ARRAY, (V.STRING, ["a", "", "\u00fc"])),
    ("t.arr.u64", V.ARRAY, (V.UINT64, [0, 2**64 - 1])),
    ("t.arr.i64", V.ARRAY, (V.INT64, [-(2**63), 2**63 - 1])),
    ("t.arr.f64", V.ARRAY, (V.FLOAT64, [0.1, -1e300])),
    ("t.arr.empty_u32", V.ARRAY, (V.UINT32, [])),
    ("t.nested.i32", V.ARRAY, (V.ARRAY, [(V.INT32, [1, 2]), (V.INT32, [3]), (V.INT32, [])])),
    ("t.nested.mixed", V.ARRAY, (V.ARRAY, [(V.UINT8, [7]), (V.STRING, ["x", "y"])])),
    ("t.nested.deep", V.ARRAY, (V.ARRAY, [(V.ARRAY, [(V.BOOL, [True])])])),
]
ALL_TYPES_TENSORS = [("t0.f32", [5, 3], Q.F32), ("t1.f16", [8], Q.F16), ("t2.bf16", [4, 2], Q.BF16),
                     ("t3.q8_0", [64, 2], Q.Q8_0), ("t4.q4_k", [256, 2], Q.Q4_K), ("t5.iq3_s", [256], Q.IQ3_S),
                     ("t6.i32", [3], Q.I32), ("t7.f32_3d", [2, 3, 4], Q.F32), ("t8.f32_4d", [1, 2, 1, 2], Q.F32),
                     ("t9.q6_k", [512], Q.Q6_K)]
ALIGN64_TENSORS = [("a.f32", [3], Q.F32), ("b.q5_k", [256], Q.Q5_K), ("c.f16", [7], Q.F16)]


def as_expected(vtype, value):
    """gguf's decoded value (see decode) in the form of the tables above."""
    if vtype == V.STRING:
        return value.decode("utf-8")
    if vtype == V.ARRAY:
        etype, items = value
        return (etype, [as_expected(etype, x) for x in items])
    if vtype == V.BOOL:
        return bool(value)
    if vtype in (V.FLOAT32, V.FLOAT64):
        return float(value)
    return int(value)


def check_tensors(reader, specs):
    assert len(reader.tensors) == len(specs)
    for k, (t, (name, dims, qtype)) in enumerate(zip(reader.tensors, specs)):
        assert t.name == name
        assert [int(d) for d in t.shape] == dims
        assert t.tensor_type == qtype
        assert (t.data_offset - reader.data_offset) % reader.alignment == 0
        assert t.data.tobytes() == pattern(k, t.n_bytes), name


@pytest.fixture(scope="module")
def ferry_written(ferry_bin, tmp_path_factory):
    tests_bin = pathlib.Path(ferry_bin).parent / "tests" / "ferry_model_tests"
    if not os.access(tests_bin, os.X_OK):
        pytest.fail(f"{tests_bin} not found: build the ferry_model_tests target")
    out = tmp_path_factory.mktemp("ferry_gguf")
    run = subprocess.run([str(tests_bin), "--gtest_filter=GgufWriterFiles.WriteForPython"],
                         env={**os.environ, "FERRY_GGUF_OUT": str(out)}, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[  PASSED  ] 1 test" in run.stdout, run.stdout
    return out


def test_gguf_reads_what_ferry_writes(ferry_written):
    reader = gguf.GGUFReader(ferry_written / "ferry_all_types.gguf")
    assert int(reader.fields["GGUF.version"].parts[0][0]) == 3
    assert reader.alignment == 32
    fields = [f for name, f in reader.fields.items() if not name.startswith("GGUF.")]
    assert [f.name for f in fields] == [key for key, _, _ in ALL_TYPES_METADATA]
    for field, (key, vtype, expected) in zip(fields, ALL_TYPES_METADATA):
        got_type, value = field_value(field)
        assert got_type == vtype, key
        assert as_expected(got_type, value) == as_expected_form(vtype, expected), key
    check_tensors(reader, ALL_TYPES_TENSORS)


def as_expected_form(vtype, value):
    """The tables' values with numpy floats turned into Python floats (exactly)."""
    if vtype == V.ARRAY:
        etype, items = value
        return (etype, [as_expected_form(etype, x) for x in items])
    if vtype in (V.FLOAT32, V.FLOAT64):
        return float(value)
    return value


def test_gguf_reads_ferry_alignment_and_padding(ferry_written):
    path = ferry_written / "ferry_align64.gguf"
    reader = gguf.GGUFReader(path)
    assert reader.alignment == 64
    assert reader.data_offset % 64 == 0
    check_tensors(reader, ALIGN64_TENSORS)
    # ggml sizes the data section as every tensor padded to the alignment, the last one included.
    assert os.path.getsize(path) == reader.data_offset + 64 + 192 + 64

    empty = gguf.GGUFReader(ferry_written / "ferry_empty.gguf")
    assert len(empty.tensors) == 0
    assert [n for n in empty.fields if not n.startswith("GGUF.")] == []


def test_ferry_and_gguf_agree_on_ferry_files(ferry_bin, ferry_written):
    for name in ["ferry_all_types.gguf", "ferry_align64.gguf", "ferry_empty.gguf"]:
        compare_with_gguf(ferry_bin, ferry_written / name)
