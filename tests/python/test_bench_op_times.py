"""`ferry bench --op-times` and `--kernel-times`: the per-op breakdown of the timed prefill steps and the
per-kernel records of the timed decode steps are CUDA-stage features; on the CPU backend the flags are
accepted and say that nothing was timed (the breakdowns themselves are checked by the cuda gtests
OpTimesTest and KernelTimes)."""
import subprocess

import pytest

from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "glm5" / "trained_small"


@pytest.fixture(scope="module")
def model(ferry_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("op_times") / "trained_small.gguf"
    r = subprocess.run([ferry_bin, "convert", str(FIXTURE), str(out), "--type", "f32", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def bench(ferry_bin, model, *args):
    return subprocess.run([ferry_bin, "bench", "--model", str(model), "--backend", "cpu", "-p", "8", "-n", "2", "-r", "1",
                           *args], capture_output=True, text=True, timeout=300)


def test_op_times_on_the_cpu_backend_says_nothing_was_timed(ferry_bin, model):
    r = bench(ferry_bin, model, "--op-times")
    assert r.returncode == 0, r.stderr
    assert "pp8 @ d0" in r.stdout, r.stdout
    assert "--op-times: no CUDA stage, nothing timed" in r.stdout, r.stdout


def test_kernel_times_on_the_cpu_backend_says_nothing_was_recorded(ferry_bin, model):
    r = bench(ferry_bin, model, "--kernel-times")
    assert r.returncode == 0, r.stderr
    assert "tg2 @ d0" in r.stdout, r.stdout
    assert "--kernel-times: no CUDA stage, nothing recorded" in r.stdout, r.stdout


def test_without_the_flag_no_breakdown_is_printed(ferry_bin, model):
    r = bench(ferry_bin, model)
    assert r.returncode == 0, r.stderr
    assert "op-times" not in r.stdout and "op group" not in r.stdout, r.stdout
    assert "kernel-times" not in r.stdout, r.stdout


def test_a_timeline_file_without_kernel_times_is_refused(ferry_bin, model, tmp_path):
    r = bench(ferry_bin, model, "--kernel-timeline", str(tmp_path / "t.csv"))
    assert r.returncode != 0, r.stdout
    assert "--kernel-times" in r.stderr, r.stderr
    assert not (tmp_path / "t.csv").exists()
