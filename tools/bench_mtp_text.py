#!/usr/bin/env python3
"""MTP speculative decoding on real text: greedy completions of prompts cut from evaluation windows
(token ids, e.g. tests/fixtures/glm5/trained_small/window_*.json), one `ferry serve` per --mtp setting,
one request at a time after one warm-up request. Prints per setting and window the drafts made and accepted (the response's
timings), tokens per decode step, decode t/s (timings predicted_per_second, the mean over the prompts)
and whether every token equals --mtp off's.

Usage: tools/bench_mtp_text.py --ferry build/ferry [--model M.gguf] [--window W.json ...] [--prompts 4]
       [--prompt-len 64] [--tokens 64] [--mtp off 1 2 3 auto] [--threads 2] [--backend cpu]
"""
import argparse
import json
import pathlib
import re
import subprocess
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
WINDOWS = [REPO / "tests/fixtures/glm5/trained_small" / f"window_{w}.json" for w in ("heldout", "train")]


def serve(args, mtp):
    log = tempfile.NamedTemporaryFile("w+", prefix="bench-mtp-", suffix=".log", delete=False)
    cmd = [args.ferry, "serve", "--port", "0", "--threads", str(args.threads), "--backend", args.backend,
           "--mtp", mtp, "--slots", "1"] + (["--model", args.model] if args.model else [])
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = re.search(r"listening on (http://[0-9.]+:\d+)", pathlib.Path(log.name).read_text(errors="replace"))
        if m:
            base = m.group(1)
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return proc, base
            except OSError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"ferry serve --mtp {mtp} did not start:\n{pathlib.Path(log.name).read_text()}")


def complete(base, prompt, n):
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        model = json.loads(r.read())["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "min_tokens": n, "temperature": 0,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return out["choices"][0]["token_ids"], out["timings"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--model", default=None, help="GGUF model (default: ferry's embedded default model)")
    ap.add_argument("--window", nargs="*", default=[str(w) for w in WINDOWS])
    ap.add_argument("--prompts", type=int, default=4, help="prompts per window, cut at evenly spaced starts")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens generated per prompt")
    ap.add_argument("--mtp", nargs="*", default=["off", "1", "2", "3", "auto"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()
    prompts = {}
    for w in args.window:
        ids = json.loads(pathlib.Path(w).read_text())["input_ids"]
        step = max(1, (len(ids) - args.prompt_len) // max(1, args.prompts))
        prompts[pathlib.Path(w).stem] = [ids[i * step:i * step + args.prompt_len] for i in range(args.prompts)]
    plain = {}
    print(f"{'mtp':>5} {'window':>15} {'drafts':>7} {'accepted':>9} {'rate':>7} {'tok/step':>9} {'t/s':>8}  same as off")
    for mtp in args.mtp:
        proc, base = serve(args, mtp)
        try:
            complete(base, next(iter(prompts.values()))[0], 4)  # warm-up, not counted
            for name, ps in prompts.items():
                drafted = accepted = made = 0
                tps = []
                same = True
                for i, p in enumerate(ps):
                    toks, t = complete(base, p, args.tokens)
                    drafted += t.get("draft_n", 0)
                    accepted += t.get("draft_n_accepted", 0)
                    made += len(toks) - 1  # the first token comes from the prefill
                    tps.append(t["predicted_per_second"])
                    if mtp == args.mtp[0]:
                        plain[(name, i)] = toks
                    same &= plain.get((name, i)) == toks
                steps = made - accepted
                print(f"{mtp:>5} {name:>15} {drafted:>7} {accepted:>9} "
                      f"{(accepted / drafted if drafted else 0):>7.1%} {made / max(steps, 1):>9.2f} "
                      f"{sum(tps) / len(tps):>8.1f}  {'yes' if same else 'NO'}", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
