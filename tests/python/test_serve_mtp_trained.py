"""`ferry serve --mtp 1` on the embedded default model (trained_small at q8_0, whose MTP block was trained
on the frozen trunk's hidden states, tests/fixtures/glm5/README.md), through the official openai client:
greedy tokens equal those of `--mtp off`, token for token, and the trained block's drafts are accepted
on text from its training window.

The acceptance bound is not one that holds whatever the code does: drafts from a block that is fed the
wrong hidden state or token, or that is untrained (serve_tiny's random block: 0 of 25 equal the trunk's
next top-1 on its case), are next to never accepted; the trained block is accepted on 25 of 35 drafts
here (71%, measured on the CPU backend), so the bound (40%: 14 drafts) leaves room for near-tie flips,
not for a broken draft path."""
import json
import pathlib

from ferry_server import FerryServer

WINDOW = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "glm5" / "trained_small" / "window_train.json"
PROMPT = json.loads(WINDOW.read_text())["input_ids"][64:128]
N = 64
MIN_ACCEPTED = 0.40


def greedy(server):
    r = server.client().completions.create(model="glm-5.3-flash", prompt=PROMPT, max_tokens=N, temperature=0,
                                           extra_body={"return_token_ids": True, "min_tokens": N})
    return r.choices[0].model_extra["token_ids"], r.model_extra["timings"]


def test_trained_mtp_drafts_are_accepted_and_change_no_token(ferry_bin):
    plain = FerryServer(ferry_bin)
    try:
        want, timings = greedy(plain)
        assert len(want) == N and timings.get("draft_n", 0) == 0
    finally:
        assert plain.stop() == 0
    s = FerryServer(ferry_bin, "--mtp", "1")
    try:
        got, timings = greedy(s)
        assert got == want
        drafted, accepted = timings["draft_n"], timings["draft_n_accepted"]
        assert drafted > 0 and accepted <= drafted, timings
        assert accepted / drafted > MIN_ACCEPTED, timings
    finally:
        assert s.stop() == 0
