"""/admin/ws, the admin console's WebSocket, with the `websockets` client: the hello, the snapshot and the
deltas, every command with its ack, and the errors (bad JSON, unknown commands, missing and bad
fields, no or a wrong token, a foreign Origin). The protocol is documented in http/admin_json.hpp."""
import json
import socket
import threading
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from admin_client import Console, ws_url
from ferry_server import FerryServer, server  # noqa: F401 (fixture)
from test_api_load import stream_request
from websockets.sync.client import connect


def long_stream(server, results, key, max_tokens=3000, prompt=(5, 6, 7)):
    def run():
        results[key] = stream_request(server.base, {"prompt": list(prompt), "stream": True, "ignore_eos": True,
                                                    "max_tokens": max_tokens})
    t = threading.Thread(target=run)
    t.start()
    return t


def busy_slot(console, timeout=20):
    """The first slot a delta shows decoding."""
    m = console.wait(lambda m: any(s["state"] == "decoding" for s in m.get("slots", [])), timeout=timeout)
    return next(s for s in m["slots"] if s["state"] == "decoding")


def test_hello_then_snapshot_of_the_graph(server):
    c = Console(server)
    hello = c.recv()
    assert hello["type"] == "hello" and hello["protocol"] == 1 and hello["auth_required"] is False
    assert hello["model"] == "glm-5.3-flash" and "cancel" in hello["commands"]
    snap = c.recv()
    assert snap["type"] == "snapshot" and snap["rev"] > 0 and snap["phase"] == "ready"
    names = {a["name"]: a for a in snap["actors"]}
    assert {"scheduler", "stage 0", "admin"} <= set(names)
    assert names["scheduler"]["links"][0] == "stage 0" and names["stage 0"]["links"] == ["scheduler"]
    assert names["stage 0"]["kind"] == "stage" and "steps" in names["stage 0"]["counters"]
    assert [s["index"] for s in snap["slots"]] == [0, 1, 2]
    assert snap["queue"]["limit"] == 64 and snap["server"]["slots"] == 3
    assert snap["stages"][0]["layers"].startswith("layers 0-")
    c.close()


def test_deltas_follow_a_request_at_the_chosen_rate(server):
    c = Console(server)
    c.recv(), c.recv()
    assert c.command("rate", hz=20) == {"type": "ack", "cmd": "rate", "id": 1, "rate_hz": 20}
    results = {}
    t = long_stream(server, results, "a", max_tokens=600)
    slot = busy_slot(c)
    request = slot["request"]
    deltas, bridge_seen, finished = [], False, None
    deadline = time.monotonic() + 30
    while finished is None and time.monotonic() < deadline:
        m = c.recv()
        if m["type"] != "delta":
            continue
        deltas.append(m)
        bridge_seen |= any(a["name"] == f"bridge {request}" and a["kind"] == "bridge" for a in m.get("actors", []))
        finished = next((f for f in m.get("finished", []) if f["request"] == request), None)
    t.join()
    assert finished is not None and finished["doing"] == "finished: length"
    assert finished["counters"]["completion_tokens"] == 600 and finished["counters"]["decode_tokens_per_s"] > 0
    assert bridge_seen
    # Each delta continues from the one before it.
    for a, b in zip(deltas, deltas[1:]):
        assert b["since"] == a["rev"] and b["rev"] > a["rev"]
    assert any(d["throughput"]["generated_tokens_per_s"] > 0 for d in deltas)
    gone = [d for d in deltas if f"bridge {request}" in d.get("removed", [])]
    assert gone, "the bridge's node is removed when its request ends"
    # At 20 Hz a stream of several hundred tokens gives several deltas, not one per token.
    assert 2 <= len(deltas) <= 200
    c.close()


def test_cancel_is_acked_and_idempotent(server):
    c = Console(server)
    c.recv(), c.recv()
    results = {}
    t = long_stream(server, results, "a")
    request = busy_slot(c)["request"]
    ack = c.command("cancel", request=f"cmpl-{request}")
    assert ack["type"] == "ack" and ack["request"] == request and ack["was_live"] is True
    assert ack["status"] in ("decoding", "prefilling")
    t.join()
    events = results["a"]
    assert events[-1] == "[DONE]" and "cancelled by an administrator" in events[-2]
    again = c.command("cancel", request=request)
    assert again["type"] == "ack" and again["was_live"] is False and again["status"] is None
    unknown = c.command("cancel", request=987654321)
    assert unknown["type"] == "ack" and unknown["was_live"] is False
    c.close()


