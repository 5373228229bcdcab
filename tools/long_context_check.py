#!/usr/bin/env python3
"""The long-context check (issue 12): starts `ferry serve`, prefills a long prompt in chunks and
decodes, then three slots at that length at once, and the bad-input cases; prints a summary table and
exits non-zero when a check fails. Standard library only; HTTP streaming, prompts and /metrics come
from tools/bench_serve.py (imported, not copied).

  tools/long_context_check.py --ferry build/ferry --backend cuda \\
      --synthetic tests/fixtures/glm5/trained_small/config.json --index-topk 2048 \\
      --ctx 524288 --kv-resident 32768 --prompt 500000 --slots 3

Phases, in order (all prompts are random token ids, unique per request unless said):
  single   one prompt of N tokens, T tokens out: prefill t/s (N / TTFT; the server's prompt_ms too) and
           decode t/s at depth N (tokens W+1.. of the stream).
  length   that prompt plus fresh tokens up to ctx - L, with no max_tokens: the slot reaches its
           context mid-stream and must end with finish_reason "length" after exactly L tokens (the
           first N tokens come from the prefix cache).
  depths   the first d+1 tokens of that prompt for each --depths d, deepest first (the prefix cache cuts
           the slot back to its checkpoint at d where it has one), and a fresh short prompt: decode
           t/s at each depth, against the short prompt's as depth 0.
  three    every slot released, then --slots prompts of N3 tokens at once (N3 = N unless the time left
           cannot hold it: then the largest multiple of --prefill-chunk that fits, said in the table). The
           scheduler prefills one prompt at a time (the earliest first), so slot i's prefill is the
           gap between its TTFT and the one before.
  decode3  the same prompts again at once: each resumes from its checkpoint one token before its end,
           so all slots decode together at depth N3 (per-slot t/s over their common window).
  after    /slots (host_kv_bytes per slot, kv_window) and /metrics (ferry_stage_kv_*); device memory of
           the server process (nvidia-smi) where there is one.
  refuse   a prompt of ctx + 1 tokens, and a prompt whose max_tokens passes ctx: HTTP 400 naming the
           numbers.
  stop     SIGTERM: the server exits 0.
  budget   (CUDA) `ferry serve` with a --kv-host-budget below the host KV tier's need: exits non-zero
           before serving, naming the budget.
  bench    (--bench-depths, when the time left holds them at the measured prefill rate) `ferry bench`
           decode at those depths after a real prefill.
The window's hit rate of a phase is hits / (hits + fetched rows) of /slots' kv_window over it.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serve  # noqa: E402  (the sibling script: Server, Stream, Prompts, metrics)

fmt = bench_serve.fmt
fmt_int = bench_serve.fmt_int


class Check:
    """Failures and figures of the run, in the order they were found."""

    def __init__(self):
        self.failures = []
        self.rows = []  # (what, figure, note)
        self.data = {}

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            sys.stderr.write(f"long_context_check: FAIL: {what}\n")
        return ok

    def row(self, what, figure, note=""):
        self.rows.append((what, figure, note))
        sys.stderr.write(f"long_context_check: {what}: {figure}{' (' + note + ')' if note else ''}\n")
        sys.stderr.flush()


# ---- the server -------------------------------------------------------------------------------------

class Serve:
    """`ferry serve` on a free port, its log in `log`."""

    def __init__(self, cmd, log, timeout):
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        url = None
        while url is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ferry serve exited with {self.proc.returncode}:\n{self.tail()}")
            m = re.search(r"listening on (http://[0-9.]+:\d+)", self.output())
            if m:
                url = m.group(1)
            elif time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"ferry serve did not listen within {timeout} s:\n{self.tail()}")
            else:
                time.sleep(0.05)
        self.server = bench_serve.Server(url, timeout=3600)
        while True:
            try:
                if self.server.request("GET", "/health", timeout=10)[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"ferry serve never became ready:\n{self.tail()}")
            time.sleep(0.05)

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def tail(self, n=30):
        return "\n".join(self.output().splitlines()[-n:])

    def stop(self, timeout=60):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def model_args(a):
    if a.model:
        return ["--model", a.model]
    return ["--synthetic", a.shape, "--type", a.type]


def long_shape(a, folder):
    """--synthetic's config with max_position_embeddings raised to hold --ctx (a shorter trained
    context caps the slots silently) and index_topk as asked, written to a temp file."""
    with open(a.synthetic) as f:
        c = json.load(f)
    tc = c.get("text_config", c)
    tc["max_position_embeddings"] = max(int(tc.get("max_position_embeddings", 0)), a.max_position)
    if a.index_topk:
        tc["index_topk"] = a.index_topk
    path = os.path.join(folder, "long_shape.json")
    with open(path, "w") as f:
        json.dump(c, f, indent=1)
    return path, tc


def serve_cmd(a, *extra):
    return [a.ferry, "serve", *model_args(a), "--backend", a.backend, "--port", "0", "--slots", str(a.slots),
            "--ctx", str(a.ctx), "--kv-resident", str(a.kv_resident), "--prefill-chunk", str(a.prefill_chunk),
            "--checkpoint-every", str(a.checkpoint_every), "--checkpoint-budget", str(a.checkpoint_budget),
            *a.serve_arg, *extra]


def plan(a, ctx):
    """`ferry plan --json` of this run at `ctx` tokens a slot (None when it cannot say)."""
    cmd = [a.ferry, "plan", *model_args(a), "--slots", str(a.slots), "--ctx", str(ctx), "--kv-resident",
           str(a.kv_resident), "--prefill-chunk", str(a.prefill_chunk), "--checkpoint-budget", str(a.checkpoint_budget),
           "--json"]
    if a.plan_device_memory:
        cmd += ["--device-memory", a.plan_device_memory]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    try:
        return json.loads(p.stdout)
    except ValueError:
        sys.stderr.write(f"long_context_check: ferry plan: {p.stderr.strip()[:300]}\n")
        return None


def device_memory_mib(pid):
    """GPU memory the process holds (nvidia-smi), else what device 0 has in use (a container may not
    see its own pid there): "N MiB (how)", or "n/a"."""
    if shutil.which("nvidia-smi") is None:
        return "n/a"
    q = ["nvidia-smi", "--format=csv,noheader,nounits"]
    p = subprocess.run(q + ["--query-compute-apps=pid,used_memory"], capture_output=True, text=True, timeout=30)
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            return f"{int(parts[1]):,} MiB (the process)"
    p = subprocess.run(q + ["--query-gpu=memory.used", "--id=0"], capture_output=True, text=True, timeout=30)
    used = p.stdout.strip()
    return f"{int(used):,} MiB (device 0 in use)" if used.isdigit() else "n/a"


# ---- requests ---------------------------------------------------------------------------------------

def body(prompt, max_tokens):
    b = {"prompt": prompt, "stream": True, "return_token_ids": True, "ignore_eos": True, "temperature": 0,
         "stream_options": {"include_usage": True}}
    if max_tokens is not None:
        b.update(max_tokens=max_tokens, min_tokens=max_tokens)
    return b


def streams_at_once(server, labels, prompts, max_tokens, limit):
    """Streams the prompts at once. Past `limit` seconds the slots still busy are released (which ends
    their requests): the second value then says how far their prefill had come, else it is None."""
    out = [bench_serve.Stream(label, len(p)) for label, p in zip(labels, prompts)]

    def run(i):
        s = bench_serve.Server(f"http://{server.host}:{server.port}", timeout=3600)
        s.stream("/v1/completions", body(prompts[i], max_tokens), labels[i], prompt_tokens=len(prompts[i]), s=out[i])
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(prompts))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, limit - (time.monotonic() - t0)))
    if not any(t.is_alive() for t in threads):
        return out, None
    busy = [x for x in slots_report(server).get("slots", []) if x.get("state") != "idle"]
    took = time.monotonic() - t0
    stopped = "; ".join(f"slot {x['id']} {x.get('state')}: {fmt_int(x.get('prefilled_tokens'))} of "
                        f"{fmt_int(x.get('prompt_tokens'))} prefilled, {fmt_int(x.get('generated_tokens'))} out"
                        for x in busy) + f" after {took:.1f} s"
    done = sum(x.get("prefilled_tokens", 0) for x in busy) + sum(len(p) for p, s in zip(prompts, out) if s.token_times)
    stopped += f" ({done / took:,.0f} prompt tokens/s over the phase)"
    for x in busy:
        server.request("POST", f"/slots/{x['id']}?action=release", timeout=60)
    for t in threads:
        t.join(30)
    return out, stopped


def stream(server, label, prompt, max_tokens, limit, c):
    ss, stopped = streams_at_once(server, [label], [prompt], max_tokens, limit)
    if stopped:
        c.expect(False, f"{label}: out of time: {stopped}")
        c.row(f"{label}: out of time", "FAIL", stopped)
    return ss[0]


def decode_tps(s, warmup):
    """Tokens after the first `warmup` over their time (the first token comes out of prefill)."""
    n = s.tokens() - 1 - warmup
    return s.window(warmup, n)[0] if n > 0 else None


def prefill_tps(s):
    if not s.ttft():
        return None
    return (s.prompt_tokens - (s.cached() or 0)) / s.ttft()


def server_prefill_tps(s):
    t = s.timings or {}
    return t["prompt_n"] * 1000 / t["prompt_ms"] if t.get("prompt_ms") and t.get("prompt_n") else None


def slots_report(server):
    status, b, _ = server.request("GET", "/slots", timeout=30)
    return b if status == 200 and isinstance(b, dict) else {}


def window_counts(server):
    w = slots_report(server).get("kv_window", {})
    return w.get("hits", 0), w.get("fetched_rows", 0)


def hit_rate(before, after):
    hits, fetched = after[0] - before[0], after[1] - before[1]
    return hits / (hits + fetched) if hits + fetched > 0 else None


def release_all(server):
    for slot in slots_report(server).get("slots", []):
        server.request("POST", f"/slots/{slot['id']}?action=release", timeout=60)


def stream_ok(c, s, tokens, finish, what):
    ok = c.expect(s.ok(), f"{what}: {s.error or s.http_error}")
    ok = c.expect(not ok or s.tokens() == tokens, f"{what}: {s.tokens()} tokens, expected {tokens}") and ok
    return c.expect(not ok or s.finish_reason == finish,
                    f"{what}: finish_reason {s.finish_reason!r}, expected {finish!r}") and ok


# ---- phases -----------------------------------------------------------------------------------------

class Run:
    def __init__(self, a, c, srv, prompts, started):
        self.a, self.c, self.srv, self.server, self.prompts = a, c, srv, srv.server, prompts
        self.started = started
        self.prefill_rate = None  # tokens/s of the single prompt, for the time left

    def left(self):
        return self.a.deadline - (time.monotonic() - self.started)

    def limit(self):
        """Time a long phase may take: what is left less what the short phases after it need."""
        return max(1.0, self.left() - self.a.reserve)

    def single(self):
        a, c = self.a, self.c
        before = window_counts(self.server)
        p = self.prompts.make(a.prompt)
        s = stream(self.server, "single", p, a.tokens, self.limit(), c)
        ok = stream_ok(c, s, a.tokens, "length", f"single {a.prompt:,}-token prompt")
        rate = hit_rate(before, window_counts(self.server))
        self.prefill_rate = prefill_tps(s)
        c.data["single"] = s.record() | {"decode_tps": decode_tps(s, a.warmup), "prefill_tps": self.prefill_rate,
                                         "server_prefill_tps": server_prefill_tps(s), "window_hit_rate": rate}
        c.row(f"prefill t/s, {a.prompt:,}-token prompt (TTFT s)", f"{fmt(self.prefill_rate, 1)} ({fmt(s.ttft(), 2)})",
              f"server {fmt(server_prefill_tps(s), 1)}; chunks of {a.prefill_chunk:,}")
        c.row(f"decode t/s at depth {a.prompt:,}", fmt(decode_tps(s, a.warmup), 1),
              f"{s.tokens()} tokens; window hit rate {fmt(rate)}")
        return p if ok else None

    def length(self, p):
        a, c = self.a, self.c
        extra = a.ctx - a.length_tail - len(p)
        if not c.expect(extra > 0, f"length: --ctx {a.ctx} leaves no room past the {len(p)}-token prompt"):
            return
        s = stream(self.server, "length", p + self.prompts.make(extra), None, self.limit(), c)
        ok = stream_ok(c, s, a.length_tail, "length",
                       f"length: a {a.ctx - a.length_tail:,}-token prompt without max_tokens")
        u = s.usage or {}
        ok = c.expect(u.get("total_tokens") == a.ctx,
                      f"length: total_tokens {u.get('total_tokens')}, expected {a.ctx}") and ok
        c.data["length"] = s.record()
        c.row("slot reaches --ctx mid-stream", "pass" if ok else "FAIL",
              f"{s.tokens()} tokens, finish_reason {s.finish_reason}, {fmt_int(s.cached())} cached")

    def depths(self, p):
        a, c = self.a, self.c
        res = {}
        for d in sorted(a.depths, reverse=True):
            if d + 1 >= len(p):
                continue
            s = stream(self.server, f"depth{d}", p[:d + 1], a.tokens, self.limit(), c)
            stream_ok(c, s, a.tokens, "length", f"depth {d:,}")
            res[d] = s.record() | {"decode_tps": decode_tps(s, a.warmup)}
            c.row(f"decode t/s at depth {d:,}", fmt(res[d]["decode_tps"], 1),
                  f"{fmt_int(s.cached())} of {d + 1:,} cached, TTFT {fmt(s.ttft(), 2)} s")
        s = stream(self.server, "depth0", self.prompts.make(a.short_prompt), a.tokens, self.limit(), c)
        stream_ok(c, s, a.tokens, "length", f"short {a.short_prompt}-token prompt")
        res[0] = s.record() | {"decode_tps": decode_tps(s, a.warmup)}
        single = c.data.get("single", {}).get("decode_tps")
        ratio = f"; depth {a.prompt:,} is {100 * single / res[0]['decode_tps']:.0f}% of it" \
            if single and res[0]["decode_tps"] else ""
        c.row(f"decode t/s at depth ~0 ({a.short_prompt}-token prompt)", fmt(res[0]["decode_tps"], 1),
              ratio.lstrip("; "))
        c.data["depths"] = res

    def three_size(self):
        """N3: the prompt of the three-slot phase, as the time left allows at the single prompt's rate
        (a shorter prompt prefills no slower a token, so the estimate errs long)."""
        a = self.a
        if not self.prefill_rate:
            return a.prompt
        room = self.left() - a.reserve
        # 15% for what a prefill step of one slot adds with the others' rows in it.
        fits = int(room * self.prefill_rate / a.slots / 1.15) // a.prefill_chunk * a.prefill_chunk
        return max(min(a.prompt, fits), min(a.prompt, a.prefill_chunk))

    def three(self):
        a, c = self.a, self.c
        n3 = self.three_size()
        if n3 < a.prompt:
            c.row("three-slot prompt shrunk", f"{n3:,}",
                  f"{a.slots} x {a.prompt:,} does not fit the {self.left():.0f} s left at "
                  f"{fmt(self.prefill_rate, 0)} t/s")
        release_all(self.server)
        before = window_counts(self.server)
        prompts = [self.prompts.make(n3) for _ in range(a.slots)]
        labels = [f"slot{i + 1}" for i in range(a.slots)]
        t0 = time.monotonic()
        ss, stopped = streams_at_once(self.server, labels, prompts, a.tokens, self.limit())
        if stopped:
            c.expect(False, f"three: out of time: {stopped}")
            c.row(f"{a.slots} slots x {n3:,} at once", "FAIL", f"out of time: {stopped}")
        wall = time.monotonic() - t0
        ok = all([stream_ok(c, s, a.tokens, "length", f"three: {s.label}") for s in ss])
        ttfts = sorted(s.ttft() or 0 for s in ss)
        gaps = [y - x for x, y in zip([0.0] + ttfts, ttfts)]
        each = [n3 / g if g > 0 else None for g in gaps]
        c.data["three"] = {"prompt": n3, "wall_s": wall, "requests": [s.record() for s in ss], "ttft_s": ttfts,
                           "prefill_tps_each": each, "window_hit_rate": hit_rate(before, window_counts(self.server))}
        c.row(f"{a.slots} slots x {n3:,} at once: TTFT s", " / ".join(fmt(t, 2) for t in ttfts),
              f"prefill t/s each (FIFO): {' / '.join(fmt(x, 1) for x in each)}; "
              f"all {fmt(a.slots * n3 / ttfts[-1] if ttfts[-1] else None, 1)}")
        return prompts if ok else None

    def decode3(self, prompts):
        a, c = self.a, self.c
        before = window_counts(self.server)
        ss, stopped = streams_at_once(self.server, [f"again{i + 1}" for i in range(len(prompts))], prompts, a.tokens,
                                      self.left())
        c.expect(stopped is None, f"decode3: out of time: {stopped}")
        ok = all([stream_ok(c, s, a.tokens, "length", f"decode3: {s.label}") for s in ss])
        rate = hit_rate(before, window_counts(self.server))
        per = None
        if ok:
            opened = max(s.token_times[min(a.warmup, len(s.token_times) - 1)] for s in ss)
            closed = min(s.token_times[-1] for s in ss)
            if closed > opened:
                per = [s.tokens_in(opened, closed) / (closed - opened) for s in ss]
        c.data["decode3"] = {"requests": [s.record() for s in ss], "per_slot_tps": per, "window_hit_rate": rate}
        n = len(prompts[0])
        c.row(f"decode t/s, {len(ss)} slots at depth {n:,} at once",
              " / ".join(fmt(x, 1) for x in per) if per else "n/a",
              f"aggregate {fmt(sum(per) if per else None, 1)}; cached {' / '.join(fmt_int(s.cached()) for s in ss)}; "
              f"window hit rate {fmt(rate)}")

    def after(self, pl):
        a, c = self.a, self.c
        r = slots_report(self.server)
        m = bench_serve.Bench(None, self.server, None).metrics()
        kv = {k: v for k, v in m.items() if k.startswith("ferry_stage_kv_")}
        c.data["after"] = {"slots": r.get("slots"), "kv_window": r.get("kv_window"), "metrics": kv,
                           "device_memory_mib": device_memory_mib(self.srv.proc.pid)}
        host = [x.get("host_kv_bytes", 0) for x in r.get("slots", [])]
        c.row("host KV bytes per slot (/slots)", " / ".join(f"{b / 2**20:,.1f} MiB" for b in host),
              f"held {' / '.join(fmt_int(x.get('held_tokens')) for x in r.get('slots', []))} tokens")
        w = r.get("kv_window", {})
        c.row("resident window (/slots kv_window)", f"hit rate {fmt(w.get('hit_rate'))}",
              f"{fmt_int(w.get('window_rows'))} window rows, {fmt_int(w.get('hits'))} hits, "
              f"{fmt_int(w.get('fetched_rows'))} rows fetched ({fmt_int(w.get('fetched_bytes'))} B); /metrics "
              f"ferry_stage_kv_hit_ratio {fmt(kv.get('ferry_stage_kv_hit_ratio'))}")
        mem = c.data["after"]["device_memory_mib"]
        if pl:
            st = pl["stages"]
            dev, hst = sum(s["device_kv_bytes"] for s in st), sum(s["host_kv_bytes"] for s in st)
            c.row("plan: device / host KV per slot", f"{dev / a.slots / 2**20:,.1f} / {hst / a.slots / 2**20:,.1f} MiB",
                  f"ferry plan at --ctx {a.ctx:,}; device memory now {mem} (nvidia-smi)")
        if self.windowed():
            c.expect(w.get("window_rows", 0) > 0, "the host KV tier is not used: /slots kv_window.window_rows is 0")
            past = [x["id"] for x in r.get("slots", [])
                    if x.get("held_tokens", 0) > a.kv_resident and not x.get("host_kv_bytes")]
            c.expect(not past, f"slots {past} hold more than --kv-resident {a.kv_resident} tokens but no host KV bytes")
            c.expect(kv.get("ferry_stage_kv_fetched_rows_total", 0) + w.get("hits", 0) > 0,
                     "no decode selection went through the window (no hits, nothing fetched)")

    def windowed(self):
        return self.a.backend == "cuda" and self.a.kv_resident and self.a.ctx > self.a.kv_resident

    def refuse(self):
        a, c = self.a, self.c
        n = min(1000, a.ctx // 2)
        cases = [("a prompt of ctx + 1 tokens", self.prompts.make(a.ctx + 1), 4, [str(a.ctx + 1), str(a.ctx)]),
                 ("a prompt whose max_tokens passes ctx", self.prompts.make(n), a.ctx - n + 1,
                  [str(n), str(a.ctx - n + 1), str(a.ctx)])]
        for what, p, max_tokens, numbers in cases:
            req = {"prompt": p, "max_tokens": max_tokens}
            status, b, _ = self.server.request("POST", "/v1/completions", req, timeout=max(10, self.left()))
            msg = (b.get("error") or {}).get("message", "") if isinstance(b, dict) else str(b)
            ok = c.expect(status == 400 and all(n in msg for n in numbers),
                          f"refuse {what}: HTTP {status} {msg[:200]!r}, expected 400 naming {numbers}")
            c.row(f"refused: {what}", "pass" if ok else "FAIL", f"HTTP {status}: {msg[:120]}")


def budget_case(a, c, folder, need_bytes, left):
    """A --kv-host-budget below the tier's need: serve must exit non-zero before listening, naming it."""
    budget = max(need_bytes / 4, 2**20) / 2**30
    log = os.path.join(folder, "budget.log")
    try:
        p = subprocess.run(serve_cmd(a, "--kv-host-budget", f"{budget:.6f}"), stdout=open(log, "w"),
                           stderr=subprocess.STDOUT, timeout=max(5.0, left))
    except subprocess.TimeoutExpired:
        c.expect(False, f"budget: serve with --kv-host-budget {budget:.4f} GiB still ran after {max(5.0, left):.0f} s")
        return
    out = open(log, errors="replace").read()
    named = "--kv-host-budget" in out and "host KV tier" in out
    ok = c.expect(p.returncode != 0 and named and "cannot serve" in out,
                  f"budget: serve with --kv-host-budget {budget:.4f} GiB exited {p.returncode}; "
                  f"log: {out.strip()[-300:]!r}")
    line = next((x for x in out.splitlines() if "--kv-host-budget" in x), "")
    c.row(f"refused at start: --kv-host-budget {budget * 1024:.1f} MiB", "pass" if ok else "FAIL",
          f"exit {p.returncode}: {line.strip()[:140]}")


