"""Files the llama.cpp family loads: the metadata keys and the tensor list its glm5next loaders read,
pinned against what ferry convert writes, and ferry inspect naming ferry's own extensions (which
those loaders refuse).

The lists below were transcribed (names and types only) from two loaders:
  [L] llama.cpp PR #27754 (`glm5next`), as the peer build of ../shared/peer holds it:
      src/models/glm5next.cpp load_arch_hparams / load_arch_tensors and the generic part of
      llama_model_base::load_hparams in src/llama-model.cpp;
  [M] mainline llama.cpp PR #27773 (`glm5-next`): what its conversion/glm.py (Glm5NextModel.
      set_gguf_parameters, on top of TextModel's generic keys) writes, which is what its loader reads.
Independent of ferry's C++ table: the expected tensors are computed here from the file's own
metadata, the way [L]'s loader derives them (KDA width from attention.head_count, dense FFNs only
for the leading blocks, the NextN block without mHC mixers).
"""
from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "glm5"
TOKENIZER = REPO / "tests" / "fixtures" / "tokenizer"

U32, F32, BOOL, ARR = "u32", "f32", "bool", "array"
# (key suffix, kind, required by the loader)
KEYS_L = [
    # generic hyper-parameters (llama_model_base::load_hparams)
    ("context_length", U32, True), ("embedding_length", U32, True), ("block_count", U32, True),
    ("expert_count", U32, False), ("expert_used_count", U32, False), ("expert_group_count", U32, False),
    ("expert_group_used_count", U32, False), ("feed_forward_length", U32, False), ("attention.head_count", U32, False),
    ("attention.head_count_kv", ARR, False), ("attention.key_length", U32, False),
    ("attention.value_length", U32, False), ("rope.dimension_count", U32, False),
    # glm5next (load_arch_hparams)
    ("attention.layer_norm_rms_epsilon", F32, True), ("attention.layer_norm_epsilon", F32, True),
    ("attention.q_lora_rank", U32, True), ("attention.kv_lora_rank", U32, True),
    ("attention.key_length_mla", U32, True), ("attention.value_length_mla", U32, True),
    ("ssm.conv_kernel", U32, True), ("kda.head_dim", U32, True), ("kda.gate_lower_bound", F32, True),
    ("attention.indexer.head_count", U32, True), ("attention.indexer.key_length", U32, True),
    ("attention.indexer.top_k", U32, True), ("attention.indexer.kpool", U32, True),
    ("hyper_connection.count", U32, True), ("hyper_connection.sinkhorn_iterations", U32, True),
    ("hyper_connection.epsilon", F32, True), ("expert_feed_forward_length", U32, True),
    ("expert_shared_feed_forward_length", U32, False), ("expert_shared_count", U32, True),
    ("leading_dense_block_count", U32, True), ("expert_weights_scale", F32, True), ("expert_weights_norm", BOOL, True),
    ("expert_gating_func", U32, True), ("swiglu_clamp_exp", ARR, False), ("swiglu_clamp_shexp", ARR, False),
    ("nextn_predict_layers", U32, False),
]
# What [M]'s converter writes beyond [L]'s list (its loader reads these with defaults when absent).
KEYS_M_EXTRA = [("vocab_size", U32), ("attention.indexer.kpool_select_tail", BOOL), ("attention.indexer.types", ARR)]
# [M] writes it from index_share_for_mtp_iteration (default false); ferry's MTP does not share the
# indexer, so it writes none, as its loader's default.
KEYS_M_NOT_WRITTEN = ["attention.indexer.index_share_mtp"]
# The vocabulary loader (llama-vocab.cpp) for a gpt2-style BPE tokenizer.
TOKENIZER_KEYS = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id"]
# ferry's own keys, for layouts the family cannot load; absent from files of the released shape.
FERRY_EXTENSIONS = ["kda.head_count", "feed_forward_types"]

KIND_TYPES = {U32: {GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64},
              F32: {GGUFValueType.FLOAT32}, BOOL: {GGUFValueType.BOOL}, ARR: {GGUFValueType.ARRAY}}


