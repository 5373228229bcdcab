"""GET /metrics: Prometheus text whose counters move with the traffic."""
import re
import shutil
import subprocess

import pytest

from ferry_server import chat_messages, server  # noqa: F401 (fixture)


def parse(text):
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)", line)
        assert m, f"not a Prometheus sample line: {line!r}"
        samples[m.group(1)] = float(m.group(2))
    return samples


def test_counters_follow_requests(server):
    status, before_text = server.get("/metrics")
    assert status == 200
    before = parse(before_text)
    server.client().chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=4,
                                            extra_body={"ignore_eos": True})
    after = parse(server.get("/metrics")[1])
    assert after["ferry_generation_tokens_total"] - before["ferry_generation_tokens_total"] == 4
    assert after['ferry_requests_finished_total{status="finished_length"}'] >= 1
    key = 'ferry_http_requests_total{endpoint="chat_completions",code="200"}'
    assert after[key] - before.get(key, 0) == 1
    assert after["ferry_time_to_first_token_seconds_count"] > before.get("ferry_time_to_first_token_seconds_count", 0)
    assert after['ferry_slots{state="idle"}'] == 3
    assert after["ferry_queue_length"] == 0
    assert after["ferry_up"] == 1
    assert after['ferry_step_seconds_bucket{le="+Inf"}'] == after["ferry_step_seconds_count"]


def test_metric_names_follow_prometheus_conventions(server):
    """What `promtool check metrics` checks of names: counters end in _total and nothing else does."""
    text = server.get("/metrics")[1]
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))
    assert types["ferry_model_size_bytes"] == "gauge"
    for name, kind in types.items():
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian's prometheus)")
def test_promtool_check_metrics_is_clean(server):
    # After traffic of each kind, so that every family has samples: a request, an error, a console.
    server.client().completions.create(model="glm-5.3-flash", prompt="hi", max_tokens=2)
    server.post("/v1/completions", {"prompt": ""})
    from admin_client import Console
    c = Console(server)
    c.recv(), c.recv()
    c.close()
    status, text = server.get("/metrics")
    assert status == 200
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stdout + r.stderr
    # Units in the names of what has one.
    for name in ("ferry_step_seconds", "ferry_time_to_first_token_seconds", "ferry_model_size_bytes",
                 "ferry_stage_handoff_bytes_total", "ferry_admin_clients_dropped_total",
                 "ferry_stage_kv_fetched_bytes_total"):
        assert f"# TYPE {name} " in text
    # The resident KV window's figures exist on the CPU backend too, honestly zero (no window).
    assert 'ferry_stage_kv_window_rows{stage="0"} 0' in text or "ferry_stage_kv_window_rows{" in text
    for line in text.splitlines():
        if line.startswith(("ferry_stage_kv_window_rows{", "ferry_stage_kv_fetched_rows_total{")):
            assert line.endswith(" 0"), line
