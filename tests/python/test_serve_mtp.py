"""`ferry serve --mtp` (speculative decoding with the MTP block's drafts) on the CPU backend, and on
the CUDA backend with FERRY_TEST_CUDA=1 (skipped elsewhere): greedy tokens equal those of `--mtp off`
on the same backend, token for token, with 1 and 3 concurrent requests, prompts prefilled in small
chunks between the decode steps, one stage or two, and so do sampled ones with a seed; the drafts and
their acceptance show in the response's timings and in /metrics; a bad --mtp is refused naming it."""
import concurrent.futures
import json
import os
import subprocess

import pytest

import glm5_checkpoint as ck
from ferry_server import REPO, FerryServer

PROMPTS = [[11, 12, 13, 14, 15, 16, 17], [400, 401, 402], list(range(50, 90))]
N = 14
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 7}


def completions(s, prompts, sampling=None):
    def one(p):
        status, body = s.post("/v1/completions", {"model": "glm-5.3-flash", "prompt": p, "max_tokens": N,
                                                  "min_tokens": N, "return_token_ids": True,
                                                  **(sampling or {"temperature": 0})})
        assert status == 200, body
        r = json.loads(body)
        return r["choices"][0]["token_ids"], r["timings"]

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


BACKENDS = [
    pytest.param([], id="cpu"),
    pytest.param(["--backend", "cuda"], id="cuda", marks=pytest.mark.skipif(
        os.environ.get("FERRY_TEST_CUDA") != "1", reason="set FERRY_TEST_CUDA=1 on a machine with a CUDA GPU")),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_mtp_gives_the_greedy_tokens_of_plain_decoding(ferry_bin, six_layer_model, backend):
    plain = FerryServer(ferry_bin, "--model", six_layer_model, *backend)
    try:
        want = [completions(plain, [p])[0][0] for p in PROMPTS]
        assert [t for t, _ in completions(plain, PROMPTS)] == want
        sampled = [t for t, _ in completions(plain, PROMPTS, SAMPLED)]
    finally:
        assert plain.stop() == 0
    for args in (["--mtp", "1"], ["--mtp", "auto", "--prefill-chunk", "4"], ["--mtp", "2", "--split", "3"]):
        s = FerryServer(ferry_bin, "--model", six_layer_model, *backend, *args)
        try:
            alone = completions(s, [PROMPTS[0]])
            assert alone[0][0] == want[0], args
            assert alone[0][1]["draft_n"] > 0, alone[0][1]
            together = completions(s, PROMPTS)
            assert [t for t, _ in together] == want, args
            drafted = sum(t["draft_n"] for _, t in together)
            accepted = sum(t["draft_n_accepted"] for _, t in together)
            assert drafted > 0 and 0 <= accepted <= drafted
            assert s.metric("ferry_mtp_draft_tokens_total") >= drafted + alone[0][1]["draft_n"]
            assert s.metric("ferry_mtp_accepted_tokens_total") >= accepted
            # Sampled requests verify drafts too: the same seed draws the same tokens.
            assert [t for t, _ in completions(s, PROMPTS, SAMPLED)] == sampled, args
        finally:
            assert s.stop() == 0, args


def test_a_bad_mtp_setting_is_refused(ferry_bin):
    r = subprocess.run([ferry_bin, "serve", "--mtp", "7"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--mtp" in r.stderr and "auto, off" in r.stderr, r.stderr


def test_a_turn_resumed_from_a_checkpoint_gives_the_tokens_of_plain_decoding(ferry_bin, six_layer_model):
    # A speculative request's checkpoints: the next turn (the answer appended), after another request
    # had the only slot, resumes from one and must draw what plain decoding draws. (A request that ends
    # on a rejected draft leaves rows past its confirmed ones: that end-of-generation checkpoint is
    # refused by the stages, and the turn resumes from the prompt's.)
    def turns(s):
        first = completions(s, [LONG])[0][0]
        completions(s, [PROMPTS[1]])  # takes the only slot: the next turn needs the checkpoint
        status, body = s.post("/v1/completions", {"model": "glm-5.3-flash", "prompt": LONG + first + [300, 301],
                                                  "max_tokens": N, "min_tokens": N, "return_token_ids": True,
                                                  "temperature": 0})
        assert status == 200, body
        r = json.loads(body)
        return first, r["choices"][0]["token_ids"], r["usage"]["prompt_tokens_details"]["cached_tokens"]

    LONG = list(range(50, 150))  # past the prefix cache's 64-token block
    results = []
    for args in ([], ["--mtp", "1"]):
        s = FerryServer(ferry_bin, "--model", six_layer_model, "--slots", "1", *args)
        try:
            results.append(turns(s))
        finally:
            assert s.stop() == 0, args
    (first, second, _), (mtp_first, mtp_second, cached) = results
    assert (mtp_first, mtp_second) == (first, second)
    assert cached >= len(LONG) - 1, cached


@pytest.fixture(scope="module")
def trunk_only_model(ferry_bin, tmp_path_factory):
    """trained_small without its MTP block (the tensors of layer num_hidden_layers left out) at q8_0."""
    src = REPO / "tests" / "fixtures" / "glm5" / "trained_small"
    d = tmp_path_factory.mktemp("trunk-only")
    cfg = json.loads((src / "config.json").read_text())
    cfg["text_config"].pop("num_nextn_predict_layers", None)
    (d / "config.json").write_text(json.dumps(cfg))
    stored = ck.read_stored(src)
    mtp = f"{ck.PREFIX}layers.{cfg['text_config']['num_hidden_layers']}."
    kept = {name: t for name, t in stored.items() if not name.startswith(mtp)}
    assert len(kept) < len(stored), "trained_small has no MTP block to leave out"
    ck.write_safetensors(d / "model.safetensors", kept)
    out = d / "trunk.gguf"
    subprocess.run([ferry_bin, "convert", str(d), str(out), "--type", "q8_0", "--tokenizer",
                    str(REPO / "tests" / "fixtures" / "tokenizer"), "--quiet"], check=True, capture_output=True)
    return str(out)


def test_mtp_without_an_mtp_block_is_said_and_decoding_goes_on(ferry_bin, trunk_only_model):
    # A model without an MTP block: --mtp is turned off with a warning naming it.
    s = FerryServer(ferry_bin, "--model", trunk_only_model, "--mtp", "1")
    try:
        status, body = s.post("/v1/completions", {"model": "glm-5.3-flash", "prompt": [11, 12, 13], "max_tokens": 4,
                                                  "temperature": 0})
        assert status == 200, body
        assert json.loads(body)["timings"].get("draft_n", 0) == 0
        assert "--mtp 1: speculative decoding is off: the last stage" in s.output()
    finally:
        assert s.stop() == 0
