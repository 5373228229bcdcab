"""A console that stops reading is dropped and never slows generation: decode t/s of the same request
with no console, with a console that reads every delta at 20 Hz, and with one that stalled (asked for
20 Hz, then never reads). The figures are printed (pytest -s) and recorded as properties; speed is
reported, not asserted (ARCHITECTURE: tests), but the stalled console must be dropped."""
import json
import threading
import time

from admin_client import Console, StalledConsole
from ferry_server import FerryServer


def decode_rate(server, tokens=2000):
    status, body = server.post("/v1/completions", {"prompt": [3, 4, 5], "max_tokens": tokens, "ignore_eos": True,
                                                   "temperature": 0})
    assert status == 200, body
    timings = json.loads(body)["timings"]
    assert timings["predicted_n"] == tokens
    return timings["predicted_per_second"]


def metric(server, name):
    for line in server.get("/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_stalled_console_is_dropped_and_decode_keeps_its_speed(ferry_bin, record_property):
    s = FerryServer(ferry_bin, "--admin-queue-limit", "16")
    try:
        decode_rate(s, 200)  # warm-up
        alone = max(decode_rate(s) for _ in range(2))

        reader = Console(s)
        reader.recv(), reader.recv()
        assert reader.command("rate", hz=20)["type"] == "ack"
        got = []
        stop = threading.Event()

        def read():
            while not stop.is_set():
                try:
                    got.append(reader.recv(timeout=1))
                except TimeoutError:
                    pass
        t = threading.Thread(target=read)
        t.start()
        with_reader = max(decode_rate(s) for _ in range(2))
        stop.set()
        t.join()
        reader.close()
        assert sum(1 for m in got if m["type"] == "delta") >= 4

        stalled = StalledConsole(s, hz=20)
        connected = time.monotonic()
        with_stalled = decode_rate(s)
        # Keep the engine busy (the deltas coming) until the console is dropped.
        while metric(s, "ferry_admin_clients_dropped_total") < 1:
            assert time.monotonic() - connected < 60, "the stalled console was never dropped"
            decode_rate(s, 500)
        dropped_after = time.monotonic() - connected
        stalled.close()
        after = decode_rate(s)

        print(f"\ndecode t/s (best of 2, 2000 tokens, CPU backend, 1 thread): no console {alone:.1f}, "
              f"a console reading at 20 Hz {with_reader:.1f}; a stalled console: {with_stalled:.1f} while it "
              f"stalled, {after:.1f} after it was dropped ({dropped_after:.1f} s after it connected)")
        for k, v in (("decode_tps_no_console", alone), ("decode_tps_reading_console", with_reader),
                     ("decode_tps_stalled_console", with_stalled), ("decode_tps_after_drop", after),
                     ("stalled_console_dropped_after_s", dropped_after)):
            record_property(k, round(v, 2))
        assert metric(s, "ferry_admin_clients") == 0
        # The server still serves consoles.
        c = Console(s)
        assert c.recv()["type"] == "hello" and c.recv()["type"] == "snapshot"
        c.close()
    finally:
        assert s.stop() == 0
