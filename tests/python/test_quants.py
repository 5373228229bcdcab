"""ferry's quant kernels (model/quant.hpp) against the PyPI gguf package's numpy reference.

Dequantization must be bit-exact with gguf.quants.dequantize on random blocks (every byte random,
fp16 scales random but finite) and on edge blocks; quantizers must match gguf-py byte for byte where
gguf-py has one (Q8_0, BF16; F16 is numpy's astype) and round-trip with small error otherwise.
The C++ side runs through ferry_quant_probe, built next to the ferry binary.
"""
import os
import pathlib
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize


@pytest.fixture(scope="session")
def probe(ferry_bin: str) -> str:
    path = os.path.join(os.path.dirname(ferry_bin), "ferry_quant_probe")
    if not os.access(path, os.X_OK):
        pytest.fail(f"ferry_quant_probe not found at {path}: build the ferry_quant_probe target")
    return path


def run_probe(probe: str, tmp_path: pathlib.Path, mode: str, type_name: str, data: bytes) -> bytes:
    src, dst = tmp_path / f"{mode}.in", tmp_path / f"{mode}.out"
    src.write_bytes(data)
    proc = subprocess.run([probe, mode, type_name, str(src), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return dst.read_bytes()


def cpp_dequant(probe, tmp_path, qtype: T, blocks: np.ndarray) -> np.ndarray:
    out = run_probe(probe, tmp_path, "dequant", qtype.name, blocks.tobytes())
    return np.frombuffer(out, dtype=np.float32)


def cpp_quant(probe, tmp_path, qtype: T, values: np.ndarray) -> np.ndarray:
    out = run_probe(probe, tmp_path, "quant", qtype.name, values.astype(np.float32).tobytes())
    return np.frombuffer(out, dtype=np.uint8)


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal as bit patterns, except that any NaN equals any NaN."""
    got = np.ascontiguousarray(got, dtype=np.float32).ravel()
    want = np.ascontiguousarray(want, dtype=np.float32).ravel()
    assert got.shape == want.shape, what
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = int(np.flatnonzero(~same)[0])
        pytest.fail(f"{what}: {int((~same).sum())} of {got.size} differ; first at {i}: "
                    f"got {got[i]!r} ({got.view(np.uint32)[i]:#010x}), "
                    f"want {want[i]!r} ({want.view(np.uint32)[i]:#010x})")


# Byte offsets of the fp16 scale fields inside each block type (ggml-common.h layouts).
FP16_FIELDS = {
    T.Q4_0: [0], T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_XS: [0], T.IQ3_S: [0], T.IQ2_XXS: [0],
}
BLOCK_TYPES = list(FP16_FIELDS)


def random_finite_fp16(rng: np.random.Generator, n: int) -> np.ndarray:
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    # An all-ones exponent (inf/NaN) loses its top exponent bit: still random, now finite.
    return np.where((h & 0x7C00) == 0x7C00, h ^ np.uint16(0x4000), h).astype(np.uint16)


def random_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        blocks[:, off:off + 2] = random_finite_fp16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return blocks


def edge_blocks(rng: np.random.Generator, qtype: T) -> np.ndarray:
    """Blocks with every payload byte 0 or 0xff and special scales: zero, -0, the smallest
    subnormal, the largest finite, inf and NaN (the reference turns 0*inf into NaN; so must we)."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    scales = [0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0xFBFF, 0x3C00, 0x7C00, 0xFC00, 0x7E00]
    out = []
    for fill in (0x00, 0xFF, None):
        for s in scales:
            b = (rng.integers(0, 256, size=type_size, dtype=np.uint8) if fill is None
                 else np.full(type_size, fill, dtype=np.uint8))
            for off in FP16_FIELDS[qtype]:
                b[off:off + 2] = np.array([s], dtype=np.uint16).view(np.uint8)
            out.append(b)
    return np.stack(out)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_dequant_random_blocks_bit_exact(probe, tmp_path, qtype):
    rng = np.random.default_rng(1000 + int(qtype))
    blocks = random_blocks(rng, qtype, 2048)
    assert_bits_equal(cpp_dequant(probe, tmp_path, qtype, blocks), dequantize(blocks, qtype), qtype.name)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_dequant_edge_blocks_bit_exact(probe, tmp_path, qtype):
    rng = np.random.default_rng(2000 + int(qtype))
    blocks = edge_blocks(rng, qtype)
    with np.errstate(invalid="ignore", over="ignore"):
        want = dequantize(blocks, qtype)
    assert_bits_equal(cpp_dequant(probe, tmp_path, qtype, blocks), want, qtype.name)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_dequant_plain_types_every_pattern(probe, tmp_path, qtype):
    rng = np.random.default_rng(3000 + int(qtype))
    if qtype == T.F32:
        raw = rng.integers(0, 1 << 32, size=1 << 16, dtype=np.uint32).view(np.uint8)
    else:
        raw = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)  # every 16-bit code, NaNs included
    assert_bits_equal(cpp_dequant(probe, tmp_path, qtype, raw), dequantize(raw, qtype), qtype.name)


def test_probe_rejects_partial_blocks(probe, tmp_path):
    src, dst = tmp_path / "short.in", tmp_path / "short.out"
    src.write_bytes(bytes(143))
    proc = subprocess.run([probe, "dequant", "q4_K", str(src), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "143 bytes is not a whole number of q4_K blocks of 144 bytes" in proc.stderr
