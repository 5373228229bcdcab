"""The user's two mixes (model/glm5/recipes/maya-l.recipe and q4_k_xl.recipe, see their comments
for the sources) applied with `ferry convert --recipe` to the trained fixture and to a random
glm5_next checkpoint: each converts, loads, and stays close to its f32 conversion
(`ferry eval-ref --compare-to-f32`). Bounds leave room over the figures measured when the recipes
were added (in the comments): a few more flipped near-ties and about twice the KL.

The random model is chaotic under quantization (its MoE routing and DSA pool choices sit close
together, and every flipped choice moves the logits by O(1)): there the bounds guard against gross
breakage, a wrong block layout giving ~1/512 top-1.
"""
from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest

import glm5_checkpoint as ck

REPO = pathlib.Path(__file__).resolve().parents[2]
RECIPES = REPO / "model" / "glm5" / "recipes"
TRAINED = REPO / "tests" / "fixtures" / "glm5" / "trained_small"


def run(*args, check=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def random_checkpoint(path: pathlib.Path) -> pathlib.Path:
    """A random glm5_next checkpoint, 256 wide with an MTP block (whole 256-element rows for the IQ
    types wherever the shape allows), and a 260-token window of ids to compare conversions on."""
    text = ck.tiny_text_config(
        vocab_size=512, num_nextn_predict_layers=1, q_lora_rank=256, kv_lora_rank=256, qk_nope_head_dim=64,
        v_head_dim=64, linear_head_dim=64, index_head_dim=32)
    hf = ck.fan_in_scaled(ck.hf_tensors(text, np.random.default_rng(18), nextn=1))
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(ck.full_config(text)))
    ck.write_safetensors(path / "model.safetensors", {n: ck.stored(v, "BF16") for n, v in hf.items()})
    ids = np.random.default_rng(7).integers(0, 512, size=260).tolist()
    window = path / "window.json"
    window.write_text(json.dumps({"name": "random/window", "input_ids": ids[:256], "decode_tokens": ids[256:],
                                  "vocab_size": 512}))
    return window


@pytest.fixture(scope="module")
def converted(ferry_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("recipes")
    random_dir = d / "random"
    windows = {"random": random_checkpoint(random_dir), "train": TRAINED / "window_train.json",
               "heldout": TRAINED / "window_heldout.json"}
    files = {}
    for model, src in (("trained", TRAINED), ("random", random_dir)):
        files[(model, "f32")] = d / f"{model}.f32.gguf"
        run(ferry_bin, "convert", src, files[(model, "f32")], "--type", "f32", "--quiet")
        for recipe in ("maya-l", "q4_k_xl"):
            files[(model, recipe)] = d / f"{model}.{recipe}.gguf"
            run(ferry_bin, "convert", src, files[(model, recipe)], "--recipe", RECIPES / f"{recipe}.recipe", "--quiet")
    return files, windows


# (model, recipe, window) -> (smallest top-1, largest mean KL); measured when the recipes were added:
BOUNDS = {
    ("trained", "maya-l", "train"): (0.87, 0.10),      # 90.31%, 5.14e-2
    ("trained", "maya-l", "heldout"): (0.75, 0.27),    # 79.65%, 1.34e-1
    ("trained", "q4_k_xl", "train"): (0.95, 8e-3),     # 97.09%, 3.83e-3
    ("trained", "q4_k_xl", "heldout"): (0.90, 0.02),   # 93.80%, 9.47e-3
    ("random", "maya-l", "random"): (0.10, 0.62),      # 18.46%, 3.11e-1
    ("random", "q4_k_xl", "random"): (0.40, 0.12),     # 58.85%, 5.89e-2
}


@pytest.mark.parametrize("model,recipe,window", sorted(BOUNDS))
def test_recipe_close_to_f32(ferry_bin, converted, model, recipe, window):
    files, windows = converted
    min_top1, max_kl = BOUNDS[(model, recipe, window)]
    r = run(ferry_bin, "eval-ref", "--model", files[(model, recipe)], "--reference", windows[window],
            "--compare-to-f32", files[(model, "f32")], "--min-top1", min_top1, "--max-kl", max_kl, "--threads", "2",
            check=False)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr


def test_recipes_put_the_types_where_they_say(ferry_bin, converted):
    files, _ = converted
    mixes = {}
    for recipe in ("maya-l", "q4_k_xl"):
        info = json.loads(run(ferry_bin, "inspect", files[("random", recipe)], "--json").stdout)
        assert info["problems"] == []
        # general.file_type names the quantized type holding the most bytes (llama.cpp's "mostly"
        # file types): in this small model the 256-wide experts hold less than the rest
        most = max((t for t in info["bytes_by_type"] if t["type"] != "f32"), key=lambda t: t["bytes"])["type"]
        assert most == {"maya-l": "q5_K", "q4_k_xl": "q8_0"}[recipe]
        assert info["file_type"] == {"q5_K": 16, "q8_0": 7}[most]
        mixes[recipe] = {g["group"]: {t["type"] for t in g["types"]} for g in info["type_mix"]}
    assert mixes["maya-l"]["routed experts: gate, up"] == {"iq3_s"}
    assert mixes["maya-l"]["routed experts: down"] == {"q5_K"}
    assert mixes["maya-l"]["token embedding"] == {"iq4_xs"}
    assert mixes["maya-l"]["output head"] == {"q6_K"}
    assert "f32" in mixes["maya-l"]["KDA projections"]  # ssm_beta
    assert mixes["q4_k_xl"]["routed experts: gate, up"] == {"q4_K"}
    assert mixes["q4_k_xl"]["routed experts: down"] == {"q6_K", "q5_K"}  # block 3 is q6_K, the others q5_K
    assert mixes["q4_k_xl"]["output head"] == {"q8_0"}
