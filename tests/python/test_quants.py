"""ferry's quant kernels (model/formats/quant.hpp) against the PyPI gguf package's numpy reference.

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


# --- quantizers ---------------------------------------------------------------------------------

def random_f32_patterns(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random bit patterns (NaNs, infinities, subnormals included) plus the special values."""
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
    special = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,
                        0x00000001, 0x007FFFFF, 0x3F808000, 0x3F818000, 0x477FF000, 0x477FEFFF, 0x33000000,
                        0x33000001, 0x7F7FFFFF, 0x38800000, 0x387FC000], dtype=np.uint32)
    return np.concatenate([special, bits]).view(np.float32)


def test_bf16_quantize_matches_gguf(probe, tmp_path):
    x = random_f32_patterns(np.random.default_rng(4000), 1 << 16)
    assert cpp_quant(probe, tmp_path, T.BF16, x).tobytes() == quantize(x, T.BF16).tobytes()


def test_f16_quantize_matches_numpy(probe, tmp_path):
    x = random_f32_patterns(np.random.default_rng(4001), 1 << 16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    assert cpp_quant(probe, tmp_path, T.F16, x).tobytes() == want.tobytes()


def q8_0_inputs(rng: np.random.Generator) -> np.ndarray:
    blocks = [
        rng.standard_normal(32 * 512),
        rng.uniform(-1000, 1000, 32 * 64),
        np.zeros(32),
        np.full(32, -3.0),
        # amax 127 gives d = 1: every x.5 is an exact tie, which rounds away from zero
        np.concatenate([[127.0], np.arange(-15.5, 15.5, 1.0)]),
        # a tiny block: d is an fp16 subnormal
        rng.standard_normal(32) * 1e-6,
    ]
    return np.concatenate(blocks).astype(np.float32)


def test_q8_0_quantize_matches_gguf(probe, tmp_path):
    x = q8_0_inputs(np.random.default_rng(4002))
    got = cpp_quant(probe, tmp_path, T.Q8_0, x)
    assert got.tobytes() == quantize(x, T.Q8_0).tobytes()


# rmse(dequant(quant(x)) - x) / rms(x) measured on 2^18 values (seed 5000): standard normal gives
# Q8_0 0.0054, Q6_K 0.0178, Q5_K 0.0361, Q4_K 0.0713; Student-t with 3 degrees of freedom (heavy
# tails) gives 0.0086, 0.0257, 0.0468, 0.0921. Bounds leave about 10-20% margin.
ROUND_TRIP_BOUNDS = {
    T.Q8_0: {"normal": 0.0065, "t3": 0.010},
    T.Q6_K: {"normal": 0.020, "t3": 0.029},
    T.Q5_K: {"normal": 0.040, "t3": 0.053},
    T.Q4_K: {"normal": 0.080, "t3": 0.103},
}
QUANTIZED_TYPES = list(ROUND_TRIP_BOUNDS)


def relative_rmse(y: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(np.mean((y.astype(np.float64) - x) ** 2)) / np.sqrt(np.mean(x.astype(np.float64) ** 2)))


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dist", ["normal", "t3"])
def test_round_trip_error(probe, tmp_path, qtype, dist):
    rng = np.random.default_rng(5000)
    x = (rng.standard_normal(1 << 18) if dist == "normal" else rng.standard_t(3, size=1 << 18)).astype(np.float32)
    blocks = cpp_quant(probe, tmp_path, qtype, x)
    y = dequantize(blocks, qtype)
    # Our dequantizer reads our blocks exactly as gguf-py does.
    assert_bits_equal(cpp_dequant(probe, tmp_path, qtype, blocks), y, qtype.name)
    err = relative_rmse(y, x)
    assert err < ROUND_TRIP_BOUNDS[qtype][dist], f"{qtype.name} {dist}: relative rmse {err:.5f}"


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES, ids=lambda t: t.name)
def test_round_trip_per_block_magnitudes(probe, tmp_path, qtype):
    """Each block at its own magnitude (1e-2 .. 1e3): the scales must follow every block."""
    rng = np.random.default_rng(5001)
    block, _ = GGML_QUANT_SIZES[qtype]
    n_blocks = 256
    mags = 10.0 ** rng.uniform(-2, 3, size=(n_blocks, 1))
    x = (rng.standard_normal((n_blocks, block)) * mags).astype(np.float32)
    y = dequantize(cpp_quant(probe, tmp_path, qtype, x.ravel()), qtype).reshape(n_blocks, block)
    worst = max(relative_rmse(y[i], x[i]) for i in range(n_blocks))
    # Per block (32 or 256 values) the error varies more than over 2^18 values (measured worst:
    # 1.34x the bound for Q8_0, about 1.05x for the K types): allow 1.5x.
    assert worst < 1.5 * ROUND_TRIP_BOUNDS[qtype]["normal"], f"{qtype.name}: worst block {worst:.5f}"


