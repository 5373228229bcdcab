"""Test-only: a glm5_next safetensors checkpoint -> f32 GGUF with the PyPI gguf package.

An independent spelling of the conversion (`ferry convert` is the product): names and dims follow
model/glm5_tensors.hpp, metadata keys model/glm5_gguf.hpp. Usage: glm5_hf_to_gguf.py CKPT_DIR OUT.gguf [f32|q8_0]  (q8_0: 2-D matrices whose rows are whole
blocks, except the tensors ferry keeps F32: norms, mixers, router, indexer.proj)
"""
import json
import struct
import sys

import numpy as np
import gguf

ARCH = "glm5next"


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        raw = data[b:e]
        if meta["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif meta["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif meta["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            raise ValueError(f"{name}: dtype {meta['dtype']}")
        out[name] = a.reshape(meta["shape"]).astype(np.float32)
    return out


KEEP_F32 = ("norm", "hc_", "ffn_gate_inp", "exp_probs_b", "ssm_", "indexer.proj", "indexer_compressor_ape")


def main(ckpt, out_path, qtype="f32"):
    cfg = json.load(open(f"{ckpt}/config.json"))
    tc = cfg.get("text_config", cfg)
    w = load_safetensors(f"{ckpt}/model.safetensors")
    n_layers = tc["num_hidden_layers"]
    n_nextn = tc.get("num_nextn_predict_layers", 0)
    blocks = n_layers + n_nextn
    lt = tc["layer_types"] + ["deepseek_sparse_attention"] * n_nextn
    mlp = tc["mlp_layer_types"]
    lead = 0
    while lead < n_layers and mlp[lead] == "dense":
        lead += 1

    wr = gguf.GGUFWriter(out_path, ARCH)
    k = lambda s: f"{ARCH}.{s}"
    u32 = lambda s, v: wr.add_uint32(k(s), int(v))
    f32 = lambda s, v: wr.add_float32(k(s), float(v))
    u32("block_count", blocks)
    u32("nextn_predict_layers", n_nextn)
    u32("context_length", tc.get("max_position_embeddings", 4096))
    u32("embedding_length", tc["hidden_size"])
    u32("feed_forward_length", tc["intermediate_size"])
    u32("leading_dense_block_count", lead)
    wr.add_array(k("feed_forward_types"), [1 if t == "dense" else 0 for t in mlp])
    u32("vocab_size", tc["vocab_size"])
    u32("attention.head_count", tc["num_attention_heads"])
    wr.add_array(k("attention.head_count_kv"), [0 if t == "linear_attention" else 1 for t in lt])
    u32("kda.head_count", tc["linear_num_heads"])
    u32("attention.q_lora_rank", tc["q_lora_rank"])
    u32("attention.kv_lora_rank", tc["kv_lora_rank"])
    u32("attention.key_length_mla", tc["qk_nope_head_dim"])
    u32("attention.value_length_mla", tc["v_head_dim"])
    u32("rope.dimension_count", 0)
    f32("attention.layer_norm_rms_epsilon", tc["rms_norm_eps"])
    f32("attention.layer_norm_epsilon", 1e-6)
    u32("ssm.conv_kernel", tc["linear_conv_kernel_dim"])
    u32("kda.head_dim", tc["linear_head_dim"])
    f32("kda.gate_lower_bound", tc["linear_lower_bound"])
    u32("attention.indexer.head_count", tc["index_n_heads"])
    u32("attention.indexer.key_length", tc["index_head_dim"])
    u32("attention.indexer.top_k", tc["index_topk"])
    u32("attention.indexer.kpool", tc["index_kpool"])
    wr.add_bool(k("attention.indexer.kpool_select_tail"), bool(tc["index_kpool_always_select_tail"]))
    u32("hyper_connection.count", tc["hc_mult"])
    u32("hyper_connection.sinkhorn_iterations", tc["hc_sinkhorn_iters"])
    f32("hyper_connection.epsilon", tc["hc_eps"])
    u32("expert_count", tc["n_routed_experts"])
    u32("expert_used_count", tc["num_experts_per_tok"])
    u32("expert_feed_forward_length", tc["moe_intermediate_size"])
    u32("expert_shared_count", tc["n_shared_experts"])
    u32("expert_group_count", tc["n_group"])
    u32("expert_group_used_count", tc["topk_group"])
    f32("expert_weights_scale", tc["routed_scaling_factor"])
    wr.add_bool(k("expert_weights_norm"), bool(tc["norm_topk_prob"]))
    u32("expert_gating_func", 2)
    wr.add_array(k("swiglu_clamp_exp"), [float(tc["swiglu_limit"])] * blocks)

    pre = "model.language_model."
    def add(name, a):
        a = np.ascontiguousarray(a, dtype=np.float32)
        if qtype == "q8_0" and a.ndim >= 2 and a.shape[-1] % 32 == 0 and not any(k in name for k in KEEP_F32):
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            wr.add_tensor(name, a)
    add("token_embd.weight", w[pre + "embed_tokens.weight"])
    add("output_norm.weight", w[pre + "norm.weight"])
    add("output.weight", w["lm_head.weight"])
    nh, nope, vd, r = tc["num_attention_heads"], tc["qk_nope_head_dim"], tc["v_head_dim"], tc["kv_lora_rank"]
    for i in range(blocks):
        p, b = f"{pre}layers.{i}.", f"blk.{i}."
        a = p + "self_attn."
        add(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
        add(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        if i < n_layers:
            for site in ("attn", "ffn"):
                for part in ("fn", "base", "scale"):
                    add(f"{b}hc_{site}_{part}.weight", w[f"{p}hc_{site}_{part}"])
        if lt[i] == "linear_attention":
            for x in "qkv":
                add(f"{b}attn_{x}.weight", w[f"{a}{x}_proj.weight"])
                add(f"{b}ssm_conv1d_{x}.weight", w[f"{a}{x}_conv1d.weight"])
            for x in ("f_a", "f_b", "g_a", "g_b"):
                add(f"{b}ssm_{x}.weight", w[f"{a}{x}_proj.weight"])
            add(b + "ssm_beta.weight", w[a + "b_proj.weight"])
            add(b + "ssm_a", -np.exp(w[a + "A_log"].astype(np.float64)))
            add(b + "ssm_dt.bias", w[a + "dt_bias"])
            add(b + "ssm_norm.weight", w[a + "o_norm.weight"])
        else:
            add(b + "attn_q_a.weight", w[a + "q_a_proj.weight"])
            add(b + "attn_q_a_norm.weight", w[a + "q_a_layernorm.weight"])
            add(b + "attn_q_b.weight", w[a + "q_b_proj.weight"])
            add(b + "attn_kv_a_mqa.weight", w[a + "kv_a_proj_with_mqa.weight"])
            add(b + "attn_kv_a_norm.weight", w[a + "kv_a_layernorm.weight"])
            kvb = w[a + "kv_b_proj.weight"].reshape(nh, nope + vd, r)
            add(b + "attn_k_b.weight", kvb[:, :nope, :].transpose(0, 2, 1))
            add(b + "attn_v_b.weight", kvb[:, nope:, :])
            ix = a + "indexer."
            add(b + "indexer.attn_q_b.weight", w[ix + "wq_b.weight"])
            add(b + "indexer.attn_k.weight", w[ix + "wk.weight"])
            add(b + "indexer.k_norm.weight", w[ix + "k_norm.weight"])
            add(b + "indexer.k_norm.bias", w[ix + "k_norm.bias"])
            add(b + "indexer.proj.weight", w[ix + "weights_proj.weight"])
            add(b + "indexer_compressor_gate.weight", w[ix + "index_kpool_compress_gate"])
            add(b + "indexer_compressor_ape.weight", w[ix + "index_kpool_compress_ape"])
        add(b + "attn_output.weight", w[a + "o_proj.weight"])
        m = p + "mlp."
        if i < n_layers and mlp[i] == "dense":
            for x in ("gate", "up", "down"):
                add(f"{b}ffn_{x}.weight", w[f"{m}{x}_proj.weight"])
        else:
            add(b + "ffn_gate_inp.weight", w[m + "gate.weight"])
            add(b + "exp_probs_b.bias", w[m + "gate.e_score_correction_bias"])
            for x in ("gate", "up", "down"):
                add(f"{b}ffn_{x}_exps.weight",
                    np.stack([w[f"{m}experts.{e}.{x}_proj.weight"] for e in range(tc["n_routed_experts"])]))
                add(f"{b}ffn_{x}_shexp.weight", w[f"{m}shared_experts.{x}_proj.weight"])
        if i >= n_layers:
            add(b + "nextn.eh_proj.weight", w[p + "eh_proj.weight"])
            add(b + "nextn.enorm.weight", w[p + "enorm.weight"])
            add(b + "nextn.hnorm.weight", w[p + "hnorm.weight"])
            add(b + "nextn.shared_head_norm.weight", w[p + "shared_head.norm.weight"])
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