def test_release_a_slot(server):
    c = Console(server)
    c.recv(), c.recv()
    results = {}
    t = long_stream(server, results, "a")
    slot = busy_slot(c)
    ack = c.command("release", slot=slot["index"])
    assert ack["type"] == "ack" and ack["slot"] == slot["index"] and ack["cancelled_request"] == slot["request"]
    t.join()
    assert "cancelled by an administrator" in results["a"][-2]
    idle = c.command("release", slot=2)
    assert idle["type"] == "ack" and idle["cancelled_request"] is None
    missing = c.command("release", slot=7)
    assert missing["type"] == "error" and missing["code"] == "not_found" and "slot 7 does not exist" in missing["message"]
    c.close()


def test_set_log_level_memory_plan_ping_snapshot(server):
    c = Console(server)
    c.recv(), c.recv()
    ack = c.command("set_log_level", level="debug")
    assert ack["type"] == "ack" and ack["level"] == "debug" and ack["previous"] == "info"
    assert c.command("set_log_level", level="info")["previous"] == "debug"
    bad = c.command("set_log_level", level="loud")
    assert bad["type"] == "error" and bad["code"] == "bad_field"
    assert bad["message"].startswith("'level' = \"loud\": expected one of trace, debug, info")
    plan = c.command("memory_plan")["plan"]
    assert plan["slots"] == 3 and plan["ctx"] == 4096 and plan["tiers"] == []
    stage = plan["stages"][0]
    assert stage["slot_fixed_bytes"] > 0 and stage["slot_bytes_per_token"] > 0
    assert stage["slot_bytes_at_ctx"] >= stage["slot_fixed_bytes"] + 4096 * stage["slot_bytes_per_token"]
    assert stage["slots_bytes_at_ctx"] == 3 * stage["slot_bytes_at_ctx"]
    pong = c.command("ping")
    assert pong["type"] == "ack" and pong["cmd"] == "ping" and set(pong) == {"type", "cmd", "id"}
    c.send({"cmd": "snapshot"})
    assert c.wait(lambda m: m["type"] == "snapshot")["phase"] == "ready"
    c.close()


@pytest.mark.parametrize("message, code, words", [
    ("not json", "bad_json", "JSON"),
    ('{"cmd": "ping"', "bad_json", "JSON"),
    ('{"cmd": "ping"} {}', "bad_json", "after the object"),
    ("[1, 2]", "bad_json", "object"),
    ('{"id": 3}', "missing_field", "'cmd' is missing"),
    ('{"cmd": "frobnicate", "id": "x"}', "unknown_command", "unknown command 'frobnicate'"),
    ('{"cmd": 7}', "bad_field", "'cmd': expected a string"),
    ('{"cmd": "cancel"}', "missing_field", "'request' is missing"),
    ('{"cmd": "cancel", "request": "chatcmpl-x"}', "bad_field", "'request' = \"chatcmpl-x\""),
    ('{"cmd": "cancel", "request": -4}', "bad_field", "'request': expected a request id"),
    ('{"cmd": "release", "slot": "one"}', "bad_field", "'slot': expected a slot index"),
    ('{"cmd": "release"}', "missing_field", "'slot' is missing"),
    ('{"cmd": "rate", "hz": 100}', "bad_field", "'hz' = 100"),
    ('{"cmd": "rate", "hz": "fast"}', "bad_field", "'hz': expected a number"),
    ('{"cmd": "set_log_level"}', "missing_field", "'level' is missing"),
    ('{"cmd": "ping", "id": {"a": 1}}', "bad_field", "'id': expected a number or a string"),
])
def test_bad_messages_get_precise_errors_and_the_console_stays(server, message, code, words):
    c = Console(server)
    c.recv(), c.recv()
    c.send(message)
    m = c.wait(lambda m: m["type"] == "error")
    assert m["code"] == code and words in m["message"], m
    if '"id": "x"' in message:
        assert m["id"] == "x" and m["cmd"] == "frobnicate"
    assert c.command("ping")["type"] == "ack"  # still connected
    c.close()


