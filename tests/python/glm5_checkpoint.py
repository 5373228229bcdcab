"""Tiny random glm5_next checkpoints written with numpy only (no torch, no transformers), and the GGUF
tensors ferry convert must make of them, computed independently of ferry's C++ table.

Names and shapes follow what transformers' save_pretrained writes for Glm5NextForConditionalGeneration
(the released checkpoint's spelling: per-expert weights, q/k/v_conv1d, bare hc_attn_fn, self_attn.A_log)
and, with spelling="modules", the spelling of transformers' own modules (fused 3-D experts, one fused
conv1d, attn_hc.fn, forget_gate.*).
"""
from __future__ import annotations

import json
import pathlib
import struct

import numpy as np

PREFIX = "model.language_model."


def tiny_text_config(**overrides) -> dict:
    cfg = dict(
        model_type="glm5_next_text", vocab_size=320, hidden_size=256, intermediate_size=512,
        moe_intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=0, v_head_dim=24,
        index_n_heads=16, index_head_dim=32, index_topk=8, index_kpool=4, index_kpool_always_select_tail=True,
        linear_num_heads=4, linear_head_dim=32, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
        hc_mult=2, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-5, routed_scaling_factor=2.5,
        norm_topk_prob=True, swiglu_limit=10.0, max_position_embeddings=4096, hidden_act="silu",
        attention_bias=False, tie_word_embeddings=False,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "deepseek_sparse_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        indexer_types=["full"] * 4, num_nextn_predict_layers=0,
    )
    cfg.update(overrides)
    return cfg


def full_config(text: dict, **top) -> dict:
    cfg = {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
           "text_config": text, "vision_config": {"depth": 1, "hidden_size": 32}, "tie_word_embeddings": False}
    cfg.update(top)
    return cfg


