"""ferry convert and ferry inspect, checked with the PyPI gguf package (GGUFReader and its dequantizers)
on tiny random glm5_next checkpoints made with numpy (glm5_checkpoint.py), on the transformers-made
fixtures of tests/fixtures/glm5, and on an FP8 block-scaled checkpoint."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize

import glm5_checkpoint as ck

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "glm5"

QTYPE = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16, "bf16": GGMLQuantizationType.BF16,
         "q8_0": GGMLQuantizationType.Q8_0, "q4_k": GGMLQuantizationType.Q4_K, "q5_k": GGMLQuantizationType.Q5_K,
         "q6_k": GGMLQuantizationType.Q6_K, "iq4_xs": GGMLQuantizationType.IQ4_XS, "iq3_s": GGMLQuantizationType.IQ3_S}
BLOCK = {"q8_0": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256, "iq4_xs": 256, "iq3_s": 256}
# Largest RMS error of a quantized tensor relative to the RMS of its values (the reference quantizers
# on Gaussian data land near a third of these; IQ3_S near 0.17, see test_quants.py).
RMS_TOL = {"q8_0": 0.01, "q6_k": 0.03, "q5_k": 0.06, "q4_k": 0.12, "iq4_xs": 0.12, "iq3_s": 0.25}


def run(*args, check=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}:\n{p.stderr}")
    return p


def make_checkpoint(path: pathlib.Path, text: dict, dtype="BF16", spelling="checkpoint", nextn=0, seed=0,
                    shards=1, **top) -> dict[str, np.ndarray]:
    """Writes config.json and the safetensors; returns the tensors' values as stored (float32)."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hf = ck.hf_tensors(text, rng, spelling=spelling, nextn=nextn)
    (path / "config.json").write_text(json.dumps(ck.full_config(text, **top)))
    names = list(hf)
    if shards == 1:
        ck.write_safetensors(path / "model.safetensors", {n: ck.stored(hf[n], dtype) for n in names})
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            ck.write_safetensors(path / fname, {n: ck.stored(hf[n], dtype) for n in part})
            weight_map.update({n: fname for n in part})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {n: ck.value_as_stored(v, dtype) for n, v in hf.items()}


def expected_type(name: str, shape_ne: list[int], qtype: str, rules=()) -> str:
    """rules: (regex, type) pairs, the first match wins (--tensor-type)."""
    import re
    if ck.is_small_state(name):
        return "f32"
    for pattern, t in rules:
        if re.search(pattern, name):
            qtype = t
            break
    else:
        if name == "output.weight" and qtype in ("q4_k", "q5_k", "iq4_xs", "iq3_s"):
            qtype = "q6_k"  # the output head of 4- and 5-bit files, as llama.cpp's
    if qtype in BLOCK and shape_ne[0] % BLOCK[qtype] != 0:
        return "q8_0" if qtype != "q8_0" and shape_ne[0] % 32 == 0 else "f16"
    return qtype


def check_file(gguf_path: pathlib.Path, expected: dict[str, np.ndarray], qtype: str, rules=()) -> GGUFReader:
    reader = GGUFReader(str(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    assert sorted(tensors) == sorted(expected)
    for name, want in expected.items():
        t = tensors[name]
        ne = [int(x) for x in t.shape]
        assert ne == list(reversed(want.shape)), name
        wtype = expected_type(name, ne, qtype, rules)
        assert t.tensor_type == QTYPE[wtype], f"{name}: {t.tensor_type.name}, expected {wtype}"
        got = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(want.shape)
        if wtype == "f32":
            np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=name)
        elif wtype == "f16":
            np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32), err_msg=name)
        elif wtype == "bf16":
            np.testing.assert_array_equal(got, ck.bf16_value(want), err_msg=name)
        else:
            rms = np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2))
            assert rms < RMS_TOL[wtype], f"{name}: relative RMS error {rms:.4f} for {wtype}"
    return reader


