"""GET /health: ok with the backend and slot counts when serving; never behind the API key."""
import json
import os
import pathlib
import time

import pytest

from ferry_server import FerryServer, server  # noqa: F401 (fixture)


def test_ok_when_serving(server):
    status, body = server.get("/health")
    assert status == 200
    h = json.loads(body)
    assert h["status"] == "ok"
    # serve's default backend is auto (cuda where a GPU is visible); FERRY_SERVE_ARGS may force cuda.
    assert h["backend"].startswith("cuda" if "--backend cuda" in os.environ.get("FERRY_SERVE_ARGS", "") else ("cpu", "cuda"))
    assert h["slots_total"] == 3 and h["slots_idle"] == 3 and h["queued"] == 0


def test_health_needs_no_key_but_the_api_does(ferry_bin):
    s = FerryServer(ferry_bin, api_key="sekret")
    try:
        status, _ = s.request("GET", "/health", headers={"Authorization": ""})
        assert status == 200
        for auth in ("", "Bearer wrong", "Bearer sekret2", "sekret", "Basic sekret"):
            status, body = s.request("GET", "/v1/models", headers={"Authorization": auth})
            assert status == 401, auth
            assert json.loads(body)["error"]["type"] == "authentication_error"
        status, _ = s.request("GET", "/v1/models")
        assert status == 200
        assert s.client().models.list().data[0].id == "glm-5.3-flash"
    finally:
        assert s.stop() == 0


def test_loading_reports_progress_while_the_server_already_listens(ferry_bin, tmp_path):
    """A 512 MiB sparse file reads in a fraction of a second: long enough to see /health say "loading"
    with its progress, before the load fails (it is no model) and ferry exits 1."""
    available = next(int(line.split()[1]) for line in pathlib.Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemAvailable:"))
    if available < 2 << 20:
        pytest.skip("needs 2 GiB of available memory (ferry only preloads files under half of it)")
    big = tmp_path / "big.gguf"
    with open(big, "wb") as f:
        f.write(b"GGUF")
        f.truncate(512 << 20)
    s = FerryServer(ferry_bin, "--model", str(big), ready=False)
    seen = None
    while s.proc.poll() is None:
        try:
            status, body = s.get("/health", timeout=5)
        except OSError:
            break  # the server went away between the poll and the request
        if status == 503 and json.loads(body)["status"] == "loading":
            seen = json.loads(body)
            break
        time.sleep(0.005)
    assert seen is not None, s.output()
    assert seen["loading"]["bytes_total"] == 512 << 20
    assert 0 <= seen["loading"]["percent"] <= 100
    assert seen["reason"].startswith("loading the model")
    assert s.proc.wait(timeout=60) == 1
    assert "cannot serve" in s.output()
    s.stop()
