"""GET /health: ok with the backend and slot counts when serving; never behind the API key."""
import json

from ferry_server import FerryServer, server  # noqa: F401 (fixture)


def test_ok_when_serving(server):
    status, body = server.get("/health")
    assert status == 200
    h = json.loads(body)
    assert h["status"] == "ok"
    assert h["backend"].startswith("cpu")
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