def field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny checkpoint (BF16, checkpoint spelling, with an MTP block) shared by the type tests."""
    d = tmp_path_factory.mktemp("tiny_bf16")
    text = ck.tiny_text_config(num_nextn_predict_layers=1)
    values = make_checkpoint(d, text, dtype="BF16", nextn=1)
    return d, text, ck.expected_gguf(text, values, nextn=1)


@pytest.mark.parametrize("qtype", ["f32", "f16", "bf16", "q8_0", "q4_k", "q5_k", "q6_k"])
def test_convert_types(ferry_bin, tiny, tmp_path, qtype):
    d, text, expected = tiny
    out = tmp_path / "out.gguf"
    p = run(ferry_bin, "convert", d, out, "--type", qtype)
    assert "skipped 2 vision-tower tensors" in p.stderr
    reader = check_file(out, expected, qtype)
    assert field(reader, "general.architecture") == "glm5next"
    assert field(reader, "general.quantization_version") == 2
    assert field(reader, "general.file_type") == {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_k": 14,
                                                   "q5_k": 16, "q6_k": 18}[qtype]
    assert field(reader, "glm5next.block_count") == 5
    assert field(reader, "glm5next.nextn_predict_layers") == 1
    assert list(field(reader, "glm5next.attention.head_count_kv")) == [0, 0, 0, 1, 1]
    assert field(reader, "glm5next.attention.indexer.kpool") == 4
    assert field(reader, "glm5next.attention.indexer.block_size") == 4
    assert field(reader, "glm5next.leading_dense_block_count") == 1
    assert field(reader, "glm5next.attention.key_length_mla") == 16
    assert field(reader, "glm5next.attention.value_length_mla") == 24
    assert field(reader, "glm5next.kda.head_dim") == 32
    assert field(reader, "glm5next.ssm.conv_kernel") == 4
    assert field(reader, "glm5next.hyper_connection.count") == 2
    assert list(field(reader, "glm5next.swiglu_clamp_exp")) == [10.0] * 5
    if qtype in ("q4_k", "q5_k", "q6_k"):
        assert "rows of 32 are not a whole number" in p.stderr  # ssm_f_b / ssm_g_b fall back to q8_0
    head_note = f"output.weight: the output head is stored as q6_K in a {qtype[:-1]}K file"
    assert (head_note in p.stderr) == (qtype in ("q4_k", "q5_k")), p.stderr


def test_tied_embedding_is_stored_at_the_heads_type(ferry_bin, tmp_path):
    """A tied checkpoint (no lm_head.weight): output.weight is the embedding, stored as q6_K in a q4_k
    file, and token_embd.weight, which is the head too, takes the head's type: llama.cpp quantizes a
    tied embedding with the output tensor's rules."""
    text = ck.tiny_text_config(tie_word_embeddings=True)
    d = tmp_path / "tied"
    values = make_checkpoint(d, text, dtype="BF16", tie_word_embeddings=True)
    del values["lm_head.weight"]
    ck.write_safetensors(d / "model.safetensors", {n: ck.stored(v, "BF16") for n, v in values.items()})
    expected = ck.expected_gguf(text, dict(values, **{"lm_head.weight": values[ck.PREFIX + "embed_tokens.weight"]}))
    out = tmp_path / "out.gguf"
    p = run(ferry_bin, "convert", d, out, "--type", "q4_k")
    assert "output.weight is the embedding" in p.stderr
    assert "token_embd.weight: the tied embedding is the output head too, stored at the head's type q6_K" in p.stderr
    types = {t.name: t.tensor_type for t in check_file(out, expected, "q4_k", [("^token_embd", "q6_k")]).tensors}
    assert types["output.weight"] == GGMLQuantizationType.Q6_K
    assert types["token_embd.weight"] == GGMLQuantizationType.Q6_K
    # a rule naming the embedding itself still decides it
    run(ferry_bin, "convert", d, out, "--type", "q4_k", "--tensor-type", "^token_embd=q4_k")
    types = {t.name: t.tensor_type for t in GGUFReader(str(out)).tensors}
    assert types["token_embd.weight"] == GGMLQuantizationType.Q4_K


@pytest.mark.parametrize("qtype,head", [("q4_k", "q4_k"), ("q8_0", "q6_k"), ("q4_k", "f32")])
def test_output_type_sets_the_head_alone(ferry_bin, tiny, tmp_path, qtype, head):
    d, text, expected = tiny
    out = tmp_path / "out.gguf"
    p = run(ferry_bin, "convert", d, out, "--type", qtype, "--output-type", head)
    assert "the output head is stored as" not in p.stderr
    types = {t.name: t.tensor_type for t in GGUFReader(str(out)).tensors}
    assert types["output.weight"] == QTYPE[head]
    assert types["token_embd.weight"] == QTYPE[qtype]