def test_page_and_plain_get_of_the_socket(server):
    status, body = server.get("/admin")
    assert status == 200 and "<title>ferry admin</title>" in body
    assert "src=\"http" not in body and "href=\"http" not in body and "@import" not in body  # self-contained
    status, body = server.get("/admin/ws")
    assert status == 426 and "upgrade_required" in body


def test_foreign_origin_is_refused(server):
    with pytest.raises(InvalidStatus) as e:
        connect(ws_url(server), origin="http://attacker.example", open_timeout=10)
    assert e.value.response.status_code == 403
    # The page's own origin is fine.
    host = server.base.removeprefix("http://")
    with connect(ws_url(server), origin=f"http://{host}", open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "hello"


def test_token_by_header_by_first_message_and_wrong_ones(ferry_bin):
    s = FerryServer(ferry_bin, "--admin-token", "s3cret", api_key="apikey")
    try:
        # A script: the bearer token on the upgrade.
        c = Console(s, token="s3cret")
        assert c.recv()["auth_required"] is False and c.recv()["type"] == "snapshot"
        c.close()
        # The API key is not the admin token.
        for wrong in ("apikey", "s3cre", "s3cretx"):
            with pytest.raises(InvalidStatus) as e:
                Console(s, token=wrong)
            assert e.value.response.status_code == 401
        # The page: the token as the first message.
        c = Console(s)
        assert c.recv()["auth_required"] is True
        c.send({"cmd": "auth", "token": "s3cret", "id": 1})
        assert c.recv() == {"type": "ack", "cmd": "auth", "id": 1, "authenticated": True}
        assert c.recv()["type"] == "snapshot"
        c.close()
        # A wrong token in the first message: an error, then the close (1008).
        c = Console(s)
        c.recv()
        c.send({"cmd": "auth", "token": "guess"})
        m = c.recv()
        assert m["type"] == "error" and m["code"] == "unauthorized" and "wrong admin token" in m["message"]
        with pytest.raises(ConnectionClosed) as closed:
            c.recv()
        assert closed.value.rcvd.code == 1008
        # Anything but auth first: refused the same way.
        c = Console(s)
        c.recv()
        c.send({"cmd": "cancel", "request": 1})
        assert c.recv()["code"] == "unauthorized"
        with pytest.raises(ConnectionClosed):
            c.recv()
        status, body = s.get("/metrics")
        refused = [line for line in body.splitlines() if line.startswith("ferry_admin_upgrades_refused_total ")]
        assert refused == ["ferry_admin_upgrades_refused_total 3"]
    finally:
        assert s.stop() == 0


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_admin_port_serves_the_console_and_the_api_port_does_not(ferry_bin):
    port = free_port()
    s = FerryServer(ferry_bin, "--admin-port", str(port))
    try:
        assert f"admin console on http://127.0.0.1:{port}/admin" in s.output()
        assert s.get("/admin")[0] == 404
        with pytest.raises(InvalidStatus):
            Console(s)
        c = Console(s, port=port)
        assert c.recv()["type"] == "hello" and c.recv()["type"] == "snapshot"
        c.close()
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin", timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    finally:
        assert s.stop() == 0


def test_drain_acks_once_and_the_server_exits_0(ferry_bin):
    s = FerryServer(ferry_bin, "--drain-timeout", "2")
    c = Console(s)
    c.recv(), c.recv()
    results = {}
    t = long_stream(s, results, "a", max_tokens=4000)
    busy_slot(c)
    first = c.command("drain")
    assert first["type"] == "ack" and first["started"] is True and "draining" in first["message"]
    again = c.command("drain")
    assert again["type"] == "ack" and again["started"] is False and again["message"] == "already draining"
    assert s.post("/v1/completions", {"prompt": "late", "max_tokens": 1})[0] == 503
    assert c.wait(lambda m: m["type"] == "delta" and m.get("engine", {}).get("draining"))["phase"] == "draining"
    # The console is told the server stops (1001) once the running request is cancelled at the deadline.
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            c.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    s.proc.wait(timeout=60)
    t.join()
    assert s.proc.returncode == 0
    assert "drain timeout" in results["a"][-2] or "shut down" in results["a"][-2]
    assert "admin console: drain requested" in s.output() and "admin console: draining" in s.output()
    s.stop()
