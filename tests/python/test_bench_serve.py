"""tools/bench_serve.py against a real ferry serve on the embedded model, at tiny sizes: the table has
the user's rows (shared/SEED.md) in Markdown and JSON, and its client-side figures agree with the
server's own timings request by request."""
import json
import re
import subprocess
import sys

import pytest

from ferry_server import REPO, FerryServer

BENCH = REPO / "tools" / "bench_serve.py"
# out = 1 + W + N = 1 + 16 + 32 = 49 tokens a request; prompts of a few hundred tokens.
TINY = ["--prompt", "384", "--warmup-decode", "16", "--window", "32", "--long-prompt", "768",
        "--warmup-prompt", "64", "--warmup-tokens", "4", "--c3-extra", "256", "--stop-prompt", "128",
        "--stop-after", "8", "--stop-tail", "1024", "--reuse-tokens", "8", "--lifecycle-prompt", "32",
        "--lifecycle-tokens", "24", "--cache-prompt", "512", "--answer-tokens", "6", "--repeat", "2"]


def run_bench(url, tmp_path, *extra):
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, str(BENCH), "--url", url, "--json", str(out), "--progress", "on",
                        *TINY, *extra], capture_output=True, text=True, timeout=300)
    return p, (json.loads(out.read_text()) if out.exists() else None)


@pytest.fixture(scope="module")
def bench(ferry_bin, tmp_path_factory):
    server = FerryServer(ferry_bin, "--slots", "3")
    try:
        p, data = run_bench(server.base, tmp_path_factory.mktemp("bench"), "--compare-seed")
    finally:
        code = server.stop()
    assert p.returncode == 0, p.stdout + p.stderr
    assert code == 0
    return p, data


def table_rows(markdown, first_header):
    """The body rows of the Markdown table whose header row starts with `first_header`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_table_has_the_users_rows(bench):
    p, _ = bench
    rows = table_rows(p.stdout, "metric")
    names = [r[0] for r in rows]
    expected = [r"warm decode tok/s \(384 in, 49 out; window 32 after 16\)", r"warm prefill tok/s",
                r"warm prefill / TTFT s", r"warm end-to-end s", r"warm token gap p95 / max ms",
                r"warm MTP acceptance", r"fresh decode tok/s \(768 in", r"fresh prefill tok/s",
                r"fresh prefill / TTFT s", r"C3 per-slot decode tok/s", r"C3 aggregate tok/s \(same overlap window",
                r"Jain fairness", r"STOP -> DONE ms", r"RELEASE -> ACK ms", r"cancel then reuse; 1 -> 3 -> 1 slots",
                r"clean shutdown"]
    assert len(names) == len(expected), names
    for name, pattern in zip(names, expected):
        assert re.match(pattern, name), (name, pattern)
    assert all(len(r) == 4 for r in rows)  # metric, client, server's own, the user's V100 column
    by_name = {r[0].split(" (")[0]: r for r in rows}
    assert re.fullmatch(r"[0-9.]+ / [0-9.]+ / [0-9.]+", by_name["C3 per-slot decode tok/s"][1])
    assert by_name["cancel then reuse; 1 -> 3 -> 1 slots"][1] == "pass / pass"
    assert by_name["clean shutdown"][1].startswith("n/a")  # this server was not started by the wrapper
    assert by_name["warm MTP acceptance"][2] == "not reported by the server"
    assert by_name["warm decode tok/s"][3] == "36.895"
    cache = table_rows(p.stdout, "case")
    assert [r[0] for r in cache] == ["512-token first request", "same request again",
                                     "multi-turn: previous answer appended, new question", "tool result continuation"]
    assert "Definitions:" in p.stdout
    # Progress on stderr: each request's prompt when sent and its tokens when done.
    assert "[warm] warm: prompt 384 sent, max_tokens 49" in p.stderr
    assert re.search(r"\[warm\] warm: 49 tokens, TTFT [0-9.]+ s", p.stderr)


def test_every_case_passes_and_the_json_has_the_figures(bench):
    _, data = bench
    r = data["results"]
    assert list(r) == ["long", "warm", "c3", "cache", "stop", "release", "reuse", "slots131", "shutdown"]
    for key in ("long", "warm", "c3", "cache", "stop", "release", "reuse", "slots131"):
        assert r[key]["ok"] is True, (key, r[key])
    assert r["long"]["fresh"] is True and r["warm"]["fresh"] is False
    for key in ("warm", "long"):
        c = r[key]["client"]
        assert r[key]["tokens"] == 49 and r[key]["cached_tokens"] == 0
        assert c["decode_tps"] > 0 and c["prefill_tps"] > 0 and c["gap_max_ms"] >= c["gap_p95_ms"] > 0
    c3 = r["c3"]
    assert len(c3["per_slot_tps"]) == 3 and all(x > 0 for x in c3["per_slot_tps"])
    assert c3["aggregate_tps"] == pytest.approx(sum(c3["per_slot_tps"]))
    assert 0 < c3["jain"] <= 1
    # The window closes when each slot has N tokens in it, so every slot has about N.
    assert all(n >= 32 for n in c3["window_tokens"]), c3
    assert 0 < r["stop"]["stop_done_ms"] < 5000 and 0 < r["release"]["release_ack_ms"] < 5000
    assert r["slots131"]["max_busy_slots_seen"] == 3
    cache = r["cache"]["rows"]
    assert cache["first"]["cached_tokens"] == 0  # the slots were released first
    # ferry keeps the answer's KV: the multi-turn prompt reuses at least the whole first prompt.
    assert cache["turn"]["cached_tokens"] >= 512
    assert cache["turn"]["input_tokens"] == 512 + cache["turn"]["appended_tokens"]


def test_client_figures_agree_with_the_servers_timings(bench):
    _, data = bench
    checked = 0
    for req in data["requests"]:
        if req["client"]["closed_by_client"] or req["error"]:
            continue  # a stream the client left, or a cancelled one, has no final timings
        usage, t, c = req["usage"], req["timings"], req["client"]
        assert req["counted_by"] == "token_ids"
        assert req["tokens_counted"] == usage["completion_tokens"] == req["max_tokens"], req
        if req["prompt_tokens_sent"] is not None:
            assert usage["prompt_tokens"] == req["prompt_tokens_sent"]
        assert t["prompt_n"] + t["cache_n"] == usage["prompt_tokens"]
        assert t["cache_n"] == usage["prompt_tokens_details"]["cached_tokens"]
        # The server's clock starts after the request arrived and stops before its event is sent: the
        # client's TTFT can only be longer, by the HTTP and SSE overheads (milliseconds).
        server_ttft = t["ttft_ms"] / 1000
        assert server_ttft - 0.002 <= c["ttft_s"] <= server_ttft + 0.25 + 0.1 * server_ttft, req
        if usage["completion_tokens"] > 1:
            server_decode = t["predicted_ms"] / 1000
            assert abs(c["decode_s"] - server_decode) <= 0.1 + 0.1 * server_decode, req
        server_total = (t["queue_ms"] + t["prompt_ms"] + t["predicted_ms"]) / 1000
        assert c["e2e_s"] >= server_total - 0.002, req
        checked += 1
    assert checked >= 15
    warm = data["results"]["warm"]
    s, c = warm["server"], warm["client"]
    assert c["prefill_tps"] == pytest.approx(s["prefill_tps"], rel=0.3)
    assert s["prompt_n"] == 384
