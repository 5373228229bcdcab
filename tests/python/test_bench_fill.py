"""`ferry bench --fill random`: a depth reached by drawing the slot's state instead of a prefill (deep
decode without the prefill's minutes), said in every test name and in a warning; prefill stays the
default."""
import subprocess

import pytest

from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "glm5" / "trained_small"


@pytest.fixture(scope="module")
def model(ferry_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("fill") / "trained_small.gguf"
    r = subprocess.run([ferry_bin, "convert", str(FIXTURE), str(out), "--type", "f32", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def bench(ferry_bin, model, *args):
    return subprocess.run([ferry_bin, "bench", "--model", str(model), "--backend", "cpu", "-p", "8", "-n", "4", "-r", "1",
                           "-d", "0,300", *args], capture_output=True, text=True, timeout=300)


def test_random_fill_is_labelled_and_runs(ferry_bin, model):
    r = bench(ferry_bin, model, "--fill", "random")
    assert r.returncode == 0, r.stderr
    assert "tg4 @ d300 rnd" in r.stdout and "pp8 @ d300 rnd" in r.stdout, r.stdout
    assert "tg4 @ d0 " in r.stdout  # depth 0 is no fill at all
    assert "DRAWN at random" in r.stderr


def test_prefill_stays_the_default_and_a_bad_fill_is_refused(ferry_bin, model):
    r = bench(ferry_bin, model)
    assert r.returncode == 0, r.stderr
    assert "tg4 @ d300 " in r.stdout and "rnd" not in r.stdout
    r = bench(ferry_bin, model, "--fill", "zeros")
    assert r.returncode != 0 and "--fill" in r.stderr, r.stderr
