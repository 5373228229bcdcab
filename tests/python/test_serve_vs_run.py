"""The same prompt through `ferry serve` and `ferry run` gives the same greedy tokens: the server adds
scheduling, chunked prefill and batching with other slots, never a different answer."""
import concurrent.futures
import subprocess

from ferry_server import DEFAULT_MODEL, FerryServer

PROMPTS = [[1, 2, 3], list(range(200, 260)), [4000, 17, 99, 3, 3, 3, 250]]


def run_tokens(ferry_bin, prompt, n):
    out = subprocess.run([ferry_bin, "run", "--model", str(DEFAULT_MODEL), "--threads", "1",
                          "--prompt-ids", ",".join(map(str, prompt)), "-n", str(n)],
                         capture_output=True, text=True, check=True).stdout
    return [int(t) for t in out.split()]


def test_serve_and_run_agree_on_greedy_tokens(ferry_bin):
    # Small prefill chunks and three slots busy at once: the hardest case for the server.
    server = FerryServer(ferry_bin, "--prefill-chunk", "7", "--slots", "3")
    try:
        client = server.client()

        def serve_tokens(prompt):
            r = client.completions.create(model="glm-5.3-flash", prompt=prompt, max_tokens=16, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True,
                                                      "cache_prompt": False})
            return r.choices[0].model_extra["token_ids"]

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            served = list(pool.map(serve_tokens, PROMPTS))
        for prompt, tokens in zip(PROMPTS, served):
            assert tokens == run_tokens(ferry_bin, prompt, 16), prompt
    finally:
        assert server.stop() == 0
