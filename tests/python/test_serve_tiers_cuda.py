"""On a GPU (FERRY_TEST_CUDA=1; skipped elsewhere): `ferry serve --backend cuda` gives the same greedy
tokens over HTTP with the routed experts off the device as with all of them resident: no pool at all
(every route misses) on each prefill miss path, split into stages, and both; prompts alone and three
at once."""
import concurrent.futures
import json
import os

import pytest

from ferry_server import FerryServer

pytestmark = pytest.mark.skipif(os.environ.get("FERRY_TEST_CUDA") != "1",
                                reason="set FERRY_TEST_CUDA=1 on a machine with a CUDA GPU")

PROMPTS = [[11, 12, 13, 14, 15, 16, 17], [400, 401, 402], list(range(50, 90))]
CONFIGS = [
    ("no pool, mapped misses", ["--expert-pool-cap", "1", "--miss-path", "mapped"]),
    ("no pool, uploaded misses", ["--expert-pool-cap", "1", "--miss-path", "upload"]),
    ("3 stages", ["--split", "2,4"]),
    ("2 stages, no pool", ["--split", "3", "--expert-pool-cap", "1"]),
]


def greedy(s, prompt, n=16):
    status, body = s.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "min_tokens": n,
                                              "temperature": 0, "return_token_ids": True})
    assert status == 200, body
    return json.loads(body)["choices"][0]["token_ids"]


def tokens(s):
    alone = [greedy(s, p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: greedy(s, p), PROMPTS))
    return alone, together


def test_experts_off_the_device_give_the_resident_tokens(ferry_bin, six_layer_model):
    s = FerryServer(ferry_bin, "--model", six_layer_model, "--backend", "cuda")
    try:
        want, together = tokens(s)
    finally:
        assert s.stop() == 0
    assert together == want
    for name, args in CONFIGS:
        s = FerryServer(ferry_bin, "--model", six_layer_model, "--backend", "cuda", *args)
        try:
            assert tokens(s) == (want, want), name
            if "--expert-pool-cap" in args:
                assert "memory plan" in s.output(), name
        finally:
            assert s.stop() == 0
