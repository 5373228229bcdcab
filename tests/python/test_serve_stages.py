"""`ferry serve` with the model split into pipeline stages (--split): the same greedy tokens as one
stage, with 1, 2 and 3 concurrent requests, /health listing the stages; a device error injected into
one step (--inject-fault) fails that step's request, /health says which stage failed and why, and the
server keeps answering; a split the model cannot take is refused at start-up naming it."""
import concurrent.futures
import json
import subprocess

from ferry_server import FerryServer

PROMPTS = [[11, 12, 13, 14, 15, 16, 17], [400, 401, 402], list(range(50, 90))]


def completions(s, prompts, n=12):
    client = s.client()

    def one(p):
        r = client.completions.create(model="glm-5.3-flash", prompt=p, max_tokens=n, temperature=0,
                                      extra_body={"return_token_ids": True, "min_tokens": n})
        return r.choices[0].token_ids

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def test_split_stages_give_the_tokens_of_one_stage(ferry_bin, six_layer_model):
    one = FerryServer(ferry_bin, "--model", six_layer_model)
    try:
        want = [completions(one, [p])[0] for p in PROMPTS]
        together = completions(one, PROMPTS)
    finally:
        assert one.stop() == 0
    assert together == want
    for split in ("3", "2,4", "1,3,5"):
        s = FerryServer(ferry_bin, "--model", six_layer_model, "--split", split)
        try:
            health = json.loads(s.get("/health")[1])
            assert [st["layers"] for st in health["stages"]][0].startswith("layer")
            assert len(health["stages"]) == split.count(",") + 2
            assert all(st["status"] == "ok" for st in health["stages"])
            assert [completions(s, [p])[0] for p in PROMPTS] == want, split
            assert completions(s, PROMPTS) == want, split
            metrics = s.get("/metrics")[1]
            assert 'ferry_stage_steps_total{stage="0"' in metrics
        finally:
            assert s.stop() == 0


def test_an_injected_device_error_fails_its_request_and_health_names_the_stage(ferry_bin, six_layer_model):
    s = FerryServer(ferry_bin, "--model", six_layer_model, "--split", "3", "--inject-fault", "4:1:device_error")
    try:
        status, body = s.post("/v1/completions", {"model": "glm-5.3-flash", "prompt": [5, 6, 7], "max_tokens": 20,
                                                  "min_tokens": 20})
        assert status >= 500, body
        err = json.loads(body)["error"]
        assert "stage 1" in err["message"] and "injected fault" in err["message"], err
        status, body = s.get("/health")
        health = json.loads(body)
        assert status == 503 and health["status"] == "failed", health
        assert "stage 1" in health["reason"]
        assert [st["status"] for st in health["stages"]] == ["ok", "failed"]
        assert "injected fault" in health["stages"][1]["reason"]
        # Still answering: new work is refused with the reason, the other endpoints work.
        status, body = s.post("/v1/completions", {"model": "glm-5.3-flash", "prompt": [5], "max_tokens": 2})
        assert status >= 500 and "stage 1" in json.loads(body)["error"]["message"]
        assert s.get("/v1/models")[0] == 200
        assert 'ferry_stage_failed{stage="1"' in s.get("/metrics")[1]
    finally:
        assert s.stop() == 0


def test_a_plan_error_fails_only_its_request(ferry_bin, six_layer_model):
    s = FerryServer(ferry_bin, "--model", six_layer_model, "--split", "2,4", "--inject-fault", "2:2:invalid_plan")
    try:
        status, _ = s.post("/v1/completions", {"model": "glm-5.3-flash", "prompt": [5, 6], "max_tokens": 5,
                                               "min_tokens": 5})
        assert status >= 500
        r = s.client().completions.create(model="glm-5.3-flash", prompt=[5, 6], max_tokens=5, temperature=0)
        assert r.usage.completion_tokens >= 1
        assert json.loads(s.get("/health")[1])["status"] == "ok"
    finally:
        assert s.stop() == 0


def test_a_split_the_model_cannot_take_is_refused(ferry_bin, six_layer_model):
    for split, text in (("4,2", "boundary 2 must be above the previous one (4)"), ("6", "below the 6 layers"),
                        ("x", "'x' is not a non-negative integer")):
        r = subprocess.run([ferry_bin, "serve", "--port", "0", "--model", six_layer_model, "--split", split],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert text in r.stderr + r.stdout, (split, r.stderr)
    r = subprocess.run([ferry_bin, "serve", "--inject-fault", "soon"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--inject-fault 'soon'" in r.stderr
