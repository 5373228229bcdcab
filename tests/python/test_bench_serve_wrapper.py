"""tools/bench_serve.sh: it starts ferry serve on the embedded model, runs the benchmark, and the
clean-shutdown row (SIGTERM with a stream running: 503 for new requests, a terminal event for the
stream, exit 0) passes; without that case the wrapper stops the server itself."""
import json
import os
import re
import shlex
import subprocess

from ferry_server import REPO

WRAPPER = REPO / "tools" / "bench_serve.sh"
TINY = ["--prompt", "128", "--warmup-decode", "8", "--window", "16", "--warmup-prompt", "32",
        "--warmup-tokens", "4", "--stop-prompt", "64", "--stop-after", "8", "--shutdown-tail", "64"]


def run_wrapper(ferry_bin, tmp_path, cases):
    out = tmp_path / f"{cases}.json"
    serve = ["--threads", "1", *shlex.split(os.environ.get("FERRY_SERVE_ARGS", ""))]
    p = subprocess.run(["bash", str(WRAPPER), "--ferry", ferry_bin, "--log", str(tmp_path / "serve.log"), *serve,
                        "--", "--cases", cases,
                        "--json", str(out), *TINY], capture_output=True, text=True, timeout=300)
    return p, (json.loads(out.read_text()) if out.exists() else None)


def server_pid(stderr):
    return int(re.search(r"ferry serve \(pid (\d+)\)", stderr).group(1))


def test_the_wrapper_checks_a_clean_shutdown(ferry_bin, tmp_path):
    p, data = run_wrapper(ferry_bin, tmp_path, "warm,shutdown")
    assert p.returncode == 0, p.stdout + p.stderr
    sd = data["results"]["shutdown"]
    assert sd["ok"] is True and sd["exit_code"] == 0, sd
    assert sd["late_request_status"] == 503 and sd["stream_terminal"] and sd["stream_finish"] == "length"
    assert re.search(r"\| clean shutdown \| pass \(exit 0, \d+ ms after SIGTERM\) \|", p.stdout)
    assert "ferry serve exited with 0" in p.stderr
    assert not os.path.exists(f"/proc/{server_pid(p.stderr)}")


def test_the_wrapper_stops_the_server_when_the_benchmark_does_not(ferry_bin, tmp_path):
    p, data = run_wrapper(ferry_bin, tmp_path, "warm")
    assert p.returncode == 0, p.stdout + p.stderr
    assert data["results"]["warm"]["ok"] is True
    assert "| clean shutdown |" not in p.stdout
    assert "ferry serve exited with 0" in p.stderr
    assert not os.path.exists(f"/proc/{server_pid(p.stderr)}")