@pytest.mark.parametrize("qtype", QUANTIZED_TYPES, ids=lambda t: t.name)
def test_round_trip_degenerate_blocks(probe, tmp_path, qtype):
    block, _ = GGML_QUANT_SIZES[qtype]
    zeros = np.zeros(block, dtype=np.float32)
    y = dequantize(cpp_quant(probe, tmp_path, qtype, zeros), qtype)
    assert np.array_equal(y, zeros)
    for value in (0.75, -0.75, 1000.0):
        x = np.full(block, value, dtype=np.float32)
        y = dequantize(cpp_quant(probe, tmp_path, qtype, x), qtype)
        # A constant comes back within fp16 precision of the scales (measured at most 3.7e-4).
        np.testing.assert_allclose(y, x, rtol=1e-3, err_msg=f"{qtype.name} constant {value}")
    spike = zeros.copy()
    spike[block // 3] = -50.0
    y = dequantize(cpp_quant(probe, tmp_path, qtype, spike), qtype)
    # One value among zeros: measured error at most 0.02 (Q4_K's min offset), zeros stay near zero.
    np.testing.assert_allclose(y, spike, rtol=1e-3, atol=0.05, err_msg=f"{qtype.name} spike")


# --- IQ quantizers ------------------------------------------------------------------------------
# gguf-py dequantizes IQ4_XS and IQ3_S but has no quantizer for them: ferry's blocks must decode the
# same through gguf-py as through ferry, and the error must be what these formats give (ggml's own
# Measured rmse / rms (2^18 values, seed 5000, no importance matrix): IQ4_XS normal 0.0768, t3 0.1024
# (Q4_K: 0.0713, 0.0921); IQ3_S normal 0.1665, t3 0.2237. The same algorithms rewritten in numpy
# float32 from ggml's description give the same bytes on random blocks (checked once, not kept).
IQ_BOUNDS = {
    T.IQ4_XS: {"normal": 0.085, "t3": 0.113},
    T.IQ3_S: {"normal": 0.185, "t3": 0.245},
}
IQ_TYPES = list(IQ_BOUNDS)


def cpp_quant_weighted(probe, tmp_path, qtype: T, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    src, dst, w = tmp_path / "wq.in", tmp_path / "wq.out", tmp_path / "wq.w"
    src.write_bytes(values.astype(np.float32).tobytes())
    w.write_bytes(weights.astype(np.float32).tobytes())
    proc = subprocess.run([probe, "quant", qtype.name, str(src), str(dst), str(w)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return np.frombuffer(dst.read_bytes(), dtype=np.uint8)


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dist", ["normal", "t3"])
def test_iq_round_trip_error(probe, tmp_path, qtype, dist):
    rng = np.random.default_rng(5000)
    x = (rng.standard_normal(1 << 18) if dist == "normal" else rng.standard_t(3, size=1 << 18)).astype(np.float32)
    blocks = cpp_quant(probe, tmp_path, qtype, x)
    y = dequantize(blocks, qtype)
    assert_bits_equal(cpp_dequant(probe, tmp_path, qtype, blocks), y, qtype.name)
    err = relative_rmse(y, x)
    assert err < IQ_BOUNDS[qtype][dist], f"{qtype.name} {dist}: relative rmse {err:.5f}"


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_iq_round_trip_per_block_magnitudes(probe, tmp_path, qtype):
    rng = np.random.default_rng(5001)
    n_blocks = 256
    mags = 10.0 ** rng.uniform(-2, 3, size=(n_blocks, 1))
    x = (rng.standard_normal((n_blocks, 256)) * mags).astype(np.float32)
    y = dequantize(cpp_quant(probe, tmp_path, qtype, x.ravel()), qtype).reshape(n_blocks, 256)
    worst = max(relative_rmse(y[i], x[i]) for i in range(n_blocks))
    assert worst < 1.5 * IQ_BOUNDS[qtype]["normal"], f"{qtype.name}: worst block {worst:.5f}"


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_iq_round_trip_degenerate_blocks(probe, tmp_path, qtype):
    zeros = np.zeros(256, dtype=np.float32)
    assert np.array_equal(dequantize(cpp_quant(probe, tmp_path, qtype, zeros), qtype), zeros)
    for value in (0.75, -0.75, 1000.0):
        x = np.full(256, value, dtype=np.float32)
        y = dequantize(cpp_quant(probe, tmp_path, qtype, x), qtype)
        # IQ4_XS: within the scale's fp16 rounding (measured 1.3e-4). IQ3_S's grid holds no constant
        # vector but (1,1,1,1), and ggml's search tries scales near the top of the grid only, so a
        # constant comes back as a mix of nearby levels (measured 24.8% off, in both of ferry's ports).
        np.testing.assert_allclose(y, x, rtol=1e-3 if qtype == T.IQ4_XS else 0.26,
                                   err_msg=f"{qtype.name} constant {value}")
    spike = zeros.copy()
    spike[100] = -50.0
    y = dequantize(cpp_quant(probe, tmp_path, qtype, spike), qtype)
    assert abs(y[100] + 50.0) < 2.0, f"{qtype.name} spike {y[100]}"
    if qtype == T.IQ4_XS:
        # Zero is not a level: the nearest one, 1, times the spike's scale (~50/127): measured 0.44.
        assert np.abs(np.delete(y, 100)).max() < 0.5
    else:
        # IQ3_S has no zero either (magnitudes are odd multiples, scales d*(1+2s)): inside the spike's
        # sub-block the zeros come back as grid neighbours of the spike (up to 12 measured); the seven
        # all-zero sub-blocks at +-d of the block, d = 50/15/31*1.033 ~ 0.11.
        outside = np.concatenate([y[:96], y[128:]])
        assert np.abs(outside).max() < 0.2, np.abs(outside).max()


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_iq_importance_weights_lower_the_weighted_error(probe, tmp_path, qtype):
    """An importance matrix row (per column, repeated per row) moves the error off the heavy columns."""
    rng = np.random.default_rng(5002)
    rows, cols = 64, 1024
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    col_weight = np.where(rng.random(cols) < 0.1, 30.0, 0.3).astype(np.float32)
    w = np.tile(col_weight, rows)

    def weighted(blocks):
        y = dequantize(blocks, qtype).reshape(rows, cols)
        return float(np.sum(col_weight * (y.astype(np.float64) - x) ** 2))

    plain = weighted(cpp_quant(probe, tmp_path, qtype, x.ravel()))
    imatrix = cpp_quant_weighted(probe, tmp_path, qtype, x.ravel(), w)
    assert_bits_equal(cpp_dequant(probe, tmp_path, qtype, imatrix), dequantize(imatrix, qtype), qtype.name)
    # Measured: IQ4_XS 0.49x, IQ3_S 0.30x the error without the weights.
    assert weighted(imatrix) < 0.7 * plain, f"{qtype.name}: weighted error {weighted(imatrix):.1f} vs {plain:.1f}"


def test_probe_rejects_importance_for_k_quants(probe, tmp_path):
    x = np.zeros(256, dtype=np.float32)
    (tmp_path / "k.in").write_bytes(x.tobytes())
    (tmp_path / "k.w").write_bytes(x.tobytes())
    proc = subprocess.run([probe, "quant", "q4_K", str(tmp_path / "k.in"), str(tmp_path / "k.out"), str(tmp_path / "k.w")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "has no importance-weighted quantizer" in proc.stderr
