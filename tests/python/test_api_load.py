"""Load through the real server: 200 streamed requests at concurrency 12 over 3 slots, each with exactly
one terminal event and the right token count; then 50 clients that leave mid-stream, after which every
slot is idle and the memory is back to its baseline."""
import concurrent.futures
import http.client
import json
import socket
import threading
import time

import pytest

from ferry_server import FerryServer


def stream_request(base, body, read_events=None, status_out=None):
    """Streams one request over a raw socket; returns the list of SSE payloads. With `read_events`,
    reads that many events and then closes the connection (a client that leaves). A request answered
    with an HTTP error instead of a stream returns [] and puts (status, body) in `status_out`."""
    host, port = base.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        f = s.makefile("rb")
        status = f.readline()
        headers = []
        while (line := f.readline()) not in (b"\r\n", b""):
            headers.append(line)
        if status_out is not None and not status.startswith(b"HTTP/1.1 200"):
            length = next(int(h.split(b":")[1]) for h in headers if h.lower().startswith(b"content-length"))
            status_out.append((int(status.split()[1]), f.read(length).decode()))
            return []
        assert status.startswith(b"HTTP/1.1 200"), status
        events = []
        while True:
            size_line = f.readline()
            if not size_line:
                break
            size = int(size_line.strip(), 16)
            if size == 0:
                break
            chunk = f.read(size + 2)[:-2]
            for block in chunk.decode().split("\n\n"):
                if block.startswith("data: "):
                    events.append(block[6:])
            if read_events is not None and len(events) >= read_events:
                return events
        return events


def check_one_request(base, i):
    """Returns (completion tokens, seconds from sending to [DONE])."""
    start = time.monotonic()
    max_tokens = 4 + i % 9
    body = {"prompt": [1 + i % 50, 2, 3, 4 + i % 7], "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True, "ignore_eos": True,
            "temperature": 0.8, "seed": i}
    events = stream_request(base, body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    terminal = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(terminal) == 1  # exactly one terminal event
    assert terminal[0]["choices"][0]["finish_reason"] == "length"
    ids = [t for c in chunks if c["choices"] for t in c["choices"][0].get("token_ids", [])]
    usage = chunks[-1]["usage"]
    assert len(ids) == usage["completion_tokens"] == max_tokens
    assert usage["prompt_tokens"] == 4
    return usage["completion_tokens"], time.monotonic() - start


def slots_idle(server):
    status, body = server.get("/slots")
    return status == 200 and all(s["state"] == "idle" for s in json.loads(body)["slots"])


@pytest.fixture(scope="module")
def loaded_server(ferry_bin):
    s = FerryServer(ferry_bin, "--slots", "3", "--queue-limit", "64")
    yield s
    assert s.stop() == 0, s.output()


def test_200_requests_at_concurrency_12(loaded_server):
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda i: check_one_request(loaded_server.base, i), range(200)))
    elapsed = time.monotonic() - start
    latencies = sorted(r[1] for r in results)
    print(f"\n200 requests, concurrency 12, 3 slots: {elapsed:.2f} s, {200 / elapsed:.1f} requests/s, "
          f"{sum(r[0] for r in results) / elapsed:.0f} generated tokens/s, latency p50 "
          f"{latencies[100] * 1000:.0f} ms, p95 {latencies[190] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms")
    assert slots_idle(loaded_server)
    status, text = loaded_server.get("/metrics")
    finished = [line for line in text.splitlines() if line.startswith('ferry_requests_finished_total{status="finished_length"}')]
    assert float(finished[0].split()[1]) >= 200


def test_clients_leaving_mid_stream_free_their_slots(loaded_server):
    body = {"prompt": [5, 6, 7], "max_tokens": 2000, "stream": True, "ignore_eos": True}
    # Warm up, then take the memory baseline: what 3 slots of state cost.
    for i in range(6):
        stream_request(loaded_server.base, dict(body, max_tokens=60, prompt=[i, 6, 7]))
    baseline = loaded_server.rss_kib()
    errors = []

    def leave(i):
        try:
            stream_request(loaded_server.base, dict(body, prompt=[i % 40 + 1, 6, 7]), read_events=3 + i % 5)
        except Exception as e:  # noqa: BLE001 (collected and reported below)
            errors.append(e)

    threads = [threading.Thread(target=leave, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    deadline = time.monotonic() + 10
    while not slots_idle(loaded_server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert slots_idle(loaded_server)
    metrics = loaded_server.get("/metrics")[1]
    disconnects = [line for line in metrics.splitlines() if line.startswith("ferry_http_client_disconnects_total")]
    assert float(disconnects[0].split()[1]) >= 50
    cancelled = [line for line in metrics.splitlines() if line.startswith('ferry_requests_finished_total{status="cancelled"}')]
    assert float(cancelled[0].split()[1]) >= 50
    # None of the 2000-token generations ran on: far fewer tokens than 50 x 2000 were generated.
    generated = [line for line in metrics.splitlines() if line.startswith("ferry_generation_tokens_total")]
    assert float(generated[0].split()[1]) < 50 * 2000 / 4
    time.sleep(0.2)
    after = loaded_server.rss_kib()
    assert after <= baseline + 8 * 1024, (baseline, after)  # within 8 MiB
    assert loaded_server.get("/health")[0] == 200


def test_one_keep_alive_connection_serves_request_after_request(loaded_server):
    """The next request on a connection arrives right after the previous answer: the disconnect watch
    of the previous one must not take it for a client that left."""
    host, port = loaded_server.base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    for i in range(100):
        body = {"prompt": [i + 1, 2], "max_tokens": 2, "ignore_eos": True, "stream": i % 2 == 1}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode()
        assert r.status == 200, text
        if i % 2:
            assert text.rstrip().endswith("data: [DONE]")
        else:
            assert json.loads(text)["usage"]["completion_tokens"] == 2
    conn.close()
