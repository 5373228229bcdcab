"""ferry's safetensors reader against files the PyPI safetensors package writes
(`safetensors.numpy.save_file`), single and sharded, read back through `ferry safetensors-dump`."""
import json
import subprocess

import numpy as np
import xxhash
from safetensors.numpy import load_file, save_file

DTYPES = {np.float32: "F32", np.float16: "F16", np.float64: "F64", np.int64: "I64", np.int32: "I32",
          np.int16: "I16", np.int8: "I8", np.uint8: "U8", np.uint16: "U16", np.uint32: "U32", np.uint64: "U64",
          np.bool_: "BOOL"}


def dump(ferry_bin, path):
    out = subprocess.run([ferry_bin, "safetensors-dump", "--json", "--hash", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def tensors_for(rng, prefix):
    out = {}
    for k, (dtype, name) in enumerate(DTYPES.items()):
        shape = [(2, 3), (5,), (1, 2, 3), (), (0, 4), (3, 1, 1, 2)][k % 6]
        if dtype is np.bool_:
            a = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            a = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        else:
            a = rng.standard_normal(shape).astype(dtype)
        out[f"{prefix}.{name.lower()}"] = a
    return out


def check(dumped, arrays, shard_of=None):
    assert sorted(t["name"] for t in dumped["tensors"]) == sorted(arrays)
    for t in dumped["tensors"]:
        a = arrays[t["name"]]
        assert t["dtype"] == DTYPES[a.dtype.type], t["name"]
        assert t["shape"] == list(a.shape), t["name"]
        assert t["n_elements"] == a.size
        assert t["n_bytes"] == a.nbytes
        assert t["xxh64"] == xxhash.xxh64(np.ascontiguousarray(a).tobytes()).hexdigest(), t["name"]
        if shard_of is not None:
            assert dumped["shards"][t["shard"]].endswith(shard_of[t["name"]])
    # Within a shard, tensors come in the order of their data.
    for shard in range(len(dumped["shards"])):
        offsets = [t["file_offset"] for t in dumped["tensors"] if t["shard"] == shard]
        assert offsets == sorted(offsets)


def test_ferry_reads_what_safetensors_writes(ferry_bin, tmp_path):
    rng = np.random.default_rng(7)
    arrays = tensors_for(rng, "model.layers.0")
    path = tmp_path / "model.safetensors"
    save_file(arrays, str(path), metadata={"format": "pt", "note": "caf\u00e9"})
    for target in (path, tmp_path):  # the file, and the directory holding it
        got = dump(ferry_bin, target)
        assert got["metadata"] == {"format": "pt", "note": "caf\u00e9"}
        assert len(got["shards"]) == 1
        check(got, arrays)
    assert set(load_file(str(path))) == set(arrays)  # the package agrees the file is whole


def test_ferry_reads_a_sharded_checkpoint_as_one_set(ferry_bin, tmp_path):
    rng = np.random.default_rng(8)
    shards = {"model-00001-of-00002.safetensors": tensors_for(rng, "model.layers.0"),
              "model-00002-of-00002.safetensors": tensors_for(rng, "model.layers.1")}
    weight_map, arrays = {}, {}
    for name, tensors in shards.items():
        save_file(tensors, str(tmp_path / name), metadata={"format": "pt"})
        weight_map.update({t: name for t in tensors})
        arrays.update(tensors)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(a.nbytes for a in arrays.values())}, "weight_map": weight_map}))
    for target in (tmp_path, tmp_path / "model.safetensors.index.json"):
        got = dump(ferry_bin, target)
        assert [s.rsplit("/", 1)[-1] for s in got["shards"]] == sorted(shards)
        check(got, arrays, weight_map)


def test_ferry_refuses_a_damaged_file(ferry_bin, tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    out = subprocess.run([ferry_bin, "safetensors-dump", str(path)], capture_output=True, text=True)
    assert out.returncode == 1
    assert "tensor 'w' data_offsets [0, 64] run past the end of the data (63 bytes)" in out.stderr, out.stderr