def run(*args, check=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}:\n{p.stderr}")
    return p


def value(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def loader_tensors(reader: GGUFReader, arch: str) -> dict[str, tuple[list[int], bool]]:
    """The tensors [L]'s load_arch_tensors creates: name -> (ggml dims, required)."""
    k = lambda s: value(reader, f"{arch}.{s}")  # noqa: E731
    n_layer_all = k("block_count")
    nextn = k("nextn_predict_layers") if f"{arch}.nextn_predict_layers" in reader.fields else 0
    n_layer = n_layer_all - nextn
    n_embd, n_head = k("embedding_length"), k("attention.head_count")
    n_vocab = len(value(reader, "tokenizer.ggml.tokens")) if "tokenizer.ggml.tokens" in reader.fields else k("vocab_size")
    head_dim, d_conv = k("kda.head_dim"), k("ssm.conv_kernel")
    d_inner = head_dim * n_head  # the KDA width: attention.head_count heads (kda.head_count is not read)
    q_lora, kv_lora = k("attention.q_lora_rank"), k("attention.kv_lora_rank")
    qk_head, v_head = k("attention.key_length_mla"), k("attention.value_length_mla")
    n_idx, idx_head, kpool = k("attention.indexer.head_count"), k("attention.indexer.key_length"), k("attention.indexer.kpool")
    hc = k("hyper_connection.count")
    hc_dim, hc_mix = hc * n_embd, (2 + hc) * hc
    n_expert, n_ff_exp = k("expert_count"), k("expert_feed_forward_length")
    n_shexp = k("expert_shared_count")
    n_ff_shexp = (k("expert_shared_feed_forward_length") if f"{arch}.expert_shared_feed_forward_length" in reader.fields
                  else n_ff_exp * max(1, n_shexp))
    n_ff = k("feed_forward_length")
    lead = k("leading_dense_block_count")
    kv = list(k("attention.head_count_kv"))
    out = {"token_embd.weight": ([n_embd, n_vocab], True), "output_norm.weight": ([n_embd], True),
           "output.weight": ([n_embd, n_vocab], False)}
    for il in range(n_layer_all):
        p = f"blk.{il}."
        t = {"attn_norm.weight": [n_embd], "ffn_norm.weight": [n_embd]}
        if il < n_layer:
            for site in ("attn", "ffn"):
                t[f"hc_{site}_fn.weight"] = [hc_dim, hc_mix]
                t[f"hc_{site}_base.weight"] = [hc_mix]
                t[f"hc_{site}_scale.weight"] = [3]
        if il < len(kv) and kv[il] == 0:  # a recurrent (KDA) block
            for x in "qkv":
                t[f"attn_{x}.weight"] = [n_embd, d_inner]
                t[f"ssm_conv1d_{x}.weight"] = [d_conv, 1, d_inner, 1]
            t.update({"ssm_f_a.weight": [n_embd, head_dim], "ssm_f_b.weight": [head_dim, d_inner],
                      "ssm_g_a.weight": [n_embd, head_dim], "ssm_g_b.weight": [head_dim, d_inner],
                      "ssm_beta.weight": [n_embd, n_head], "ssm_a": [n_head], "ssm_dt.bias": [d_inner],
                      "ssm_norm.weight": [head_dim], "attn_output.weight": [d_inner, n_embd]})
        else:
            t.update({"attn_q_a.weight": [n_embd, q_lora], "attn_q_a_norm.weight": [q_lora],
                      "attn_q_b.weight": [q_lora, n_head * qk_head], "attn_kv_a_mqa.weight": [n_embd, kv_lora],
                      "attn_kv_a_norm.weight": [kv_lora], "attn_k_b.weight": [qk_head, kv_lora, n_head],
                      "attn_v_b.weight": [kv_lora, v_head, n_head], "attn_output.weight": [n_head * v_head, n_embd],
                      "indexer.k_norm.weight": [idx_head], "indexer.k_norm.bias": [idx_head],
                      "indexer.proj.weight": [n_embd, n_idx], "indexer.attn_k.weight": [n_embd, idx_head],
                      "indexer.attn_q_b.weight": [q_lora, n_idx * idx_head],
                      "indexer_compressor_gate.weight": [n_embd, idx_head],
                      "indexer_compressor_ape.weight": [idx_head, kpool]})
        if il < lead:
            t.update({"ffn_gate.weight": [n_embd, n_ff], "ffn_up.weight": [n_embd, n_ff], "ffn_down.weight": [n_ff, n_embd]})
        else:
            t.update({"ffn_gate_inp.weight": [n_embd, n_expert], "exp_probs_b.bias": [n_expert],
                      "ffn_gate_exps.weight": [n_embd, n_ff_exp, n_expert], "ffn_up_exps.weight": [n_embd, n_ff_exp, n_expert],
                      "ffn_down_exps.weight": [n_ff_exp, n_embd, n_expert],
                      "ffn_gate_shexp.weight": [n_embd, n_ff_shexp], "ffn_up_shexp.weight": [n_embd, n_ff_shexp],
                      "ffn_down_shexp.weight": [n_ff_shexp, n_embd]})
        optional = set()
        if il >= n_layer:
            t.update({"nextn.eh_proj.weight": [2 * n_embd, n_embd], "nextn.enorm.weight": [n_embd],
                      "nextn.hnorm.weight": [n_embd], "nextn.shared_head_norm.weight": [n_embd],
                      "nextn.embed_tokens.weight": [n_embd, n_vocab], "nextn.shared_head_head.weight": [n_embd, n_vocab]})
            optional = {"nextn.embed_tokens.weight", "nextn.shared_head_head.weight"}
        for name, dims in t.items():
            out[p + name] = (dims, name not in optional)
    return out


def trimmed(dims) -> list[int]:
    d = [int(x) for x in dims]
    while len(d) > 1 and d[-1] == 1:
        d.pop()
    return d


def mismatches(reader: GGUFReader, arch: str) -> list[str]:
    """What [L]'s loader would object to: missing required tensors, wrong shapes, tensors it does not use."""
    want = loader_tensors(reader, arch)
    have = {t.name: trimmed(t.shape) for t in reader.tensors}
    out = []
    for name, (dims, required) in want.items():
        if name not in have:
            if required:
                out.append(f"{name} not found")
        elif have[name] != trimmed(dims):
            out.append(f"{name} has wrong shape; expected {dims}, got {have[name]}")
    out += [f"{name} is not used by the loader" for name in have if name not in want]
    return out


@pytest.fixture(scope="module")
def converted(ferry_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("llama_cpp_layout")
    out = {}
    for case in ("kda_moe_long", "serve_tiny", "trained_small", "short_decode", "dsa_adjacent"):
        path = d / f"{case}.gguf"
        vocab = json.loads((FIXTURES / case / "config.json").read_text())["text_config"]["vocab_size"]
        tokenizer = ["--tokenizer", TOKENIZER] if vocab == 4096 else []  # the test tokenizer's size
        run(ferry_bin, "convert", FIXTURES / case, path, "--type", "q8_0", *tokenizer, "--quiet")
        out[case] = path
    return out


@pytest.mark.parametrize("case", ["kda_moe_long", "serve_tiny"])
def test_keys_the_loaders_read_are_written(ferry_bin, converted, case):
    reader = GGUFReader(str(converted[case]))
    arch = value(reader, "general.architecture")
    assert arch == "glm5next"
    has_mtp = any(t.name.startswith("blk.") and ".nextn." in t.name for t in reader.tensors)
    for suffix, kind, required in KEYS_L:
        key = f"{arch}.{suffix}"
        if suffix == "nextn_predict_layers" and not has_mtp:
            assert key not in reader.fields  # 0, the loader's default, goes unwritten
            continue
        # ferry writes every key [L] reads, optional ones included, with the type it reads
        assert key in reader.fields, f"{key} ({'required' if required else 'optional'}) is not written"
        assert reader.fields[key].types[0] in KIND_TYPES[kind], f"{key}: {reader.fields[key].types}"
    for suffix, kind in KEYS_M_EXTRA:
        key = f"{arch}.{suffix}"
        assert key in reader.fields and reader.fields[key].types[0] in KIND_TYPES[kind], key
    for suffix in KEYS_M_NOT_WRITTEN + FERRY_EXTENSIONS:
        assert f"{arch}.{suffix}" not in reader.fields, suffix
    if case == "serve_tiny":  # converted with the test tokenizer
        for key in TOKENIZER_KEYS:
            assert key in reader.fields, key
    blocks = value(reader, f"{arch}.block_count")
    # per-block arrays cover every block, the NextN one included (the published files' 46 entries)
    for suffix in ("attention.head_count_kv", "swiglu_clamp_exp", "swiglu_clamp_shexp"):
        assert len(value(reader, f"{arch}.{suffix}")) == blocks, suffix
    assert value(reader, f"{arch}.rope.dimension_count") == 0
    assert value(reader, f"{arch}.expert_gating_func") == 2
    assert value(reader, f"{arch}.attention.key_length") == value(reader, f"{arch}.attention.kv_lora_rank")


@pytest.mark.parametrize("case", ["kda_moe_long", "serve_tiny"])
def test_tensors_are_what_the_loader_creates(ferry_bin, converted, case):
    reader = GGUFReader(str(converted[case]))
    assert mismatches(reader, "glm5next") == []
    info = json.loads(run(ferry_bin, "inspect", converted[case], "--json").stdout)
    assert info["llama_cpp_compatible"] is True and info["extensions"] == []


@pytest.mark.parametrize("case,key,loader_error", [
    ("trained_small", "kda.head_count", "attn_q.weight has wrong shape; expected [256, 128], got [256, 256]"),
    ("short_decode", "feed_forward_types", "ffn_gate_inp.weight not found"),
    ("dsa_adjacent", "feed_forward_types", "ffn_gate_inp.weight not found"),
])
def test_inspect_flags_ferrys_extensions(ferry_bin, converted, case, key, loader_error):
    reader = GGUFReader(str(converted[case]))
    assert f"glm5next.{key}" in reader.fields
    assert any(loader_error in m for m in mismatches(reader, "glm5next")), mismatches(reader, "glm5next")
    info = json.loads(run(ferry_bin, "inspect", converted[case], "--json").stdout)
    assert info["llama_cpp_compatible"] is False
    assert any(e.startswith(f"glm5next.{key}") for e in info["extensions"]), info["extensions"]
    text = run(ferry_bin, "inspect", converted[case]).stdout
    assert "llama.cpp-family loaders (PR #27754 glm5next, PR #27773 glm5-next, ik_llama.cpp) will refuse" in text
    assert info["problems"] == []  # ferry itself loads it


def test_type_mix_per_group(ferry_bin, tmp_path):
    out = tmp_path / "mix.gguf"
    run(ferry_bin, "convert", FIXTURES / "serve_tiny", out, "--type", "q8_0", "--tensor-type", "ffn_down_exps=f16",
        "--tensor-type", "^blk\\.6\\.=f32", "--quiet")
    info = json.loads(run(ferry_bin, "inspect", out, "--json").stdout)
    mix = {g["group"]: {t["type"]: t["tensors"] for t in g["types"]} for g in info["type_mix"]}
    assert mix["routed experts: down"] == {"f16": 4}  # blocks 2-5 (block 6, the MTP block, is a group of its own)
    # the MTP block is f32 but for its routed down projection, which the first rule took
    assert set(mix["MTP block"]) == {"f32", "f16"}
    assert mix["router"] == {"f32": 8}  # ffn_gate_inp and exp_probs_b of blocks 2-5
    assert sum(g["tensors"] for g in info["type_mix"]) == info["tensor_count"]
    text = run(ferry_bin, "inspect", out).stdout
    assert "routed experts: down" in text and "type mix" in text