def bench_case(a, c, rate, left):
    """`ferry bench` decode after a real prefill at the first of --bench-depths that the time left
    holds at `rate` (each depth is prefilled from empty; 15 s for the start and warm-up)."""
    depths, need = [], 15.0
    for d in a.bench_depths:
        if not rate or need + 1.5 * d / rate > left:
            break
        depths.append(d)
        need += 1.5 * d / rate
    skipped = a.bench_depths[len(depths):]
    if skipped:
        c.row("ferry bench decode at depths " + ", ".join(f"{d:,}" for d in skipped), "skipped",
              f"{left:.0f} s left; at {fmt(rate, 0)} t/s prefill they need more")
    if not depths:
        return
    cmd = [a.ferry, "bench", *model_args(a), "--backend", a.backend, "--kv-resident", str(a.kv_resident), "-p", "512",
           "-n", "32", "-r", "1", "-d", ",".join(str(d) for d in depths), "--no-bandwidth"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(5, left - 5))
    except subprocess.TimeoutExpired:
        c.row("ferry bench decode at depths", "timed out", " ".join(cmd[2:]))
        return
    rows = [x for x in p.stdout.splitlines() if re.match(r"\|\s*tg32 @ d\d+", x)]
    c.data["bench"] = {"cmd": cmd, "rc": p.returncode, "rows": rows}
    c.expect(p.returncode == 0 and len(rows) == len(depths),
             f"ferry bench exited {p.returncode}: {p.stderr.strip()[-300:]}")
    for x in rows:
        cells = [y.strip() for y in x.strip("|").split("|")]
        c.row(f"ferry bench {cells[0]}", f"{cells[1]} t/s", "a real prefill to the depth; -p 512 -n 32 -r 1")


