"""Cheap rejection: a body's size bounds its work. A 16 MB prompt is refused on what its length
proves (or after tokenizing up to the context, never all of it), and the memory of a burst of
16 x 16 MB rejected bodies goes back: the resident size after it is within 50 MB of before."""
import json
import socket
import threading
import time

import pytest

from ferry_server import FerryServer

SIXTEEN_MB = 16_000_000


def post_raw(base, path, body):
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=120) as s:
        s.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        reply = b""
        while chunk := s.recv(1 << 16):
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def chat_body(size, extra=b""):
    head = b'{"messages": [{"role": "user", "content": "'
    tail = b'"}]' + extra + b"}"
    return head + b"a" * (size - len(head) - len(tail)) + tail


@pytest.fixture(scope="module")
def big_server(ferry_bin):
    s = FerryServer(ferry_bin)
    yield s
    assert s.stop() == 0, s.output()


def test_a_huge_prompt_is_refused_by_what_its_length_proves(big_server):
    start = time.monotonic()
    status, body = post_raw(big_server.base, b"/v1/chat/completions", chat_body(SIXTEEN_MB))
    elapsed = time.monotonic() - start
    assert status == 400
    assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "messages"
    assert "more than 4095 tokens" in body["error"]["message"]
    text_prompt = b'{"prompt": "' + b"ab " * 3_000_000 + b'"}'
    status, body = post_raw(big_server.base, b"/v1/completions", text_prompt)
    assert status == 400 and body["error"]["param"] == "prompt"
    print(f"\n16 MB chat body refused in {elapsed * 1000:.0f} ms (sent over loopback, parsed, checked)")


def test_max_tokens_beyond_the_context_is_refused_before_the_prompt(big_server):
    status, body = post_raw(big_server.base, b"/v1/chat/completions", chat_body(SIXTEEN_MB, b', "max_tokens": 4096'))
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert "leaves no room for a prompt" in body["error"]["message"]


def test_memory_of_a_burst_of_rejected_bodies_goes_back(big_server):
    for i in range(3):  # warm up: threads, arenas and parsers as a served request leaves them
        big_server.client().chat.completions.create(model="glm-5.3-flash", max_tokens=2,
                                                    messages=[{"role": "user", "content": f"hi {i}"}])
    before = big_server.rss_kib()
    body = chat_body(SIXTEEN_MB)
    results, health = [], []
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            t = time.monotonic()
            status, _ = big_server.get("/health")
            health.append((status, time.monotonic() - t))
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    threads = [threading.Thread(target=lambda: results.append(post_raw(big_server.base, b"/v1/chat/completions", body)))
               for _ in range(16)]
    peak = 0
    start = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, big_server.rss_kib())
        time.sleep(0.01)
    elapsed = time.monotonic() - start
    stop.set()
    prober.join()
    assert len(results) == 16 and all(status == 400 for status, _ in results)
    deadline = time.monotonic() + 5  # the last bridges release their memory as they end
    while big_server.rss_kib() > before + 50 * 1024 and time.monotonic() < deadline:
        time.sleep(0.05)
    after = big_server.rss_kib()
    worst = max(t for _, t in health)
    print(f"\n16 x 16 MB rejected in {elapsed:.2f} s: RSS {before / 1024:.0f} MB before, peak {peak / 1024:.0f} MB, "
          f"{after / 1024:.0f} MB after; /health {len(health)} probes meanwhile, worst {worst * 1000:.0f} ms")
    assert all(status == 200 for status, _ in health)
    assert after <= before + 50 * 1024, (before, after)