def test_tensor_type_rules_and_recipe(ferry_bin, tiny, tmp_path):
    """--tensor-type rules come first, then the recipe's, the first match wins; IQ types are checked
    through gguf-py's dequantizers; rows that are not whole blocks fall back as with --type."""
    d, text, expected = tiny
    recipe = tmp_path / "mix.recipe"
    recipe.write_text("# experts: 3-bit gate/up, 4-bit down\nffn_(gate|up)_exps=iq3_s\n"
                      "ffn_down_exps = iq4_xs\n\n^blk\\.[0-9]+\\.attn_q\\.=q8_0\n")
    out = tmp_path / "out.gguf"
    p = run(ferry_bin, "convert", d, out, "--type", "q5_k", "--tensor-type", r"blk\.3\.ffn_down_exps=q6_k",
            "--recipe", recipe)
    rules = [(r"blk\.3\.ffn_down_exps", "q6_k"), ("ffn_(gate|up)_exps", "iq3_s"), ("ffn_down_exps", "iq4_xs"),
             (r"^blk\.[0-9]+\.attn_q\.", "q8_0")]
    reader = check_file(out, expected, "q5_k", rules)
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.1.ffn_up_exps.weight"] == GGMLQuantizationType.IQ3_S
    assert types["blk.1.ffn_down_exps.weight"] == GGMLQuantizationType.IQ4_XS
    assert types["blk.3.ffn_down_exps.weight"] == GGMLQuantizationType.Q6_K
    assert types["blk.0.attn_q.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32
    assert p.returncode == 0
    info = json.loads(run(ferry_bin, "inspect", out, "--json").stdout)
    assert info["problems"] == []
    for bad, message in [(["--tensor-type", "attn_q"], "'attn_q' is not REGEX=TYPE"),
                         (["--tensor-type", "attn_q=q3_k"], "names type 'q3_k'"),
                         (["--tensor-type", "attn_(q=q8_0"], "is not a valid regular expression")]:
        p = run(ferry_bin, "convert", d, tmp_path / "bad.gguf", *bad, check=False)
        assert p.returncode == 2 and message in p.stderr, p.stderr
    (tmp_path / "bad.recipe").write_text("ffn_down_exps=iq4_xs\nnot a rule\n")
    p = run(ferry_bin, "convert", d, tmp_path / "bad.gguf", "--recipe", tmp_path / "bad.recipe", check=False)
    assert p.returncode == 2 and "bad.recipe:2: 'not a rule' is not REGEX=TYPE" in p.stderr, p.stderr


@pytest.mark.parametrize("qtype", ["iq4_xs", "iq3_s"])
def test_convert_iq_types(ferry_bin, tiny, tmp_path, qtype):
    d, text, expected = tiny
    out = tmp_path / "out.gguf"
    run(ferry_bin, "convert", d, out, "--type", qtype)
    reader = check_file(out, expected, qtype)
    assert field(reader, "general.file_type") == {"iq4_xs": 30, "iq3_s": 26}[qtype]


def test_newer_transformers_layer_type_spelling(ferry_bin, tmp_path):
    """transformers 5.24 writes indexed_attention for a DSA layer: the same file as before."""
    files = []
    for spelling in ("deepseek_sparse_attention", "indexed_attention"):
        text = ck.tiny_text_config(layer_types=["linear_attention", spelling, "full_attention", "linear_attention"],
                                   mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
        d = tmp_path / spelling
        make_checkpoint(d, text, dtype="BF16")
        out = tmp_path / f"{spelling}.gguf"
        run(ferry_bin, "convert", d, out, "--type", "bf16", "--name", "x")
        files.append(out.read_bytes())
        assert list(field(GGUFReader(str(out)), "glm5next.attention.head_count_kv")) == [0, 1, 1, 0]
    assert files[0] == files[1]


def test_ssm_a_is_minus_exp_a_log_in_f32(ferry_bin, tiny, tmp_path):
    d, text, expected = tiny
    out = tmp_path / "out.gguf"
    run(ferry_bin, "convert", d, out, "--type", "q8_0")
    t = {t.name: t for t in GGUFReader(str(out)).tensors}["blk.1.ssm_a"]
    assert t.tensor_type == GGMLQuantizationType.F32
    np.testing.assert_array_equal(np.asarray(t.data), expected["blk.1.ssm_a"])
    assert (np.asarray(t.data) < 0).all()


def test_module_spelling_sharded_f32_and_keep_f32(ferry_bin, tmp_path):
    text = ck.tiny_text_config(
        layer_types=["deepseek_sparse_attention", "linear_attention", "deepseek_sparse_attention", "linear_attention"],
        mlp_layer_types=["sparse", "dense", "sparse", "sparse"], indexer_types=["full", "full", "shared", "full"])
    d = tmp_path / "ckpt"
    values = make_checkpoint(d, text, dtype="F32", spelling="modules", shards=3)
    expected = ck.expected_gguf(text, values)
    assert "blk.2.indexer.proj.weight" not in expected
    out = tmp_path / "out.gguf"
    run(ferry_bin, "convert", d, out, "--type", "q8_0", "--keep-f32", r"attn_[kv]_b|ffn_down_exps")
    reader = GGUFReader(str(out))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_k_b.weight"] == GGMLQuantizationType.F32
    assert types["blk.2.ffn_down_exps.weight"] == GGMLQuantizationType.F32
    assert types["blk.2.ffn_up_exps.weight"] == GGMLQuantizationType.Q8_0
    assert list(field(reader, "glm5next.feed_forward_types")) == [0, 1, 0, 0]
    assert list(field(reader, "glm5next.attention.indexer.types")) == [1, 1, 0, 1]
    # values: everything F32 by --type f32
    out32 = tmp_path / "out32.gguf"
    run(ferry_bin, "convert", d, out32, "--type", "f32")
    check_file(out32, expected, "f32")


def test_inspect_json_numbers(ferry_bin, tiny, tmp_path):
    d, text, expected = tiny
    out = tmp_path / "out.gguf"
    run(ferry_bin, "convert", d, out, "--type", "q4_k")
    reader = GGUFReader(str(out))
    info = json.loads(run(ferry_bin, "inspect", out, "--json").stdout)
    assert info["architecture"] == "glm5next"
    assert info["problems"] == []
    assert info["tensor_count"] == len(reader.tensors)
    assert info["tensor_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    assert info["file_size"] == out.stat().st_size
    by_type = {}
    for t in reader.tensors:
        e = by_type.setdefault(t.tensor_type.name.lower(), [0, 0])
        e[0] += 1
        e[1] += int(t.n_bytes)
    assert {x["type"].lower(): [x["tensors"], x["bytes"]] for x in info["bytes_by_type"]} == by_type
    experts = [t for t in reader.tensors if "_exps" in t.name]
    assert info["expert_bytes"] == sum(int(t.n_bytes) for t in experts)
    assert info["dense_bytes"] == info["tensor_bytes"] - info["expert_bytes"]
    blocks = info["blocks"]
    assert [(b["attention"], b["ffn"], b["nextn"]) for b in blocks] == [
        ("kda", "dense", False), ("kda", "moe", False), ("kda", "moe", False), ("dsa", "moe", False),
        ("dsa", "moe", True)]
    for b in blocks:
        own = [t for t in reader.tensors if t.name.startswith(f"blk.{b['index']}.")]
        assert b["bytes"] == sum(int(t.n_bytes) for t in own)
        assert b["expert_bytes"] == sum(int(t.n_bytes) for t in own if "_exps" in t.name)
        if b["ffn"] == "moe":
            assert b["bytes_per_expert"] * 4 == b["expert_bytes"]
            assert b["expert_types"] == "q4_K/q4_K/q4_K"
    hp = info["hparams"]
    assert (hp["n_layers"], hp["n_nextn_layers"], hp["index_kpool"], hp["kda_heads"]) == (4, 1, 4, 4)
    assert info["kv_values_per_token"] == 2 * (32 + 2 * 32)
    assert info["kda_state_bytes_per_slot"] == 3 * (4 * 32 * 32 + 3 * 3 * 128) * 4
    text_out = run(ferry_bin, "inspect", out).stdout
    assert "MTP DSA" in text_out and "problems      none" in text_out


def test_inspect_reports_missing_tensors(ferry_bin, tiny, tmp_path):
    d, text, expected = tiny
    out = tmp_path / "out.gguf"
    run(ferry_bin, "convert", d, out, "--type", "f16")
    # Rewrite the file without one tensor, with gguf-py.
    import gguf
    reader = GGUFReader(str(out))
    w = gguf.GGUFWriter(str(tmp_path / "cut.gguf"), "glm5next")
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, list(f.contents()), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vt)
    for t in reader.tensors:
        if t.name != "blk.3.attn_q_b.weight":
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(np.asarray(t.data).shape), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    p = run(ferry_bin, "inspect", tmp_path / "cut.gguf", "--json", check=False)
    assert p.returncode == 1
    info = json.loads(p.stdout)
    assert info["problems"] == ["missing tensor blk.3.attn_q_b.weight {64, 64}"]


def test_fp8_block_scaled_checkpoint(ferry_bin, tmp_path):
    text = ck.tiny_text_config(num_hidden_layers=2, layer_types=["linear_attention", "deepseek_sparse_attention"],
                               mlp_layer_types=["dense", "sparse"], indexer_types=["full", "full"])
    d = tmp_path / "fp8"
    d.mkdir()
    rng = np.random.default_rng(7)
    hf = ck.hf_tensors(text, rng, vision=False)
    block = (16, 24)  # q_lora 64 x hidden 256: 4 x 11 blocks, the last column block partial
    stored, values = {}, {}
    for name, w in hf.items():
        fp8 = w.ndim == 2 and name.endswith("proj.weight") and "embed" not in name
        if fp8:
            codes, scale_inv, deq = ck.fp8_quantize(w, block)
            stored[name] = ("F8_E4M3", codes)
            stored[name + "_scale_inv"] = ("F32", scale_inv)
            values[name] = deq
        else:
            stored[name] = ck.stored(w, "BF16")
            values[name] = ck.bf16_value(w)
    assert any(v[0] == "F8_E4M3" for v in stored.values())
    ck.write_safetensors(d / "model.safetensors", stored)
    cfg = ck.full_config(text, quantization_config={"quant_method": "fp8", "fmt": "e4m3",
                                                    "activation_scheme": "dynamic", "weight_block_size": list(block)})
    (d / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out.gguf"
    run(ferry_bin, "convert", d, out, "--type", "f32")
    check_file(out, ck.expected_gguf(text, values), "f32")

    # A scale of the wrong shape is refused, naming it.
    name = f"{ck.PREFIX}layers.1.self_attn.q_a_proj.weight_scale_inv"
    stored[name] = ("F32", np.ones((2, 2), np.float32))
    ck.write_safetensors(d / "model.safetensors", stored)
    p = run(ferry_bin, "convert", d, tmp_path / "bad.gguf", check=False)
    assert p.returncode == 1
    assert f"scale {name} has shape [2, 2], expected [4, 11]" in p.stderr
    assert not (tmp_path / "bad.gguf").exists()


@pytest.mark.parametrize("case", ["serve_tiny", "dsa_adjacent", "kda_moe_long", "short_decode", "trained_small"])
def test_reference_fixtures(ferry_bin, tmp_path, case):
    """The checkpoints transformers' save_pretrained wrote: every tensor found, values exact at f32
    (trained_small ties its head to the embedding, so it has no lm_head.weight)."""
    src = FIXTURES / case
    cfg = json.loads((src / "config.json").read_text())
    text = cfg["text_config"]
    values = {}
    for name, (dtype, bits) in ck.read_stored(src).items():
        values[name] = bits.astype(np.float32) if dtype == "F32" else (bits.astype(np.uint32) << 16).view(np.float32)
    if text["tie_word_embeddings"]:
        values["lm_head.weight"] = values[ck.PREFIX + "embed_tokens.weight"]
    nextn = 1 if f"{ck.PREFIX}layers.{text['num_hidden_layers']}.eh_proj.weight" in values else 0
    text = dict(text, indexer_types=text.get("indexer_types") or ["full"] * text["num_hidden_layers"])
    expected = ck.expected_gguf(text, values, nextn=nextn)
    out = tmp_path / f"{case}.gguf"
    run(ferry_bin, "convert", src, out, "--type", "f32")
    check_file(out, expected, "f32")
    info = json.loads(run(ferry_bin, "inspect", out, "--json").stdout)
    assert info["problems"] == []
    assert len(info["blocks"]) == text["num_hidden_layers"] + nextn


def test_bad_input_is_named(ferry_bin, tiny, tmp_path):
    d, text, _ = tiny
    out = tmp_path / "out.gguf"

    def fails(src, *extra):
        p = run(ferry_bin, "convert", src, out, *extra, check=False)
        assert p.returncode != 0
        assert not out.exists()
        return p.stderr

    assert "not a directory" in fails(tmp_path / "nope")
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)

    cfg = json.loads((d / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(cfg, model_type="llama")))
    assert "model_type is 'llama', expected 'glm5_next'" in fails(bad)
    (bad / "config.json").unlink()
    assert "config.json: cannot open" in fails(bad)

    # config that disagrees with the tensors
    (bad / "config.json").write_text(json.dumps(dict(cfg, text_config=dict(cfg["text_config"], q_lora_rank=48))))
    err = fails(bad)
    assert "q_a_proj.weight has shape [64, 256], expected [48, 256]" in err

    # a missing tensor
    text = ck.tiny_text_config()
    m = tmp_path / "missing"
    values = make_checkpoint(m, text)
    stored = {n: ck.stored(v, "F32") for n, v in values.items() if not n.endswith("layers.2.mlp.experts.3.up_proj.weight")}
    ck.write_safetensors(m / "model.safetensors", stored)
    assert ("the checkpoint has no model.language_model.layers.2.mlp.experts.3.up_proj.weight "
            "(needed for blk.2.ffn_up_exps.weight)") in fails(m)

    # an unknown dtype, and a tensor the model does not have
    stored = {n: ck.stored(v, "F32") for n, v in values.items()}
    stored[f"{ck.PREFIX}layers.0.self_attn.A_log"] = ("I32", np.zeros(4, np.int32))
    ck.write_safetensors(m / "model.safetensors", stored)
    assert "A_log has dtype I32, expected F32, F16, BF16 or F8_E4M3" in fails(m)
    stored = {n: ck.stored(v, "F32") for n, v in values.items()}
    stored[f"{ck.PREFIX}layers.0.self_attn.rotary.inv_freq"] = ("F32", np.zeros(4, np.float32))
    ck.write_safetensors(m / "model.safetensors", stored)
    assert "layers.0.self_attn.rotary.inv_freq is not part of the glm5_next text model" in fails(m)

    # a truncated shard
    ck.write_safetensors(m / "model.safetensors", {n: ck.stored(v, "F32") for n, v in values.items()})
    blob = (m / "model.safetensors").read_bytes()
    (m / "model.safetensors").write_bytes(blob[:len(blob) // 2])
    assert "run past the end of the data" in fails(m)

    # options
    assert "is not a valid regular expression" in fails(d, "--keep-f32", "(")
    p = run(ferry_bin, "convert", d, out, "--type", "q2_k", check=False)
    assert p.returncode != 0 and "q2_k" in p.stderr


def test_tokenizer_embedded(ferry_bin, tmp_path):
    out = tmp_path / "tok.gguf"
    run(ferry_bin, "convert", FIXTURES / "serve_tiny", out, "--type", "q8_0", "--tokenizer",
        REPO / "tests" / "fixtures" / "tokenizer", "--name", "serve tiny")
    reader = GGUFReader(str(out))
    assert field(reader, "general.name") == "serve tiny"
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert len(field(reader, "tokenizer.ggml.tokens")) == 4096  # padded to the embedding rows
    info = json.loads(run(ferry_bin, "inspect", out, "--json").stdout)
    assert info["tokenizer"]["tokens"] == 4096 and info["tokenizer"]["chat_template_bytes"] > 0
    assert info["problems"] == []
    p = run(ferry_bin, "convert", FIXTURES / "serve_tiny", tmp_path / "x.gguf", "--tokenizer", tmp_path, check=False)
    assert p.returncode != 0 and f"--tokenizer {tmp_path}" in p.stderr
    assert not (tmp_path / "x.gguf").exists()
