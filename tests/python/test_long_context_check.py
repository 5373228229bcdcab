"""tools/long_context_check.py at tiny sizes on the CPU backend (the embedded model): every phase runs
against a real `ferry serve` and its figures come out, the slot that reaches --ctx ends with "length",
the depths resume from the prefix cache's checkpoints, and a --ctx the model cannot give is a failure
(exit 1), not a silently shorter slot. The H200 run of issue 12 is the same script at 500K tokens."""
import json
import subprocess
import sys

import pytest

from ferry_server import DEFAULT_MODEL, REPO

SCRIPT = REPO / "tools" / "long_context_check.py"
TINY = ["--backend", "cpu", "--model", str(DEFAULT_MODEL), "--ctx", "1024", "--kv-resident", "64", "--prompt", "640",
        "--tokens", "24", "--depths", "128,256", "--short-prompt", "32", "--checkpoint-every", "128",
        "--checkpoint-budget", "1", "--prefill-chunk", "256", "--length-tail", "8", "--plan-device-memory", "16GiB",
        "--serve-arg=--threads", "--serve-arg=1"]


def run(ferry_bin, tmp_path, *extra):
    out = tmp_path / "lc.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--ferry", ferry_bin, *TINY, "--json", str(out), *extra],
                       capture_output=True, text=True, timeout=240)
    return p, (json.loads(out.read_text()) if out.exists() else None)


@pytest.fixture(scope="module")
def passing(ferry_bin, tmp_path_factory):
    return run(ferry_bin, tmp_path_factory.mktemp("lc"), "--bench-depths", "128,256")


def test_every_phase_passes_with_its_figures(passing):
    p, data = passing
    assert p.returncode == 0, p.stdout + p.stderr
    assert data["failures"] == []
    assert "result: PASS" in p.stdout
    d = data["data"]
    single = d["single"]
    assert single["usage"]["prompt_tokens"] == 640 and single["tokens_counted"] == 24
    assert single["prefill_tps"] > 0 and single["decode_tps"] > 0 and single["server_prefill_tps"] > 0
    # The slot reaches the context mid-stream: the first 640 tokens come from the prefix cache.
    length = d["length"]
    assert length["finish_reason"] == "length" and length["tokens_counted"] == 8
    assert length["usage"]["total_tokens"] == 1024 and length["usage"]["prompt_tokens_details"]["cached_tokens"] >= 639
    # Each depth resumes from the checkpoint at d (a multiple of --checkpoint-every) and decodes there.
    for depth in ("128", "256"):
        r = d["depths"][depth]
        assert r["usage"]["prompt_tokens"] == int(depth) + 1
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == int(depth), r
        assert r["decode_tps"] > 0
    assert d["depths"]["0"]["decode_tps"] > 0
    three = d["three"]
    assert three["prompt"] == 640 and len(three["requests"]) == 3
    assert three["ttft_s"] == sorted(three["ttft_s"]) and all(x > 0 for x in three["prefill_tps_each"])
    # Sent again, each prompt resumes one token before its end, and the three decode together.
    again = d["decode3"]
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in again["requests"]] == [639] * 3
    assert len(again["per_slot_tps"]) == 3 and all(x > 0 for x in again["per_slot_tps"])
    after = d["after"]
    assert [s["held_tokens"] for s in after["slots"]] == [640 + 24 - 1] * 3
    assert "ferry_stage_kv_hit_ratio" in after["metrics"]
    assert d["plan"]["stages"][0]["host_kv_bytes"] > 0  # the CUDA plan of this run has a host tier
    assert len(d["bench"]["rows"]) == 2


def test_the_table_names_each_case(passing):
    p, _ = passing
    for row in ("| prefill t/s, 640-token prompt (TTFT s) |", "| decode t/s at depth 640 |",
                "| slot reaches --ctx mid-stream | pass |", "| decode t/s at depth 256 |",
                "| 3 slots x 640 at once: TTFT s |", "| decode t/s, 3 slots at depth 640 at once |",
                "| host KV bytes per slot (/slots) |", "| refused: a prompt of ctx + 1 tokens | pass |",
                "| refused: a prompt whose max_tokens passes ctx | pass |", "| clean stop (SIGTERM) | pass |",
                "| refused at start: --kv-host-budget | n/a |", "| ferry bench tg32 @ d128 |"):
        assert row in p.stdout, (row, p.stdout)


def test_a_context_the_model_cannot_give_fails(ferry_bin, tmp_path):
    # The embedded model is trained to 4,096 tokens: a slot of 8,192 is capped, and the check says so.
    p, data = run(ferry_bin, tmp_path, "--ctx", "8192", "--host-budget-case", "off")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "--ctx 8192 not taken: /v1/models says max_model_len 4096" in data["failures"]
    assert "result: FAIL" in p.stdout