# ---- main -------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--ferry", required=True, help="the ferry binary")
    p.add_argument("--backend", required=True, choices=["cpu", "cuda"])
    m = p.add_mutually_exclusive_group(required=True)
    m.add_argument("--model", help="a GGUF file")
    m.add_argument("--synthetic", help="config.json of the shape, served with synthetic weights (CUDA)")
    p.add_argument("--type", default="q4_k", help="with --synthetic: the weights' type")
    p.add_argument("--index-topk", type=int, help="with --synthetic: the indexer's top-k (default: the config's)")
    p.add_argument("--max-position", type=int, default=1048576, help="with --synthetic: the context the shape is given")
    p.add_argument("--slots", type=int, default=3)
    p.add_argument("--ctx", type=int, default=524288)
    p.add_argument("--kv-resident", type=int, default=32768)
    p.add_argument("--prefill-chunk", type=int, default=4096, help="serve's: prompt tokens a step")
    p.add_argument("--checkpoint-every", type=int, default=32768, help="serve's: the depths' prefix-cache points")
    p.add_argument("--checkpoint-budget", type=float, default=24,
                   help="serve's, GiB: room for every checkpoint of the run (the depths and decode3 resume from them)")
    p.add_argument("--prompt", type=int, default=500000, help="N: the long prompt")
    p.add_argument("--tokens", type=int, default=128, help="T: tokens each stream decodes")
    p.add_argument("--warmup", type=int, default=8, help="decode tokens left out of a decode t/s")
    p.add_argument("--depths", default="32768,131072", help="decode depths below N, from N's prefix")
    p.add_argument("--short-prompt", type=int, default=512, help="the depth-0 reference prompt")
    p.add_argument("--length-tail", type=int, default=16, help="L: tokens the length case has before --ctx")
    p.add_argument("--id-range", default="256:4096", help="LO:HI of the random prompt ids")
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--deadline", type=float, default=3600,
                   help="seconds for everything; the three-slot prompt shrinks to fit")
    p.add_argument("--reserve", type=float, default=25, help="seconds kept for the phases after the three-slot prefill")
    p.add_argument("--host-budget-case", choices=["auto", "on", "off"], default="auto", help="auto: on CUDA")
    p.add_argument("--bench-depths", default="", help="ferry bench decode depths, run when the time left holds them")
    p.add_argument("--plan-device-memory", help="ferry plan's --device-memory (default: the visible GPUs)")
    p.add_argument("--serve-arg", action="append", default=[], help="one more serve argument (repeatable)")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--log-dir", help="keep the server logs here (default: a temp folder, removed)")
    a = p.parse_args(argv)
    a.depths = [int(x) for x in a.depths.split(",") if x]
    a.bench_depths = [int(x) for x in a.bench_depths.split(",") if x]
    if a.prompt + a.tokens > a.ctx:
        p.error(f"--prompt {a.prompt} + --tokens {a.tokens} is more than --ctx {a.ctx}")
    return a


