#!/usr/bin/env python3
"""Interleaved conversations against an OpenAI-compatible server's prompt cache, as a client sees it.

Each conversation starts with a prompt of --prompt random token ids (/v1/completions, so lengths are
exact); its turns come round-robin (A1 B1 C1 A2 B2 C2 ...), each appending the previous answer and
--new-tokens new ids. Then a conversation that was not seen before takes a slot, and the first
conversation's next turn and the same request again follow. Every request reports the HTTP wall time,
the server's cached tokens (usage.prompt_tokens_details.cached_tokens) and its prompt_ms (llama.cpp's
timings). Python's standard library only.

  tools/bench_conversations.py --url http://127.0.0.1:9527 --prompt 8192 --conversations 3 --turns 3
"""
import argparse
import http.client
import json
import random
import sys
import time
import urllib.parse


def post(url, path, body, timeout):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        start = time.perf_counter()
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        wall = time.perf_counter() - start
    finally:
        conn.close()
    if r.status != 200:
        raise SystemExit(f"POST {path}: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data), wall


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="glm-5.3-flash")
    p.add_argument("--prompt", type=int, default=8192, help="first prompt of each conversation, in tokens")
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--turns", type=int, default=3, help="turns of each conversation after its first")
    p.add_argument("--new-tokens", type=int, default=15, help="new ids per turn, after the previous answer")
    p.add_argument("--answer", type=int, default=8, help="max_tokens of each answer")
    p.add_argument("--id-range", default="1000:100000", help="LO:HI of the random prompt ids")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", help="write every request's figures here")
    a = p.parse_args(argv)
    lo, hi = (int(x) for x in a.id_range.split(":"))
    rng = random.Random(a.seed)
    ids = lambda n: [rng.randrange(lo, hi) for _ in range(n)]  # noqa: E731
    rows = []

    def send(label, conv, prompt, max_tokens):
        body = {"model": a.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        resp, wall = post(a.url, "/v1/completions", body, a.timeout)
        usage = resp.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        timings = resp.get("timings") or {}
        choice = resp["choices"][0]
        answer = choice.get("token_ids") or []
        row = {"case": label, "conversation": conv, "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached,
               "cache_n": timings.get("cache_n"), "prompt_ms": timings.get("prompt_ms"), "wall_s": wall,
               "completion_tokens": usage.get("completion_tokens")}
        rows.append(row)
        print(f"{label:<22} {conv:>2}  prompt {row['prompt_tokens']:>7}  cached {cached!s:>7}  "
              f"prefill {row['prompt_ms'] or 0:>9.1f} ms  wall {wall:7.3f} s", flush=True)
        return answer

    names = [chr(ord("A") + i) for i in range(a.conversations + 1)]
    history = {n: ids(a.prompt) for n in names[:a.conversations]}
    for turn in range(a.turns + 1):
        for n in names[:a.conversations]:
            answer = send("first" if turn == 0 else f"turn {turn}", n, history[n], a.answer)
            history[n] = history[n] + answer + ids(a.new_tokens)
    # A conversation not seen before takes the least recently used slot (the first conversation's).
    intruder = names[a.conversations]
    send("new conversation", intruder, ids(a.prompt), a.answer)
    first = names[0]
    answer = send("turn after takeover", first, history[first], a.answer)
    send("same again (1 token)", first, history[first], 1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    later = [r for r in rows if r["case"].startswith("turn")]
    missed = [r for r in later if not r["cached_tokens"] or r["cached_tokens"] < r["prompt_tokens"] - a.answer - a.new_tokens - 1]
    print(f"{len(later) - len(missed)} of {len(later)} later turns resumed at the previous turn's end"
          + ("" if not missed else f"; missed: {[(r['case'], r['conversation']) for r in missed]}"))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
