"""A chat stream's first event (the role "assistant" chunk) comes with the first token, not at
admission: clients such as llama-benchy time the first chunk with a choice as the end of prefill, so
an early role chunk made their prompt speed hundreds of times the real one (issue 17)."""
import http.client
import json
import time

from ferry_server import server  # noqa: F401 (fixture)


def timed_events(base, path, body):
    """(seconds from sending the request to each SSE event's arrival, payload) for one stream."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    payload = json.dumps(body)
    start = time.perf_counter()
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    events = []
    while line := response.readline():
        line = line.strip()
        if line.startswith(b"data: "):
            events.append((time.perf_counter() - start, line[6:].decode()))
    conn.close()
    return events


def test_the_role_chunk_waits_for_prefill(server):
    # ~1,500 prompt tokens: a prefill of a few hundred milliseconds on the CPU, far above the ~1 ms
    # at which the role chunk used to go out.
    body = {"messages": [{"role": "user", "content": "word " * 1500}], "max_tokens": 4, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    events = timed_events(server.base, "/v1/chat/completions", body)
    assert events[-1][1] == "[DONE]"
    first_at, first = events[0]
    assert json.loads(first)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    timings = json.loads(events[-2][1])["timings"]
    assert timings["prompt_n"] > 1000
    # The client's clock starts before the request is sent and the server's ttft_ms after it arrived:
    # an event sent at the first token can reach the client no sooner than ttft_ms.
    assert first_at * 1000 >= timings["ttft_ms"], (first_at, timings)
    # And the first token follows the role chunk at once (same step, same write).
    second_at = events[1][0]
    assert second_at - first_at < 0.05