def summary(a, c, seconds):
    out = [f"long-context check: {a.backend}, {'--model ' + a.model if a.model else '--synthetic ' + a.synthetic}"
           f"{' index_topk ' + str(a.index_topk) if a.index_topk else ''}, --slots {a.slots} --ctx {a.ctx:,} "
           f"--kv-resident {a.kv_resident:,}, N {a.prompt:,}, T {a.tokens}; {seconds:.1f} s", "",
           "| what | figure | note |", "| --- | --- | --- |"]
    out += [f"| {w} | {f} | {n} |" for w, f, n in c.rows]
    out += ["", "result: " + ("PASS" if not c.failures else f"FAIL ({len(c.failures)}): " + "; ".join(c.failures))]
    return "\n".join(out) + "\n"


def main(argv=None):
    a = parse_args(argv if argv is not None else sys.argv[1:])
    c = Check()
    folder = a.log_dir or tempfile.mkdtemp(prefix="long-context-")
    os.makedirs(folder, exist_ok=True)
    started = time.monotonic()
    if a.synthetic:
        a.shape, tc = long_shape(a, folder)
        c.data["shape"] = {k: tc.get(k) for k in ("index_topk", "index_kpool", "index_n_heads", "index_head_dim",
                                                  "kv_lora_rank", "num_hidden_layers", "max_position_embeddings")}
    pl = plan(a, a.ctx)
    c.data["plan"] = pl
    srv = None
    try:
        srv = Serve(serve_cmd(a), os.path.join(folder, "serve.log"), timeout=min(300, a.deadline))
        server = srv.server
        info = server.request("GET", "/v1/models", timeout=30)[1]["data"][0]
        c.expect(info.get("max_model_len") == a.ctx,
                 f"--ctx {a.ctx} not taken: /v1/models says max_model_len {info.get('max_model_len')}")
        c.row("slots served (max_model_len)", f"{a.slots} x {fmt_int(info.get('max_model_len'))}",
              f"device memory at start {device_memory_mib(srv.proc.pid)} (nvidia-smi)")
        run = Run(a, c, srv, bench_serve.Prompts(server, info["id"], a.seed, a.id_range), started)
        p = run.single()
        if p is not None:
            run.length(p)
            run.depths(p)
        prompts = run.three() if run.prefill_rate else None
        if prompts is not None:
            run.decode3(prompts)
        run.after(pl)
        run.refuse()
        code = srv.stop()
        c.expect(code == 0, f"ferry serve exited {code} after SIGTERM")
        c.row("clean stop (SIGTERM)", "pass" if code == 0 else "FAIL", f"exit {code}")
        rate = run.prefill_rate
    except Exception as e:  # noqa: BLE001  (whatever went wrong goes into the table, and the exit status)
        c.expect(False, f"{type(e).__name__}: {e}")
        rate = None
    finally:
        if srv is not None:
            srv.kill()
    if a.host_budget_case == "on" or (a.host_budget_case == "auto" and a.backend == "cuda"):
        need = sum(s["host_kv_bytes"] for s in pl["stages"]) if pl else 0
        if c.expect(need > 0, "budget: ferry plan reports no host KV tier to refuse a budget for"):
            budget_case(a, c, folder, need, a.deadline - (time.monotonic() - started))
    else:
        c.row("refused at start: --kv-host-budget", "n/a", f"the {a.backend} backend has no host KV tier")
    if a.bench_depths:
        bench_case(a, c, rate, a.deadline - (time.monotonic() - started))
    seconds = time.monotonic() - started
    text = summary(a, c, seconds)
    sys.stdout.write(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "seconds": seconds, "failures": c.failures, "rows": c.rows, "data": c.data}, f,
                      indent=1, default=str)
    if not a.log_dir:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
