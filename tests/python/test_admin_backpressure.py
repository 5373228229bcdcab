"""A console that stops reading is dropped and never slows generation: decode t/s of the same request
with no console, with a console that reads every delta at 20 Hz, and with one that stalled (asked for
20 Hz, then never reads), in interleaved rounds (FERRY_ADMIN_BENCH_ROUNDS, default 2). The figures are
printed (pytest -s) and recorded as properties; speed is reported, not asserted (ARCHITECTURE: tests),
but every stalled console must be dropped and the engine must go on serving consoles."""
import json
import os
import statistics
import threading
import time

from admin_client import Console, StalledConsole
from ferry_server import FerryServer

TOKENS = 2000


def decode_rate(server, tokens=TOKENS):
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


class ReadingConsole:
    """A console at 20 Hz that reads everything, on a thread of its own."""

    def __init__(self, server):
        self.c = Console(server)
        self.c.recv(), self.c.recv()
        assert self.c.command("rate", hz=20)["type"] == "ack"
        self.deltas = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.read)
        self.thread.start()

    def read(self):
        while not self.stop.is_set():
            try:
                self.deltas += self.c.recv(timeout=0.5)["type"] == "delta"
            except TimeoutError:
                pass

    def close(self):
        self.stop.set()
        self.thread.join()
        self.c.close()


def test_stalled_console_is_dropped_and_decode_keeps_its_speed(ferry_bin, record_property):
    rounds = int(os.environ.get("FERRY_ADMIN_BENCH_ROUNDS", "2"))
    s = FerryServer(ferry_bin, "--admin-queue-limit", "16")
    try:
        decode_rate(s, 200)  # warm-up
        rates = {"no console": [], "a reading console": [], "a stalled console": []}
        drops = []
        for r in range(rounds):
            rates["no console"].append(decode_rate(s))

            reader = ReadingConsole(s)
            rates["a reading console"].append(decode_rate(s))
            reader.close()
            assert reader.deltas >= 4

            dropped_before = metric(s, "ferry_admin_clients_dropped_total")
            stalled = StalledConsole(s, hz=20)
            connected = time.monotonic()
            rates["a stalled console"].append(decode_rate(s))
            # Keep the engine busy (the deltas coming) until the console is dropped.
            while metric(s, "ferry_admin_clients_dropped_total") <= dropped_before:
                assert time.monotonic() - connected < 60, "the stalled console was never dropped"
                decode_rate(s, 300)
            drops.append(time.monotonic() - connected)
            stalled.close()

        summary = ", ".join(f"{k} {statistics.median(v):.1f} ({' / '.join(f'{x:.1f}' for x in v)})"
                            for k, v in rates.items())
        print(f"\ndecode t/s, median of {rounds} rounds ({TOKENS} tokens, CPU backend, 1 thread): {summary}; "
              f"each stalled console dropped {' / '.join(f'{d:.1f}' for d in drops)} s after it connected")
        for k, v in rates.items():
            record_property("decode_tps_" + k.replace(" ", "_"), round(statistics.median(v), 2))
        record_property("stalled_console_dropped_after_s", round(max(drops), 2))
        assert metric(s, "ferry_admin_clients") == 0
        c = Console(s)  # the server still serves consoles
        assert c.recv()["type"] == "hello" and c.recv()["type"] == "snapshot"
        c.close()
    finally:
        assert s.stop() == 0