def hf_tensors(t: dict, rng: np.random.Generator, spelling: str = "checkpoint", nextn: int = 0,
               vision: bool = True) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as float32 arrays in Hugging Face shapes."""
    D, V, H = t["hidden_size"], t["vocab_size"], t["hc_mult"]
    mix = (2 + H) * H
    nh, qlr, kvlr, nope, vd = t["num_attention_heads"], t["q_lora_rank"], t["kv_lora_rank"], t["qk_nope_head_dim"], t["v_head_dim"]
    kh, khd, K = t["linear_num_heads"], t["linear_head_dim"], t["linear_conv_kernel_dim"]
    di = kh * khd
    ih, idim, kpool = t["index_n_heads"], t["index_head_dim"], t["index_kpool"]
    F, I, E, S = t["intermediate_size"], t["moe_intermediate_size"], t["n_routed_experts"], t["moe_intermediate_size"] * t["n_shared_experts"]
    out: dict[str, np.ndarray] = {}

    def w(name, *shape):
        out[name] = rng.standard_normal(shape).astype(np.float32) * 0.5

    w(PREFIX + "embed_tokens.weight", V, D)
    w(PREFIX + "norm.weight", D)
    w("lm_head.weight", V, D)
    n_layers = t["num_hidden_layers"]
    for il in range(n_layers + nextn):
        p = f"{PREFIX}layers.{il}."
        a = p + "self_attn."
        is_nextn = il >= n_layers
        w(p + "input_layernorm.weight", D)
        w(p + "post_attention_layernorm.weight", D)
        if not is_nextn:
            for site in ("attn", "ffn"):
                if spelling == "modules":
                    w(p + f"{site}_hc.fn", mix, H * D)
                    w(p + f"{site}_hc.base", mix)
                    w(p + f"{site}_hc.scale", 3)
                else:
                    w(p + f"hc_{site}_fn", mix, H * D)
                    w(p + f"hc_{site}_base", mix)
                    w(p + f"hc_{site}_scale", 3)
        kind = "deepseek_sparse_attention" if is_nextn else t["layer_types"][il]
        if kind == "linear_attention":
            for x in "qkv":
                w(a + f"{x}_proj.weight", di, D)
            if spelling == "modules":
                w(a + "conv1d.weight", 3 * di, 1, K)
                fg = a + "forget_gate."
            else:
                for x in "qkv":
                    w(a + f"{x}_conv1d.weight", di, 1, K)
                fg = a
            w(fg + "f_a_proj.weight", khd, D)
            w(fg + "f_b_proj.weight", di, khd)
            w(fg + "dt_bias", di)
            w(fg + "A_log", kh)
            w(a + "b_proj.weight", kh, D)
            w(a + "g_a_proj.weight", khd, D)
            w(a + "g_b_proj.weight", di, khd)
            w(a + "o_norm.weight", khd)
            w(a + "o_proj.weight", D, di)
        else:
            w(a + "q_a_proj.weight", qlr, D)
            w(a + "q_a_layernorm.weight", qlr)
            w(a + "q_b_proj.weight", nh * nope, qlr)
            w(a + "kv_a_proj_with_mqa.weight", kvlr, D)
            w(a + "kv_a_layernorm.weight", kvlr)
            w(a + "kv_b_proj.weight", nh * (nope + vd), kvlr)
            w(a + "o_proj.weight", D, nh * vd)
            if is_nextn or t["indexer_types"][il] == "full":
                ix = a + "indexer."
                w(ix + "wq_b.weight", ih * idim, qlr)
                w(ix + "wk.weight", idim, D)
                w(ix + "k_norm.weight", idim)
                w(ix + "k_norm.bias", idim)
                w(ix + "weights_proj.weight", ih, D)
                w(ix + "index_kpool_compress_ape", kpool, idim)
                w(ix + "index_kpool_compress_gate", idim, D)
        m = p + "mlp."
        dense = (not is_nextn) and t["mlp_layer_types"][il] == "dense"
        if dense:
            w(m + "gate_proj.weight", F, D)
            w(m + "up_proj.weight", F, D)
            w(m + "down_proj.weight", D, F)
        else:
            w(m + "gate.weight", E, D)
            w(m + "gate.e_score_correction_bias", E)
            if spelling == "modules":
                w(m + "experts.gate_up_proj", E, 2 * I, D)
                w(m + "experts.down_proj", E, D, I)
            else:
                for e in range(E):
                    w(m + f"experts.{e}.gate_proj.weight", I, D)
                    w(m + f"experts.{e}.up_proj.weight", I, D)
                    w(m + f"experts.{e}.down_proj.weight", D, I)
            w(m + "shared_experts.gate_proj.weight", S, D)
            w(m + "shared_experts.up_proj.weight", S, D)
            w(m + "shared_experts.down_proj.weight", D, S)
        if is_nextn:
            w(p + "eh_proj.weight", D, 2 * D)
            w(p + "enorm.weight", D)
            w(p + "hnorm.weight", D)
            w(p + "shared_head.norm.weight", D)
    if vision:
        w("model.visual.blocks.0.attn.qkv.weight", 96, 32)
        w("model.visual.merger.proj.weight", 32, 32)
    return out


SMALL_STATE = ("norm.weight", "norm.bias", "hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base",
               "hc_ffn_scale", "ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v", "ssm_a", "ssm_dt.bias", "indexer.proj",
               "indexer_compressor_ape", "ffn_gate_inp", "exp_probs_b", "nextn.enorm", "nextn.hnorm")


def is_small_state(gguf_name: str) -> bool:
    return any(s in gguf_name for s in SMALL_STATE)


def expected_gguf(t: dict, hf: dict[str, np.ndarray], nextn: int = 0) -> dict[str, np.ndarray]:
    """The GGUF tensors (numpy arrays in GGUF order: shape is the ggml dims reversed) ferry must write."""
    H = t["hc_mult"]
    nh, nope, vd = t["num_attention_heads"], t["qk_nope_head_dim"], t["v_head_dim"]
    I, E = t["moe_intermediate_size"], t["n_routed_experts"]
    K = t["linear_conv_kernel_dim"]
    di = t["linear_num_heads"] * t["linear_head_dim"]

    def get(*names):
        for n in names:
            if n in hf:
                return hf[n]
        raise KeyError(names)

    out = {"token_embd.weight": hf[PREFIX + "embed_tokens.weight"], "output_norm.weight": hf[PREFIX + "norm.weight"],
           "output.weight": hf["lm_head.weight"]}
    n_layers = t["num_hidden_layers"]
    for il in range(n_layers + nextn):
        p, b = f"{PREFIX}layers.{il}.", f"blk.{il}."
        a = p + "self_attn."
        is_nextn = il >= n_layers
        out[b + "attn_norm.weight"] = hf[p + "input_layernorm.weight"]
        out[b + "ffn_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
        if not is_nextn:
            for site in ("attn", "ffn"):
                for part in ("fn", "base", "scale"):
                    out[b + f"hc_{site}_{part}.weight"] = get(p + f"hc_{site}_{part}", p + f"{site}_hc.{part}")
        kind = "deepseek_sparse_attention" if is_nextn else t["layer_types"][il]
        if kind == "linear_attention":
            for x in "qkv":
                out[b + f"attn_{x}.weight"] = hf[a + f"{x}_proj.weight"]
            for i, x in enumerate("qkv"):
                conv = hf[a + f"{x}_conv1d.weight"] if a + f"{x}_conv1d.weight" in hf else hf[a + "conv1d.weight"][i * di:(i + 1) * di]
                out[b + f"ssm_conv1d_{x}.weight"] = conv.reshape(1, di, 1, K)
            out[b + "ssm_f_a.weight"] = get(a + "f_a_proj.weight", a + "forget_gate.f_a_proj.weight")
            out[b + "ssm_f_b.weight"] = get(a + "f_b_proj.weight", a + "forget_gate.f_b_proj.weight")
            out[b + "ssm_g_a.weight"] = hf[a + "g_a_proj.weight"]
            out[b + "ssm_g_b.weight"] = hf[a + "g_b_proj.weight"]
            out[b + "ssm_beta.weight"] = hf[a + "b_proj.weight"]
            a_log = get(a + "A_log", a + "forget_gate.A_log")
            out[b + "ssm_a"] = (-np.exp(a_log.astype(np.float64))).astype(np.float32)
            out[b + "ssm_dt.bias"] = get(a + "dt_bias", a + "forget_gate.dt_bias")
            out[b + "ssm_norm.weight"] = hf[a + "o_norm.weight"]
            out[b + "attn_output.weight"] = hf[a + "o_proj.weight"]
        else:
            out[b + "attn_q_a.weight"] = hf[a + "q_a_proj.weight"]
            out[b + "attn_q_a_norm.weight"] = hf[a + "q_a_layernorm.weight"]
            out[b + "attn_q_b.weight"] = hf[a + "q_b_proj.weight"]
            out[b + "attn_kv_a_mqa.weight"] = hf[a + "kv_a_proj_with_mqa.weight"]
            out[b + "attn_kv_a_norm.weight"] = hf[a + "kv_a_layernorm.weight"]
            kvb = hf[a + "kv_b_proj.weight"].reshape(nh, nope + vd, -1)
            out[b + "attn_k_b.weight"] = np.ascontiguousarray(kvb[:, :nope, :].transpose(0, 2, 1))
            out[b + "attn_v_b.weight"] = np.ascontiguousarray(kvb[:, nope:, :])
            out[b + "attn_output.weight"] = hf[a + "o_proj.weight"]
            if is_nextn or t["indexer_types"][il] == "full":
                ix = a + "indexer."
                out[b + "indexer.attn_q_b.weight"] = hf[ix + "wq_b.weight"]
                out[b + "indexer.attn_k.weight"] = hf[ix + "wk.weight"]
                out[b + "indexer.k_norm.weight"] = hf[ix + "k_norm.weight"]
                out[b + "indexer.k_norm.bias"] = hf[ix + "k_norm.bias"]
                out[b + "indexer.proj.weight"] = hf[ix + "weights_proj.weight"]
                out[b + "indexer_compressor_gate.weight"] = hf[ix + "index_kpool_compress_gate"]
                out[b + "indexer_compressor_ape.weight"] = hf[ix + "index_kpool_compress_ape"]
        m = p + "mlp."
        if (not is_nextn) and t["mlp_layer_types"][il] == "dense":
            for r in ("gate", "up", "down"):
                out[b + f"ffn_{r}.weight"] = hf[m + f"{r}_proj.weight"]
        else:
            out[b + "ffn_gate_inp.weight"] = hf[m + "gate.weight"]
            out[b + "exp_probs_b.bias"] = hf[m + "gate.e_score_correction_bias"]
            if m + "experts.gate_up_proj" in hf:
                gu = hf[m + "experts.gate_up_proj"]
                out[b + "ffn_gate_exps.weight"] = np.ascontiguousarray(gu[:, :I, :])
                out[b + "ffn_up_exps.weight"] = np.ascontiguousarray(gu[:, I:, :])
                out[b + "ffn_down_exps.weight"] = hf[m + "experts.down_proj"]
            else:
                for r in ("gate", "up", "down"):
                    out[b + f"ffn_{r}_exps.weight"] = np.stack([hf[m + f"experts.{e}.{r}_proj.weight"] for e in range(E)])
            for r in ("gate", "up", "down"):
                out[b + f"ffn_{r}_shexp.weight"] = hf[m + f"shared_experts.{r}_proj.weight"]
        if is_nextn:
            out[b + "nextn.eh_proj.weight"] = hf[p + "eh_proj.weight"]
            out[b + "nextn.enorm.weight"] = hf[p + "enorm.weight"]
            out[b + "nextn.hnorm.weight"] = hf[p + "hnorm.weight"]
            out[b + "nextn.shared_head_norm.weight"] = hf[p + "shared_head.norm.weight"]
    return out


# ---- safetensors and number formats, by hand ------------------------------------------------------------

def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(a: np.ndarray) -> np.ndarray:
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def _e4m3_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp.astype(np.float64) - 7))
    val = sign * val
    val[(codes & 0x7F) == 0x7F] = np.nan
    return val


E4M3 = _e4m3_table()


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """Nearest float8_e4m3fn code of each value (|x| <= 448)."""
    pos = np.arange(0x7F)  # 0x00..0x7e: the non-negative finite codes, increasing
    vals = E4M3[pos]
    ax = np.abs(x).astype(np.float64)
    i = np.clip(np.searchsorted(vals, ax), 1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    code = np.where(ax - lo <= hi - ax, i - 1, i).astype(np.uint8)
    return np.where(x < 0, code | 0x80, code).astype(np.uint8)


def fp8_quantize(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(e4m3 codes, weight_scale_inv [ceil(r/b0), ceil(c/b1)], the dequantized weight)."""
    r, c = w.shape
    b0, b1 = block
    sr, sc = -(-r // b0), -(-c // b1)
    scale_inv = np.zeros((sr, sc), np.float32)
    codes = np.zeros((r, c), np.uint8)
    deq = np.zeros((r, c), np.float32)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            s = np.float32(max(np.abs(blk).max(), 1e-12) / 448.0)
            q = e4m3_encode(blk / s)
            scale_inv[i, j] = s
            codes[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = q
            deq[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = (E4M3[q] * np.float64(s)).astype(np.float32)
    return codes, scale_inv, deq


def write_safetensors(path: pathlib.Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """tensors: name -> (dtype name, array of the stored bits or values)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_stored(checkpoint: pathlib.Path) -> dict[str, tuple[str, np.ndarray]]:
    """A checkpoint directory's tensors as stored (dtype name, array of the stored bits), from its
    model.safetensors or the shards its model.safetensors.index.json names."""
    index = checkpoint / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    tensors = {}
    for name in files:
        raw = (checkpoint / name).read_bytes()
        n = int.from_bytes(raw[:8], "little")
        for key, info in json.loads(raw[8:8 + n]).items():
            if key == "__metadata__":
                continue
            a, b = info["data_offsets"]
            bits = np.frombuffer(raw[8 + n + a:8 + n + b], {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[info["dtype"]])
            tensors[key] = (info["dtype"], bits.reshape(info["shape"]))
    return tensors


def stored(arr: np.ndarray, dtype: str) -> tuple[str, np.ndarray]:
    if dtype == "F32":
        return "F32", arr.astype(np.float32)
    if dtype == "F16":
        return "F16", arr.astype(np.float16)
    if dtype == "BF16":
        return "BF16", bf16_bits(arr)
    raise ValueError(dtype)


def value_as_stored(arr: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return arr.astype(np.float32)
    if dtype == "F16":
        return arr.astype(np.float16).astype(np.float32)
    return bf16_value(arr)


def fan_in_scaled(hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """hf_tensors' values rescaled like a network's initialisation: matrices to std 1/sqrt(fan_in),
    norm weights around 1. The 0.5-scaled values are fine for layout checks but saturate a forward
    pass of a model 256 wide; quantized-vs-f32 figures need activations of sane size."""
    out = {}
    for name, v in hf.items():
        if v.ndim >= 2:
            out[name] = (v / 0.5 / np.sqrt(v.shape[-1])).astype(np.float32)
        elif "norm" in name:
            out[name] = (1 + 0.2 * v).astype(np.float32)
        else:
            out[name] = v
    return out
