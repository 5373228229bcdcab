"""SIGTERM under load: new requests are refused with 503, running ones finish or are cancelled with a
final SSE error event at --drain-timeout, and ferry exits 0."""
import json
import signal
import threading
import time

from ferry_server import FerryServer
from test_api_load import stream_request


def test_sigterm_under_load_ends_every_request_and_exits_0(ferry_bin):
    server = FerryServer(ferry_bin, "--slots", "3", "--drain-timeout", "1")
    results = {}

    def run(i):
        # Long streams (they cannot finish within the drain timeout) and short ones (they can).
        body = {"prompt": [i + 1, 2, 3], "stream": True, "ignore_eos": True,
                "max_tokens": 3000 if i % 2 == 0 else 3}
        refused = []
        try:
            events = stream_request(server.base, body, status_out=refused)
            results[i] = refused[0] if refused else events
        except Exception as e:  # noqa: BLE001 (reported by the assertions below)
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        busy = [s for s in json.loads(server.get("/slots")[1])["slots"] if s["state"] != "idle"]
        if len(busy) == 3:
            break
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    status, body = server.post("/v1/completions", {"prompt": "late", "max_tokens": 1})
    assert status == 503 and "shutting_down" in body
    assert server.get("/health")[0] == 503
    for t in threads:
        t.join(timeout=30)
    code = server.proc.wait(timeout=30)
    output = server.output()
    assert code == 0, output
    assert len(results) == 8
    cancelled = 0
    for i, events in results.items():
        assert not isinstance(events, Exception), (i, events)
        if isinstance(events, tuple):  # still queued at the deadline: refused before its stream began
            status, body = events
            assert status == 503 and json.loads(body)["error"]["code"] == "shutting_down", events
            cancelled += 1
            continue
        assert events[-1] == "[DONE]", (i, events[-3:])
        last = json.loads(events[-2])
        if "error" in last:  # cancelled at the deadline: the error event says why
            assert last["error"]["code"] == "shutting_down"
            cancelled += 1
        else:
            assert last["choices"][0]["finish_reason"] == "length"
    assert cancelled >= 1  # the long ones could not finish in time
    assert "drained" in output
    server.stop()
