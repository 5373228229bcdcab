"""`ferry serve` options: every option settable in a TOML file; an unknown or invalid option fails
start-up with a message naming it."""
import json
import pathlib
import shutil
import subprocess

import pytest
from ferry_server import FerryServer

SHAPE = str(pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "glm5" / "serve_tiny" / "config.json")


def start_fails(ferry_bin, *args):
    r = subprocess.run([ferry_bin, "serve", *args], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    return r.stderr + r.stdout


def test_toml_file_sets_options(ferry_bin, tmp_path):
    config = tmp_path / "ferry.toml"
    config.write_text('slots = 2\nmodel-id = "from-toml"\nprefill-chunk = 64\nqueue-limit = 5\n'
                      'max-body = "1MiB"\ntemperature = 0.0\n')
    s = FerryServer(ferry_bin, "--config", str(config))
    try:
        assert s.client().models.list().data[0].id == "from-toml"
        assert len(json.loads(s.get("/slots")[1])["slots"]) == 2
        assert json.loads(s.get("/slots")[1])["queue_limit"] == 5
    finally:
        assert s.stop() == 0


def test_command_line_wins_over_the_file(ferry_bin, tmp_path):
    config = tmp_path / "ferry.toml"
    config.write_text('model-id = "from-toml"\n')
    s = FerryServer(ferry_bin, "--config", str(config), "--model-id", "from-cli")
    try:
        assert s.client().models.list().data[0].id == "from-cli"
    finally:
        assert s.stop() == 0


def test_unknown_and_invalid_options_fail_with_their_name(ferry_bin, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("slotz = 3\n")
    assert "slotz" in start_fails(ferry_bin, "--config", str(config))
    assert "--frobnicate" in start_fails(ferry_bin, "--frobnicate", "1")
    assert "--slots = 0" in start_fails(ferry_bin, "--slots", "0")
    assert "--max-body" in start_fails(ferry_bin, "--max-body", "lots")
    assert "--top-p" in start_fails(ferry_bin, "--top-p", "1.5")
    assert "--backend = tpu" in start_fails(ferry_bin, "--backend", "tpu")
    assert "no-such.gguf" in start_fails(ferry_bin, "--model", str(tmp_path / "no-such.gguf"))


def test_port_in_use_is_named(ferry_bin):
    s = FerryServer(ferry_bin)
    try:
        port = s.base.rsplit(":", 1)[1]
        assert f"127.0.0.1:{port}" in start_fails(ferry_bin, "--port", port)
    finally:
        assert s.stop() == 0


def test_a_file_that_is_not_a_model_fails_after_listening(ferry_bin, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 1000)
    out = start_fails(ferry_bin, "--port", "0", "--model", str(bad))
    assert "listening on" in out  # /health answered "loading" meanwhile
    assert "cannot serve" in out and str(bad) in out


def test_synthetic_weights_need_a_gpu_and_say_so_before_listening(ferry_bin, tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("on a GPU machine --synthetic serves (the GPU bundle's smoke check)")
    for backend in ("cuda", "auto"):
        out = start_fails(ferry_bin, "--synthetic", SHAPE, "--backend", backend, "--port", "0")
        assert "--synthetic needs a GPU: backend cuda: " in out, out
        assert "listening" not in out
    assert "--synthetic needs a GPU: backend cuda: " in start_fails(ferry_bin, "--synthetic", SHAPE)  # default: auto
    assert "--backend = cpu: expected cuda or auto with --synthetic" in start_fails(
        ferry_bin, "--synthetic", SHAPE, "--backend", "cpu")
    assert f"--synthetic = {tmp_path / 'none.json'}" in start_fails(
        ferry_bin, "--synthetic", str(tmp_path / "none.json"), "--backend", "cuda")
    assert "--tokenizer = " in start_fails(ferry_bin, "--tokenizer", SHAPE)
    recipe = pathlib.Path(__file__).resolve().parents[2] / "model" / "glm5" / "recipes" / "maya-l.recipe"
    assert "--recipe = " in start_fails(ferry_bin, "--recipe", str(recipe))  # only with --synthetic


def test_synthetic_recipe_errors_name_the_line(ferry_bin, tmp_path):
    """A recipe is read before the GPU is asked for, so its errors come first, naming file and line."""
    bad = tmp_path / "bad.recipe"
    bad.write_text("# mix\nffn_down_exps=q3_k\n")
    for command in (["serve", "--port", "0"], ["bench"]):
        r = subprocess.run([ferry_bin, *command, "--synthetic", SHAPE, "--recipe", str(bad), "--backend", "cuda"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, r.stderr
        assert f"{bad}:2: 'ffn_down_exps=q3_k' names type 'q3_k'" in r.stderr, r.stderr


def test_toml_sections_name_where_an_option_belongs(ferry_bin, tmp_path):
    config = tmp_path / "ferry.toml"
    config.write_text('[model]\nmodel-id = "sectioned"\n[slots]\nslots = 2\n[server]\nport = 0\n')
    s = FerryServer(ferry_bin, "--config", str(config))
    try:
        assert s.client().models.list().data[0].id == "sectioned"
        assert len(json.loads(s.get("/slots")[1])["slots"]) == 2
    finally:
        assert s.stop() == 0
    config.write_text('[model]\nslots = 2\n')
    assert "'model.slots' belongs in [slots] or at the top level" in start_fails(ferry_bin, "--config", str(config))


def test_reasoning_effort_default_applies_to_requests_that_name_none(ferry_bin):
    from ferry_server import tokenizer
    s = FerryServer(ferry_bin, "--reasoning-effort", "high")
    try:
        def prompt(**extra):
            status, body = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 1, "return_token_ids": True, **extra})
            assert status == 200, body
            return tokenizer().decode(json.loads(body)["prompt_token_ids"], skip_special_tokens=False)
        assert "Reasoning Effort: High" in prompt()
        assert "Reasoning Effort: Low" in prompt(reasoning_effort="low")  # the request's own wins
    finally:
        assert s.stop() == 0
