"""GET /slots, POST /slots/{id}?action=release and POST /v1/requests/{id}/cancel."""
import json
import threading
import time

from ferry_server import server  # noqa: F401 (fixture)


def slots(server):
    status, body = server.get("/slots")
    assert status == 200
    return json.loads(body)


def test_slots_report_idle_slots_and_cached_tokens(server):
    server.client().completions.create(model="glm-5.3-flash", prompt=[5, 6, 7, 8], max_tokens=3,
                                       extra_body={"ignore_eos": True})
    s = slots(server)
    assert len(s["slots"]) == 3
    assert all(x["state"] == "idle" for x in s["slots"])
    assert max(x["held_tokens"] for x in s["slots"]) >= 6  # 4 prompt + 2 fed back
    assert s["queued"] == 0 and s["draining"] is False
    # The CPU backend keeps every row in its own caches: no resident window, no host KV tier.
    assert all(x["host_kv_bytes"] == 0 for x in s["slots"])
    assert s["kv_window"] == {"window_rows": 0, "resident_rows": 0, "hits": 0, "fetched_rows": 0, "fetched_bytes": 0,
                              "last_step_fetched_rows": 0, "last_step_fetched_bytes": 0, "hit_rate": 1.0}


def test_release_frees_a_slots_cache(server):
    server.client().completions.create(model="glm-5.3-flash", prompt=[9, 9, 9], max_tokens=2,
                                       extra_body={"ignore_eos": True})
    held = [x for x in slots(server)["slots"] if x["held_tokens"] > 0]
    slot = held[0]["id"]
    status, body = server.post(f"/slots/{slot}?action=release")
    assert status == 200 and json.loads(body)["released"] is True
    assert slots(server)["slots"][slot]["held_tokens"] == 0
    assert server.post("/slots/99?action=release")[0] == 404
    assert server.post("/slots/0?action=explode")[0] == 400
    assert server.post("/slots/x?action=release")[0] == 400


def test_admin_cancel_ends_a_running_stream(server):
    client = server.client()
    stream = client.completions.create(model="glm-5.3-flash", prompt=[1, 2, 3], max_tokens=3000, stream=True,
                                       extra_body={"ignore_eos": True})
    first = next(iter(stream))
    request_id = first.id
    status, body = server.post(f"/v1/requests/{request_id}/cancel")
    assert status == 202 and json.loads(body)["accepted"] is True
    events = []
    try:
        for chunk in stream:
            events.append(chunk)
    except Exception as e:  # the openai client raises on the error event that ends the stream
        events.append(e)
    assert events and isinstance(events[-1], Exception)
    assert "cancelled" in str(events[-1])
    # Idempotent: a second cancel of a finished request is accepted and changes nothing.
    assert server.post(f"/v1/requests/{request_id}/cancel")[0] == 202
    deadline = time.monotonic() + 5
    while any(x["state"] != "idle" for x in slots(server)["slots"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(x["state"] == "idle" for x in slots(server)["slots"])
    assert server.post("/v1/requests/banana/cancel")[0] == 400


def test_release_of_a_busy_slot_cancels_its_request(server):
    client = server.client()
    result = {}

    def run():
        try:
            client.completions.create(model="glm-5.3-flash", prompt=[4, 4, 4], max_tokens=3000,
                                      extra_body={"ignore_eos": True})
            result["error"] = None
        except Exception as e:
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    busy = []
    while not busy and time.monotonic() < deadline:
        busy = [x for x in slots(server)["slots"] if x["state"] != "idle"]
        time.sleep(0.005)
    assert busy
    status, body = server.post(f"/slots/{busy[0]['id']}?action=release")
    assert status == 200 and json.loads(body)["cancelled_request"] == busy[0]["request"]
    t.join(timeout=10)
    assert result["error"] is not None and "cancelled" in str(result["error"])
