#!/usr/bin/env python3
"""The serving benchmark: the user's table (shared/SEED.md) measured as a client sees it, against any
OpenAI-compatible server URL. It starts nothing (tools/bench_serve.sh starts `ferry serve` and runs
it); Python's standard library only, so it runs from any machine that reaches the server.

Prompts are token ids sent to /v1/completions, so their lengths are exact: ids drawn from the server's
own tokenization of a text (a completions request with `return_token_ids` answers `prompt_token_ids`),
or from --id-range. Every request streams with `ignore_eos` and `min_tokens` so that decode runs the
full length, `return_token_ids` so that each SSE event says how many tokens it carries, and
`stream_options.include_usage`; the server's own `timings` (llama.cpp's fields, which ferry sends) are
reported beside the client's figures where present. Definitions: DEFINITIONS below, printed under the
table. Progress (prompt sent, prefill, tokens so far, ETA) goes to stderr; the table to stdout.

This file is longer than the house limit of ~800 lines on purpose: one self-contained script can be
copied to any client machine and run with nothing installed.
"""
import argparse
import bisect
import http.client
import json
import math
import os
import random
import re
import signal
import socket
import statistics
import sys
import threading
import time
import urllib.parse

SEED_V100 = {  # the user's Maya-L (IQ3_S mix) figures on 4 x V100 (shared/SEED.md), for --compare-seed
    "warm.decode": "36.895", "warm.prefill": "790.054", "warm.ttft": "41.493 / 41.547",
    "warm.e2e": "85.146", "warm.gap": "44.009 / 66.569", "warm.mtp": "88.27%",
    "long.decode": "27.963", "long.prefill": "1294.617", "long.ttft": "385.027 / 385.235",
    "c3.per_slot": "25.364 / 25.047 / 25.107", "c3.aggregate": "75.321", "c3.jain": "1.000000",
    "stop": "61.012", "release": "29.567", "lifecycle": "pass / pass", "shutdown": "-",
    "cache.first": ("32,786 / 0", "28.746", "29.672"), "cache.same": ("32,786 / 32,785", "0.082", "0.797"),
    "cache.turn": ("32,808 / 32,785", "1.795", "2.206"), "cache.tool": ("261 / 206", "3.217 (first time 9.249)", "-"),
}

DEFINITIONS = """\
- Client times are taken on arrival of SSE events; each token of an event gets the event's time.
  TTFT: request sent -> first event carrying a token. End-to-end: request sent -> end of the stream.
- decode tok/s: tokens t[0..] (t[0] comes out of prefill); after W warm-up tokens, the window is the
  next N: N / (t[W+N] - t[W]) (the user's W = 512, N = 1,024, so 1 + 512 + 1,024 = 1,537 out).
- prefill tok/s: uncached prompt tokens / prefill time; client: / TTFT, server: prompt_n / prompt_ms.
- token gap p95 / max: gaps between consecutive token-carrying events inside the decode window.
- C3: three concurrent requests of the same size. The overlap window opens when all three are past
  their W warm-up tokens and closes when each has N tokens in it (then the client leaves); per-slot
  tok/s = a slot's tokens in the window / its length, aggregate = their sum; Jain = (sum x)^2 / (n sum x^2).
- STOP -> DONE: a stream past its first K tokens; STOP = the client sends the cancel
  (ferry: POST /v1/requests/{id}/cancel), DONE = the stream's terminal event ([DONE]) arrives.
  Disconnect variant: STOP = the client closes the connection, DONE = GET /slots shows the slot idle.
- RELEASE -> ACK: POST /slots/{id}?action=release on an idle slot holding a cached prompt -> its
  response arrives (the slot then holds 0 tokens).
- cancel then reuse: a cancelled stream's prompt sent again runs to its full length, slots end idle.
  1 -> 3 -> 1: one stream decodes alone, two join (all three decode at once), they finish, the first
  goes on alone; every stream gets all its tokens.
- clean shutdown (when the wrapper started the server): SIGTERM with a stream running; new requests
  get 503, the running stream ends with a terminal event, the process exits 0.
- warm = a warm-up request first (expert cache warm), slots released (prompt KV reset), unique prompt.
  long ("fresh" when it is the first request after the prompt-id lookup, as it is when the wrapper
  has just started the server): the same measurement with a long prompt and no warm-up.
- Prompt cache: prefill s = the server's prompt_ms (else the client's TTFT); the tool continuation
  is a chat request that adds the assistant's tool call and the tool's result to the first one's
  messages; "uncached" = the same continuation with cache_prompt false."""


def fmt(x, digits=3):
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    return f"{x:.{digits}f}"


def fmt_int(n):
    return "n/a" if n is None else f"{n:,}"


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def jain(xs):
    xs = [x for x in xs if x is not None]
    if not xs or sum(x * x for x in xs) == 0:
        return None
    # At most 1 by Cauchy-Schwarz; equal rates can round a hair above it.
    return min(1.0, sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)))


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- HTTP -------------------------------------------------------------------------------------------

class Stream:
    """One streamed request as the client saw it."""

    def __init__(self, label, prompt_tokens):
        self.label = label
        self.prompt_tokens = prompt_tokens  # what was sent (chat: None, the server counts)
        self.sent_at = None
        self.status = None
        self.http_error = None
        self.error = None          # an error event in the stream
        self.request_id = None
        self.token_times = []      # one per token
        self.event_times = []      # one per token-carrying event
        self.token_ids = []
        self.counted_by = "token_ids"
        self.finish_reason = None
        self.usage = None
        self.timings = None
        self.done_at = None        # [DONE] arrived
        self.ended_at = None       # the stream ended (any way)
        self.closed_at = None      # the client closed it
        self.max_tokens = None

    # Client-side figures.
    def ttft(self):
        return self.token_times[0] - self.sent_at if self.token_times else None

    def e2e(self):
        return self.ended_at - self.sent_at if self.ended_at and self.sent_at else None

    def tokens(self):
        return len(self.token_times)

    def tokens_after(self, t):
        return len(self.token_times) - bisect.bisect_right(self.token_times, t)

    def tokens_in(self, a, b):
        return bisect.bisect_right(self.token_times, b) - bisect.bisect_right(self.token_times, a)

    def decode_span(self):
        return self.token_times[-1] - self.token_times[0] if len(self.token_times) > 1 else None

    def window(self, warmup, n):
        """(tok/s, gaps in ms) over tokens warmup .. warmup + n, or (None, []) when too short."""
        t = self.token_times
        if len(t) < warmup + n + 1 or n <= 0:
            return None, []
        a, b = t[warmup], t[warmup + n]
        gaps = [(y - x) * 1000 for x, y in zip(self.event_times, self.event_times[1:]) if x >= a and y <= b]
        return (n / (b - a) if b > a else None), gaps

    def cached(self):
        u = self.usage or {}
        details = u.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            return details["cached_tokens"]
        if self.timings and self.timings.get("cache_n") is not None:
            return self.timings["cache_n"]
        return None

    def server_prompt_tokens(self):
        return (self.usage or {}).get("prompt_tokens")

    def ok(self):
        return self.status == 200 and self.error is None and self.http_error is None

    def record(self):
        """The raw figures of this request, for the JSON output and the tests."""
        return {
            "label": self.label, "request_id": self.request_id, "status": self.status,
            "error": self.error or self.http_error, "finish_reason": self.finish_reason,
            "prompt_tokens_sent": self.prompt_tokens, "max_tokens": self.max_tokens,
            "usage": self.usage, "timings": self.timings, "tokens_counted": self.tokens(),
            "counted_by": self.counted_by,
            "client": {"ttft_s": self.ttft(), "e2e_s": self.e2e(), "decode_s": self.decode_span(),
                       "closed_by_client": self.closed_at is not None},
        }


class Server:
    def __init__(self, url, api_key=None, timeout=3600):
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme != "http":
            raise SystemExit(f"--url {url}: only http:// is supported")
        self.host, self.port = u.hostname, u.port or 80
        self.root = u.path.rstrip("/")
        if self.root.endswith("/v1"):
            self.root = self.root[:-3]
        self.api_key = api_key
        self.timeout = timeout
        self.has_slots = False
        self.has_cancel = False

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def connect(self, timeout=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def request(self, method, path, body=None, timeout=None):
        """(status, parsed JSON or text, seconds from sending to the whole answer)."""
        conn = self.connect(timeout)
        try:
            start = time.perf_counter()
            conn.request(method, self.root + path, json.dumps(body) if body is not None else None, self.headers())
            r = conn.getresponse()
            data = r.read()
            elapsed = time.perf_counter() - start
        finally:
            conn.close()
        text = data.decode("utf-8", "replace")
        try:
            return r.status, json.loads(text), elapsed
        except ValueError:
            return r.status, text, elapsed

    def stream(self, path, body, label, prompt_tokens=None, on_tokens=None, progress=None, s=None):
        """Streams one request (into `s` when given). `on_tokens(stream)` runs after each
        token-carrying event; when it returns "close", the client closes the connection there (a
        client that leaves)."""
        s = s or Stream(label, prompt_tokens)
        s.max_tokens = body.get("max_tokens")
        if progress:
            progress.add(s)
        conn = None
        try:
            conn = self.connect()
            s.sent_at = time.perf_counter()
            conn.request("POST", self.root + path, json.dumps(body), self.headers())
            r = conn.getresponse()
            s.status = r.status
            if r.status != 200:
                s.http_error = r.read().decode("utf-8", "replace")[:500]
                s.ended_at = time.perf_counter()
                return s
            while True:
                line = r.readline()
                now = time.perf_counter()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    s.done_at = now
                    continue
                try:
                    obj = json.loads(payload)
                except ValueError:
                    continue
                if self.absorb(s, obj, now) and on_tokens is not None and on_tokens(s) == "close":
                    s.closed_at = time.perf_counter()
                    break
            if s.done_at is None and s.closed_at is None and s.error is None:
                s.http_error = "the stream ended without [DONE] (the connection closed)"
        except (OSError, http.client.HTTPException) as e:
            if s.closed_at is None:
                s.http_error = f"{type(e).__name__}: {e}"
        finally:
            if conn is not None:
                conn.close()
            s.ended_at = s.done_at or s.closed_at or time.perf_counter()
            if progress:
                progress.remove(s)
        if s.usage and s.counted_by == "chunks" and s.usage.get("completion_tokens") not in (None, s.tokens()):
            s.counted_by = "chunks (usage says %s tokens)" % s.usage.get("completion_tokens")
        return s

    @staticmethod
    def absorb(s, obj, now):
        """Takes one SSE event into `s`; True when it carried tokens."""
        if "error" in obj:
            s.error = obj["error"].get("message") if isinstance(obj["error"], dict) else str(obj["error"])
            return False
        s.request_id = s.request_id or obj.get("id")
        if obj.get("usage"):
            s.usage = obj["usage"]
        if obj.get("timings"):
            s.timings = obj["timings"]
        choices = obj.get("choices") or []
        if not choices:
            return False
        c = choices[0]
        if c.get("finish_reason"):
            s.finish_reason = c["finish_reason"]
        ids = c.get("token_ids")
        if isinstance(ids, list):
            n = len(ids)
            s.token_ids.extend(ids)
        else:
            delta = c.get("delta") or {}
            text = c.get("text") or delta.get("content") or delta.get("reasoning_content") or \
                delta.get("reasoning") or delta.get("tool_calls")
            n = 1 if text else 0
            if n:
                s.counted_by = "chunks"
        if n == 0:
            return False
        s.token_times.extend([now] * n)
        s.event_times.append(now)
        return True


# ---- progress ---------------------------------------------------------------------------------------

class Progress:
    """A status line on stderr: prompt sent, prefill (the server's /slots count where it has one),
    tokens so far, rate and ETA. Rewritten in place on a terminal, a line every 10 s otherwise."""

    def __init__(self, server, mode):
        self.server = server
        self.tty = sys.stderr.isatty()
        self.enabled = mode == "on" or (mode == "auto" and self.tty)
        self.streams = []
        self.case = ""
        self.prefill_rate = None  # tokens/s, learnt from finished requests
        self.slots_text = ""
        self.prefilling = []  # (prefilled, prompt) of the server's prefilling slots
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.last_line = 0.0
        if self.enabled:
            threading.Thread(target=self.run, daemon=True).start()

    def add(self, s):
        with self.lock:
            self.streams.append(s)
        sent = f"prompt {fmt_int(s.prompt_tokens)} sent" if s.prompt_tokens else "chat prompt sent"
        self.say(f"[{self.case}] {s.label}: {sent}, max_tokens {fmt_int(s.max_tokens)}")

    def remove(self, s):
        with self.lock:
            if s in self.streams:
                self.streams.remove(s)
            self.slots_text, self.prefilling = "", []  # the next poll says what is still prefilling
        if s.ok() and s.ttft() and s.prompt_tokens and (s.cached() or 0) < s.prompt_tokens:
            self.prefill_rate = (s.prompt_tokens - (s.cached() or 0)) / s.ttft()
        how = "client left" if s.closed_at else (s.error or s.http_error or s.finish_reason or "ended")
        self.say(f"[{self.case}] {s.label}: {s.tokens():,} tokens, TTFT {fmt(s.ttft())} s, "
                 f"end-to-end {fmt(s.e2e())} s ({how})")

    def say(self, text):
        if self.enabled:
            sys.stderr.write(("\r\033[K" if self.tty else "") + text + "\n")
            sys.stderr.flush()

    def line(self):
        now = time.perf_counter()
        parts = []
        with self.lock:
            streams = list(self.streams)
        waiting = [s for s in streams if s.sent_at is not None and not s.token_times]
        for s in streams:
            if s.sent_at is None:
                continue
            if not s.token_times:
                eta = ""
                if len(waiting) == 1 and len(self.prefilling) == 1 and self.prefilling[0][0] > 0:
                    done, total = self.prefilling[0]  # the server's count: the best estimate there is
                    eta = f", ETA {(total - done) / (done / (now - s.sent_at)):.0f} s"
                elif self.prefill_rate and s.prompt_tokens:
                    eta = f", ETA {max(0, s.prompt_tokens / self.prefill_rate - (now - s.sent_at)):.0f} s"
                sent = f"prompt {fmt_int(s.prompt_tokens)} sent" if s.prompt_tokens else "prompt sent"
                parts.append(f"{s.label}: {sent}, prefill {now - s.sent_at:.1f} s{eta}")
            else:
                n, total = s.tokens(), s.max_tokens or 0
                span = s.token_times[-1] - s.token_times[0]
                rate = (n - 1) / span if n > 1 and span > 0 else None
                eta = f", ETA {(total - n) / rate:.0f} s" if rate and total else ""
                parts.append(f"{s.label}: {n:,}/{total:,} tokens, {fmt(rate, 1)} t/s{eta}")
        if not parts:
            return None
        text = f"[{self.case}] " + " | ".join(parts)
        if self.slots_text and any(not s.token_times for s in streams):
            text += f" | server: {self.slots_text}"
        return text

    def poll_slots(self):
        """The server's prefill progress (ferry's GET /slots) while a stream waits for its first token."""
        with self.lock:
            waiting = any(s.sent_at is not None and not s.token_times for s in self.streams)
        if not (waiting and self.server.has_slots):
            self.slots_text, self.prefilling = "", []
            return
        try:
            status, body, _ = self.server.request("GET", "/slots", timeout=5)
        except OSError:
            return
        if status == 200 and isinstance(body, dict):
            busy = [x for x in body.get("slots", []) if x.get("state") == "prefilling"]
            self.prefilling = [(x.get("prefilled_tokens", 0), x.get("prompt_tokens", 0)) for x in busy]
            self.slots_text = ", ".join(
                f"slot {x['id']} prefilled {x.get('prefilled_tokens', 0):,}/{x.get('prompt_tokens', 0):,}" for x in busy)

    def run(self):
        last_poll = 0.0
        while not self.stop.wait(0.25):
            now = time.perf_counter()
            if now - last_poll >= 1.0:
                self.poll_slots()
                last_poll = now
            text = self.line()
            if text is None:
                continue
            if self.tty:
                sys.stderr.write("\r\033[K" + text[: os.get_terminal_size(2).columns - 1])
                sys.stderr.flush()
            elif now - self.last_line >= 10:
                self.last_line = now
                sys.stderr.write(text + "\n")
                sys.stderr.flush()

    def close(self):
        self.stop.set()
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")


# ---- prompts ----------------------------------------------------------------------------------------

PROMPT_TEXT = (
    "The harbour at dawn was quiet except for the gulls and the slow knock of hulls against the pier. "
    "Fishermen checked their nets, a baker opened his shutters, and the ferry's engine coughed twice "
    "before it settled into a steady rhythm. Passengers carried bags of apples, crates of tools, a cello "
    "in a battered case, letters to be posted on the far shore. The captain counted them aboard, looked "
    "at the grey sky over the hills, and decided the crossing would take forty minutes if the wind held. "
    "In the cabin a child traced the map of the islands with one finger while her grandfather explained "
    "which lighthouse was the oldest, why the channel was dredged every spring, and how the tides had "
    "once stranded a cargo of oranges on the sandbank for three whole days. 1 2 3 4 5 6 7 8 9 10; "
    "def crossing(minutes: int) -> str: return f'{minutes} min' # {\"wind\": 12, \"waves\": 0.8}")


class Prompts:
    """Exact-length prompts of token ids, unique per request (a seeded stream of random ids from the
    pool), so that nothing is reused from the prefix cache by accident."""

    def __init__(self, server, model, seed, id_range=None, text_file=None):
        self.rng = random.Random(seed)
        if id_range:
            lo, hi = (int(x) for x in id_range.split(":"))
            self.pool = list(range(lo, hi))
            self.source = f"ids {lo}..{hi - 1}"
            return
        text = open(text_file, encoding="utf-8").read() if text_file else PROMPT_TEXT
        status, body, _ = server.request("POST", "/v1/completions", {
            "model": model, "prompt": text, "max_tokens": 1, "return_token_ids": True})
        ids = None
        if status == 200 and isinstance(body, dict):
            choice = (body.get("choices") or [{}])[0]
            ids = choice.get("prompt_token_ids") or body.get("prompt_token_ids")
        if not ids:
            raise SystemExit("cannot build token-id prompts: the server's completions answer has no "
                             f"prompt_token_ids (HTTP {status}: {str(body)[:200]}); pass --id-range LO:HI")
        self.pool = sorted(set(ids))
        self.source = f"the server's tokenization of {'--text-file' if text_file else 'a built-in text'} " \
                      f"({len(self.pool)} distinct ids)"

    def make(self, n):
        return [self.rng.choice(self.pool) for _ in range(n)]


# ---- the benchmark ----------------------------------------------------------------------------------

class Bench:
    def __init__(self, args, server, progress):
        self.a = args
        self.server = server
        self.progress = progress
        self.results = {}
        self.requests = []  # every request's raw record
        self.first_request_sent = False

    # -- helpers
    def body(self, prompt, max_tokens, **extra):
        b = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens,
             "ignore_eos": True, "stream": True, "return_token_ids": True,
             "stream_options": {"include_usage": True}}
        if self.a.temperature is not None:
            b["temperature"] = self.a.temperature
        b.update(extra)
        return b

    def run_stream(self, label, prompt, max_tokens, on_tokens=None, **extra):
        s = self.server.stream("/v1/completions", self.body(prompt, max_tokens, **extra), label,
                               prompt_tokens=len(prompt), on_tokens=on_tokens, progress=self.progress)
        self.requests.append(s.record())
        return s

    def run_chat(self, label, messages, tools, max_tokens, **extra):
        b = {"model": self.model, "messages": messages, "tools": tools, "max_tokens": max_tokens,
             "min_tokens": max_tokens, "ignore_eos": True, "stream": True, "return_token_ids": True,
             "stream_options": {"include_usage": True}}
        if self.a.temperature is not None:
            b["temperature"] = self.a.temperature
        b.update(extra)
        s = self.server.stream("/v1/chat/completions", b, label, progress=self.progress)
        self.requests.append(s.record())
        return s

    def slots(self):
        if not self.server.has_slots:
            return None
        status, body, _ = self.server.request("GET", "/slots", timeout=10)
        return body.get("slots") if status == 200 and isinstance(body, dict) else None

    def release_all(self):
        """Drops every cached prompt (prompt KV reset) where the server can: ferry's slot release."""
        for slot in self.slots() or []:
            if slot.get("held_tokens", 0) > 0 and slot.get("state") == "idle":
                self.server.request("POST", f"/slots/{slot['id']}?action=release", timeout=30)

    def wait_idle(self, timeout=30):
        deadline = time.perf_counter() + timeout
        while self.server.has_slots and time.perf_counter() < deadline:
            slots = self.slots() or []
            if all(x.get("state") == "idle" for x in slots):
                return True
            time.sleep(0.005)
        return not self.server.has_slots

    def metrics(self):
        try:
            status, body, _ = self.server.request("GET", "/metrics", timeout=10)
        except OSError:
            return {}
        if status != 200 or not isinstance(body, str):
            return {}
        out = {}
        for line in body.splitlines():
            m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$", line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
        return out

    @staticmethod
    def mtp_acceptance(stream, before, after):
        """Draft acceptance where the server reports it: llama.cpp's timings (draft_n,
        draft_n_accepted), or speculative-decoding counters in /metrics (vLLM's names, or any
        `*draft*` / `*accepted*` pair)."""
        t = stream.timings or {}
        if t.get("draft_n"):
            return t.get("draft_n_accepted", 0) / t["draft_n"], "timings.draft_n_accepted / draft_n"
        names = [n for n in after if re.search(r"(spec_decode|mtp|draft)", n)]
        acc = [n for n in names if "accept" in n and n.endswith("_total")]
        drafts = [n for n in names if "draft" in n and "accept" not in n and n.endswith("tokens_total")]
        if acc and drafts:
            da = after[acc[0]] - before.get(acc[0], 0)
            dd = after[drafts[0]] - before.get(drafts[0], 0)
            if dd > 0:
                return da / dd, f"/metrics {acc[0]} / {drafts[0]}"
        return None, "not reported by the server"

    def tail(self, prompt_len, tokens):
        """max_tokens for a stream that is stopped early: as asked, within the slot's context."""
        return min(tokens, self.ctx - prompt_len - 1) if self.ctx else tokens

    def out_tokens(self):
        return 1 + self.a.warmup_decode + self.a.window

    # -- cases
    def single(self, key, prompt_len):
        """warm and long: one request of prompt_len in, 1 + W + N out."""
        a = self.a
        fresh = not self.first_request_sent
        if key == "warm":
            self.progress.case = "warm-up"
            self.run_stream("warm-up", self.prompts.make(a.warmup_prompt), a.warmup_tokens)
            self.release_all()
            fresh = False
        self.progress.case = key
        before = self.metrics()
        self.first_request_sent = True
        s = self.run_stream(key, self.prompts.make(prompt_len), self.out_tokens())
        after = self.metrics()
        rate, gaps = s.window(a.warmup_decode, a.window)
        t = s.timings or {}
        uncached = prompt_len - (s.cached() or 0)
        mtp, mtp_source = self.mtp_acceptance(s, before, after)
        r = {
            "prompt_tokens": prompt_len, "out_tokens": self.out_tokens(), "fresh": fresh,
            "ok": s.ok() and s.tokens() == self.out_tokens(), "error": s.error or s.http_error,
            "cached_tokens": s.cached(), "tokens": s.tokens(),
            "client": {"decode_tps": rate, "prefill_tps": uncached / s.ttft() if s.ttft() else None,
                       "ttft_s": s.ttft(), "e2e_s": s.e2e(),
                       "gap_p95_ms": percentile(gaps, 0.95), "gap_max_ms": max(gaps) if gaps else None,
                       "decode_tps_whole": (s.tokens() - 1) / s.decode_span() if s.decode_span() else None},
            "server": None, "mtp_acceptance": mtp, "mtp_source": mtp_source,
        }
        if t:
            r["server"] = {
                "prompt_ms": t.get("prompt_ms"), "ttft_ms": t.get("ttft_ms"), "queue_ms": t.get("queue_ms"),
                "predicted_ms": t.get("predicted_ms"), "prompt_n": t.get("prompt_n"),
                "prefill_tps": t.get("prompt_n") * 1000 / t["prompt_ms"] if t.get("prompt_ms") and t.get("prompt_n") else None,
                "decode_tps_whole": t.get("predicted_per_second"),
            }
        self.results[key] = r

    def c3(self):
        a, n_slots = self.a, self.a.concurrency
        self.progress.case = f"c{n_slots}"
        self.release_all()
        w, n = a.warmup_decode, a.window
        cap = self.out_tokens() + a.c3_extra
        if self.ctx:
            cap = min(cap, self.ctx - a.c3_prompt - 1)
        prompts = [self.prompts.make(a.c3_prompt) for _ in range(n_slots)]
        streams = [Stream(f"slot{i + 1}", a.c3_prompt) for i in range(n_slots)]
        window = {"open": None, "close": None}
        lock = threading.Lock()

        def on_tokens(s):
            # Opens when every stream is past its warm-up; closes (everyone leaves) when every stream
            # has N tokens in the window.
            with lock:
                if window["close"] is not None:
                    return "close"
                if window["open"] is None and all(x.tokens() > w for x in streams):
                    window["open"] = max(x.token_times[w] for x in streams)
                if window["open"] is not None and all(x.tokens_after(window["open"]) >= n for x in streams):
                    window["close"] = s.token_times[-1]
                    return "close"
            return None

        def run(i):
            self.server.stream("/v1/completions", self.body(prompts[i], cap), streams[i].label, on_tokens=on_tokens,
                               progress=self.progress, s=streams[i])
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n_slots)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in streams:
            self.requests.append(s.record())
        opened, closed, note = window["open"], window["close"], ""
        if opened is not None and closed is None:
            closed = min(s.token_times[-1] for s in streams)
            note = f"a stream ended (max_tokens {cap:,}) before every slot had {n:,} tokens in the window"
        elif opened is None:
            note = "the streams never all got past their warm-up at once"
        per_slot = counts = None
        if opened is not None and closed > opened:
            counts = [s.tokens_in(opened, closed) for s in streams]
            per_slot = [c / (closed - opened) for c in counts]
        errors = [s.error or s.http_error for s in streams if (s.error or s.http_error) and s.closed_at is None]
        self.wait_idle()
        self.results["c3"] = {
            "slots": n_slots, "prompt_tokens": a.c3_prompt, "max_tokens": cap, "ok": per_slot is not None and not errors,
            "per_slot_tps": per_slot, "aggregate_tps": sum(per_slot) if per_slot else None,
            "jain": jain(per_slot) if per_slot else None, "window_s": closed - opened if per_slot else None,
            "window_tokens": counts, "ttft_s": [s.ttft() for s in streams],
            "server_decode_tps_whole": [(s.timings or {}).get("predicted_per_second") for s in streams],
            "note": note, "errors": errors,
        }

    def stop_done(self):
        a = self.a
        self.progress.case = "stop"
        cancel_ms, disconnect_ms, errors = [], [], []
        limit = self.tail(a.stop_prompt, a.stop_after + a.stop_tail)
        for i in range(a.repeat):
            # Cancel through the API (ferry: POST /v1/requests/{id}/cancel); DONE = [DONE] arrives.
            stop = {}

            def on_tokens(s):
                if s.tokens() >= a.stop_after and "at" not in stop:
                    stop["at"] = time.perf_counter()
                    threading.Thread(target=lambda: stop.setdefault("answer", self.server.request(
                        "POST", f"/v1/requests/{s.request_id}/cancel", timeout=30)[0])).start()
                return None
            if self.server.has_cancel:
                s = self.run_stream(f"stop{i + 1}", self.prompts.make(a.stop_prompt), limit, on_tokens=on_tokens)
                if "at" in stop and s.done_at:
                    cancel_ms.append((s.done_at - stop["at"]) * 1000)
                elif "at" in stop:
                    errors.append(f"the stream ended without [DONE] after the cancel: {s.error or s.http_error}")
                if s.tokens() >= limit:
                    errors.append("the cancelled stream ran to its full length")
                self.wait_idle()
            # A client that leaves: DONE = the server's /slots shows the slot idle.
            if self.server.has_slots:
                s = self.run_stream(f"leave{i + 1}", self.prompts.make(a.stop_prompt), limit,
                                    on_tokens=lambda s: "close" if s.tokens() >= a.stop_after else None)
                if s.closed_at:
                    self.wait_idle(timeout=60)
                    disconnect_ms.append((time.perf_counter() - s.closed_at) * 1000)
        self.results["stop"] = {
            "after_tokens": a.stop_after, "prompt_tokens": a.stop_prompt,
            "cancel_ms": cancel_ms, "stop_done_ms": median(cancel_ms),
            "disconnect_ms": disconnect_ms, "disconnect_idle_ms": median(disconnect_ms),
            "ok": bool(cancel_ms) and not errors, "errors": errors,
            "method": "POST /v1/requests/{id}/cancel" if self.server.has_cancel else "not available",
        }

    def release(self):
        a = self.a
        self.progress.case = "release"
        acks, errors = [], []
        if not self.server.has_slots:
            self.results["release"] = {"ok": False, "release_ack_ms": None, "note": "the server has no /slots"}
            return
        for i in range(a.repeat):
            self.release_all()
            s = self.run_stream(f"release{i + 1}", self.prompts.make(a.stop_prompt), 8)
            held = [x for x in self.slots() or [] if x.get("held_tokens", 0) > 0]
            if not s.ok() or not held:
                errors.append("no slot held the finished request's prompt")
                continue
            slot = held[0]["id"]
            status, body, elapsed = self.server.request("POST", f"/slots/{slot}?action=release", timeout=30)
            after = [x for x in self.slots() or [] if x.get("id") == slot]
            if status != 200 or not after or after[0].get("held_tokens") != 0:
                errors.append(f"release of slot {slot}: HTTP {status} {body}")
                continue
            acks.append(elapsed * 1000)
        self.results["release"] = {"ack_ms": acks, "release_ack_ms": median(acks), "ok": bool(acks) and not errors,
                                   "errors": errors}

    def reuse(self):
        a = self.a
        self.progress.case = "cancel+reuse"
        prompt = self.prompts.make(a.stop_prompt)
        quit_at = {}

        def on_tokens(s):
            if s.tokens() < a.stop_after:
                return None
            if not self.server.has_cancel:
                return "close"  # a client that leaves: servers cancel its request
            if "sent" not in quit_at:
                quit_at["sent"] = True
                self.server.request("POST", f"/v1/requests/{s.request_id}/cancel", timeout=30)
            return None
        limit = self.tail(a.stop_prompt, a.stop_after + a.stop_tail)
        first = self.run_stream("cancelled", prompt, limit, on_tokens=on_tokens)
        idle1 = self.wait_idle()
        again = self.run_stream("reused", prompt, a.reuse_tokens)
        idle2 = self.wait_idle()
        ok = (first.tokens() < limit and again.ok() and again.tokens() == a.reuse_tokens
              and again.finish_reason == "length" and idle1 and idle2)
        self.results["reuse"] = {"ok": ok, "cancelled_tokens": first.tokens(), "reused_tokens": again.tokens(),
                                 "reused_cached_tokens": again.cached(), "slots_idle_after": idle2,
                                 "error": again.error or again.http_error}

    def slots131(self):
        a = self.a
        self.progress.case = "1->3->1"
        m = a.lifecycle_tokens
        joined = threading.Event()
        peers = []

        def on_first(s):
            if s.tokens() >= m and not joined.is_set():
                joined.set()
            return None
        results = {}

        def run_first():
            results["A"] = self.run_stream("A", self.prompts.make(a.lifecycle_prompt), 3 * m, on_tokens=on_first)
        ta = threading.Thread(target=run_first)
        ta.start()
        while ta.is_alive() and not joined.wait(0.05):
            pass
        busy_seen = []

        def run_peer(name):
            results[name] = self.run_stream(name, self.prompts.make(a.lifecycle_prompt), m)
        for name in ("B", "C"):
            peers.append(threading.Thread(target=run_peer, args=(name,)))
            peers[-1].start()
        if self.server.has_slots:
            deadline = time.perf_counter() + 30
            while any(p.is_alive() for p in peers) and time.perf_counter() < deadline:
                busy_seen.append(sum(1 for x in self.slots() or [] if x.get("state") != "idle"))
                time.sleep(0.01)
        for p in peers:
            p.join()
        ta.join()
        A, B, C = results.get("A"), results.get("B"), results.get("C")
        streams_ok = all(x is not None and x.ok() and x.finish_reason == "length" for x in (A, B, C)) and \
            A.tokens() == 3 * m and B.tokens() == m and C.tokens() == m
        phases = None
        ok = streams_ok
        if streams_ok:
            start3 = max(B.token_times[0], C.token_times[0])
            end3 = min(B.token_times[-1], C.token_times[-1])
            after = max(B.token_times[-1], C.token_times[-1])
            alone1 = [t for t in A.token_times if t < min(B.sent_at, C.sent_at)]
            three = [t for t in A.token_times if start3 <= t <= end3]
            alone2 = [t for t in A.token_times if t > after]

            def rate(ts):
                return (len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) > 1 and ts[-1] > ts[0] else None
            phases = {"alone_before_tps": rate(alone1), "three_tps": rate(three), "alone_after_tps": rate(alone2),
                      "tokens": [len(alone1), len(three), len(alone2)]}
            ok = len(alone1) > 0 and len(three) > 0 and len(alone2) > 0 and start3 < end3
        self.wait_idle()
        self.results["slots131"] = {"ok": ok, "A_phases": phases, "max_busy_slots_seen": max(busy_seen) if busy_seen else None,
                                    "errors": [x.error or x.http_error for x in (A, B, C) if x and (x.error or x.http_error)]}

    def cache(self):
        a = self.a
        self.progress.case = "prompt cache"
        self.release_all()
        rows = {}

        def row(s):
            t = s.timings or {}
            prefill = t.get("prompt_ms") / 1000 if t.get("prompt_ms") is not None else s.ttft()
            return {"input_tokens": s.server_prompt_tokens() if s.server_prompt_tokens() is not None else s.prompt_tokens,
                    "cached_tokens": s.cached(), "prefill_s": prefill,
                    "prefill_source": "server prompt_ms" if t.get("prompt_ms") is not None else "client TTFT",
                    "request_s": s.e2e(), "ttft_s": s.ttft(), "ok": s.ok()}
        base = self.prompts.make(a.cache_prompt)
        first = self.run_stream("cache first", base, a.answer_tokens)
        rows["first"] = row(first)
        same = self.run_stream("cache same", base, a.answer_tokens)
        rows["same"] = row(same)
        question = self.prompts.make(max(1, a.turn_tokens - len(same.token_ids)))
        turn = self.run_stream("cache turn", base + same.token_ids + question, a.answer_tokens)
        rows["turn"] = row(turn)
        rows["turn"]["appended_tokens"] = len(same.token_ids) + len(question)
        # A tool round trip through the chat template: the continuation repeats the first request's
        # messages and adds the assistant's tool call and the tool's result.
        messages = [
            {"role": "system", "content": "You are a weather assistant. Use the tools to answer; give "
                                          "temperatures in Celsius and say whether to take an umbrella."},
            {"role": "user", "content": "What is the weather in Paris today, and should I take an umbrella?"}]
        tools = [
            {"type": "function", "function": {
                "name": "get_weather", "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
            {"type": "function", "function": {
                "name": "get_forecast", "description": "Forecast for the coming days",
                "parameters": {"type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                    "required": ["city", "days"]}}}]
        tool_first = self.run_chat("tool call", messages, tools, a.answer_tokens)
        rows["tool_call"] = row(tool_first)
        continued = messages + [
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(
                {"city": "Paris", "temp_c": 14, "conditions": "light rain", "precip_mm": 2.5, "wind_kph": 18,
                 "humidity": 0.82, "updated": "2026-05-14T07:30:00+02:00"})}]
        tool_cont = self.run_chat("tool result", continued, tools, a.answer_tokens)
        rows["tool"] = row(tool_cont)
        uncached = self.run_chat("tool result, no cache", continued, tools, a.answer_tokens, cache_prompt=False)
        rows["tool"]["uncached_prefill_s"] = row(uncached)["prefill_s"]
        rows["tool"]["uncached_cached_tokens"] = uncached.cached()
        self.results["cache"] = {"prompt_tokens": a.cache_prompt, "rows": rows,
                                 "ok": all(r["ok"] for r in rows.values())}

    def shutdown(self):
        a = self.a
        self.progress.case = "shutdown"
        if not a.server_pid:
            self.results["shutdown"] = {"ok": None, "note": "n/a: the wrapper did not start the server (no --server-pid)"}
            return
        sig = {}
        refused = {}
        late_thread = []

        def on_tokens(s):
            if s.tokens() >= a.stop_after and "at" not in sig:
                sig["at"] = time.perf_counter()
                os.kill(a.server_pid, signal.SIGTERM)

                def late():
                    time.sleep(0.05)
                    try:
                        refused["status"] = self.server.request("POST", "/v1/completions", {
                            "model": self.model, "prompt": [1, 2, 3], "max_tokens": 1}, timeout=30)[0]
                    except OSError as e:
                        refused["status"] = f"connection: {e}"
                late_thread.append(threading.Thread(target=late))
                late_thread[0].start()
            return None
        s = self.run_stream("draining", self.prompts.make(a.stop_prompt),
                            self.tail(a.stop_prompt, a.stop_after + a.shutdown_tail), on_tokens=on_tokens)
        exited_at = None
        deadline = time.perf_counter() + a.shutdown_wait
        while time.perf_counter() < deadline:
            if not pid_alive(a.server_pid):
                exited_at = time.perf_counter()
                break
            time.sleep(0.005)
        code = None
        if a.exit_code_file:
            while time.perf_counter() < deadline + 5 and code is None:
                try:
                    text = open(a.exit_code_file).read().strip()
                    code = int(text) if text else None
                except (OSError, ValueError):
                    time.sleep(0.01)
        for t in late_thread:
            t.join()
        terminal = s.done_at is not None
        refused_ok = refused.get("status") == 503 or str(refused.get("status", "")).startswith("connection")
        ok = terminal and exited_at is not None and refused_ok and code in (0, None)
        self.results["shutdown"] = {
            "ok": ok, "exit_code": code, "exit_ms": (exited_at - sig["at"]) * 1000 if exited_at and "at" in sig else None,
            "stream_terminal": terminal, "stream_finish": s.finish_reason, "stream_error": s.error,
            "late_request_status": refused.get("status"),
        }


def wait_ready(server, seconds):
    deadline, said = time.perf_counter() + seconds, 0.0
    while True:
        try:
            status, body, _ = server.request("GET", "/health", timeout=10)
        except OSError as e:
            status, body = None, str(e)
        if status == 200:
            return
        if time.perf_counter() > deadline:
            raise SystemExit(f"the server was not ready after {seconds:.0f} s: GET /health: {status} {str(body)[:300]}")
        if time.perf_counter() - said >= 10:
            said = time.perf_counter()
            reason = body.get("reason") if isinstance(body, dict) else body
            sys.stderr.write(f"waiting for the server: {status} {reason}\n")
        time.sleep(0.2)


def pid_alive(pid):
    """False once the process is gone or a zombie (exited, not yet reaped by the wrapper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


# ---- output -----------------------------------------------------------------------------------------

def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def markdown(bench):
    a = bench.a
    crashed = {k: v for k, v in bench.results.items() if set(v) == {"ok", "error"}}
    R = {k: v for k, v in bench.results.items() if k not in crashed}
    seed = a.compare_seed
    rows = []

    def add(key, metric, client, server):
        rows.append([metric, client, server] + ([SEED_V100.get(key, "")] if seed else []))

    for key in ("warm", "long"):
        r = R.get(key)
        if not r:
            continue
        name = "warm" if key == "warm" else ("fresh" if r["fresh"] else "long")
        size = f"{r['prompt_tokens']:,} in, {r['out_tokens']:,} out"
        c, s = r["client"], r["server"] or {}
        bad = "" if r["ok"] else f" (failed: {r['error'] or 'got %d tokens' % r['tokens']})"
        add(f"{key}.decode", f"{name} decode tok/s ({size}; window {a.window:,} after {a.warmup_decode:,}){bad}",
            fmt(c["decode_tps"]), fmt(s.get("decode_tps_whole")) + " (whole decode)" if s else "n/a")
        add(f"{key}.prefill", f"{name} prefill tok/s", fmt(c["prefill_tps"]), fmt(s.get("prefill_tps")) if s else "n/a")
        add(f"{key}.ttft", f"{name} prefill / TTFT s", "- / " + fmt(c["ttft_s"]),
            f"{fmt(ms(s.get('prompt_ms')))} / {fmt(ms(s.get('ttft_ms')))}" if s else "n/a")
        if key == "warm":
            server_e2e = None
            if s and s.get("prompt_ms") is not None and s.get("predicted_ms") is not None:
                server_e2e = ((s.get("queue_ms") or 0) + s["prompt_ms"] + s["predicted_ms"]) / 1000
            add("warm.e2e", f"warm end-to-end s ({size})", fmt(c["e2e_s"]), fmt(server_e2e))
            add("warm.gap", "warm token gap p95 / max ms", f"{fmt(c['gap_p95_ms'])} / {fmt(c['gap_max_ms'])}", "-")
            acc = r["mtp_acceptance"]
            add("warm.mtp", "warm MTP acceptance", "-", f"{acc * 100:.2f}%" if acc is not None else r["mtp_source"])
    c3 = R.get("c3")
    if c3:
        per = " / ".join(fmt(x) for x in c3["per_slot_tps"]) if c3["per_slot_tps"] else "n/a"
        srv = " / ".join(fmt(x) for x in c3["server_decode_tps_whole"]) if any(c3["server_decode_tps_whole"]) else "-"
        label = f"C{c3['slots']} per-slot decode tok/s ({c3['prompt_tokens']:,} in each)"
        add("c3.per_slot", label + (f" ({c3['note']})" if c3["note"] else ""), per, srv)
        window = f" over {fmt(c3['window_s'])} s" if c3["window_s"] else ""
        add("c3.aggregate", f"C{c3['slots']} aggregate tok/s (same overlap window{window})", fmt(c3["aggregate_tps"]), "-")
        add("c3.jain", "Jain fairness", fmt(c3["jain"], 6), "-")
    st = R.get("stop")
    if st:
        extra = f" (disconnect -> slot idle: {fmt(st['disconnect_idle_ms'])})" if st["disconnect_ms"] else ""
        add("stop", f"STOP -> DONE ms (median of {len(st['cancel_ms'])}){extra}", fmt(st["stop_done_ms"]), "-")
    rel = R.get("release")
    if rel:
        add("release", "RELEASE -> ACK ms", fmt(rel.get("release_ack_ms")) if rel.get("ok") else
            "n/a" + (f" ({rel.get('note') or '; '.join(rel.get('errors', []))})"), "-")
    if "reuse" in R or "slots131" in R:
        add("lifecycle", "cancel then reuse; 1 -> 3 -> 1 slots",
            f"{pass_text(R.get('reuse'))} / {pass_text(R.get('slots131'))}", "-")
    sd = R.get("shutdown")
    if sd:
        text = pass_text(sd)
        if sd.get("ok") is not None:
            text += f" (exit {sd.get('exit_code')}, {fmt(sd.get('exit_ms'), 0)} ms after SIGTERM)"
        else:
            text = sd.get("note", "n/a")
        add("shutdown", "clean shutdown", text, "-")
    for key, r in crashed.items():
        add(key, f"{key}: FAILED", r["error"], "-")
    headers = ["metric", "client", "server's own timings"] + (["user's V100 (Maya-L)"] if seed else [])
    parts = [f"## Serving benchmark: {bench.model} at {a.url}", "", bench.describe, "", table(headers, rows)]
    cache = R.get("cache")
    if cache:
        cr = cache["rows"]
        names = [("first", f"{cache['prompt_tokens']:,}-token first request"), ("same", "same request again"),
                 ("turn", "multi-turn: previous answer appended, new question"),
                 ("tool", "tool result continuation")]
        crow = []
        for key, label in names:
            r = cr.get(key)
            if not r:
                continue
            io = f"{fmt_int(r['input_tokens'])} / {fmt_int(r['cached_tokens'])}"
            if key == "turn" and r["input_tokens"] is not None and r["cached_tokens"] is not None:
                io += f" ({r['input_tokens'] - r['cached_tokens']} new tokens)"
            prefill = fmt(r["prefill_s"])
            if key == "tool":
                prefill += f" (uncached {fmt(r.get('uncached_prefill_s'))})"
            crow.append([label, io, prefill, fmt(r["request_s"])] + (list(SEED_V100[f"cache.{key}"]) if seed else []))
        ch = ["case", "input / cached tokens", "prefill s", "whole HTTP request s"]
        if seed:
            ch += ["V100 in / cached", "V100 prefill s", "V100 request s"]
        src = cr.get("first", {}).get("prefill_source", "")
        parts += ["", f"Prompt cache (prefill s: {src}):", "", table(ch, crow)]
    parts += ["", "Definitions:", "", DEFINITIONS]
    return "\n".join(parts) + "\n"


def ms(x):
    return x / 1000 if x is not None else None


def pass_text(r):
    if not r:
        return "n/a"
    if r.get("ok") is None:
        return "n/a"
    return "pass" if r["ok"] else "FAIL"


# ---- main -------------------------------------------------------------------------------------------

CASES = ["long", "warm", "c3", "cache", "stop", "release", "reuse", "slots131", "shutdown"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Definitions:\n" + DEFINITIONS)
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:9527 (a trailing /v1 is fine)")
    p.add_argument("--api-key", default=os.environ.get("FERRY_API_KEY"))
    p.add_argument("--model", help="model id to send (default: the first of GET /v1/models)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, in this order: " + ",".join(CASES))
    p.add_argument("--prompt", type=int, default=32783, help="warm prompt tokens (32,783)")
    p.add_argument("--warmup-decode", type=int, default=512, help="decode tokens before the window (512)")
    p.add_argument("--window", type=int, default=1024, help="decode window tokens (1,024); out = 1 + W + N")
    p.add_argument("--long-prompt", type=int, default=498463, help="the ~499K row's prompt (0 skips it)")
    p.add_argument("--warmup-prompt", type=int, default=4096, help="the expert warm-up request's prompt")
    p.add_argument("--warmup-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=3, help="C3's number of concurrent requests")
    p.add_argument("--c3-prompt", type=int, help="C3 prompt tokens each (default: --prompt)")
    p.add_argument("--c3-extra", type=int, default=16384,
                   help="C3 max_tokens beyond 1 + W + N, so that staggered prefills still overlap; the client "
                        "leaves once the window is full")
    p.add_argument("--stop-prompt", type=int, default=4096, help="prompt of the stop / release / reuse requests")
    p.add_argument("--stop-after", type=int, default=64, help="tokens before STOP")
    p.add_argument("--stop-tail", type=int, default=4096, help="max_tokens beyond --stop-after of a stopped stream")
    p.add_argument("--reuse-tokens", type=int, default=64)
    p.add_argument("--lifecycle-prompt", type=int, default=1024, help="1 -> 3 -> 1 prompts")
    p.add_argument("--lifecycle-tokens", type=int, default=256, help="1 -> 3 -> 1: B and C's tokens; A has 3x")
    p.add_argument("--cache-prompt", type=int, default=32786, help="the prompt-cache table's prompt")
    p.add_argument("--answer-tokens", type=int, default=8, help="tokens of each prompt-cache answer")
    p.add_argument("--turn-tokens", type=int, default=22, help="multi-turn: tokens appended (answer + question)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions of STOP and RELEASE (the median is shown)")
    p.add_argument("--shutdown-tail", type=int, default=256, help="tokens the draining stream still has to make")
    p.add_argument("--shutdown-wait", type=float, default=120, help="seconds to wait for the server to exit")
    p.add_argument("--server-pid", type=int, help="the server's pid, when the wrapper started it (enables shutdown)")
    p.add_argument("--exit-code-file", help="where the wrapper writes the server's exit code")
    p.add_argument("--temperature", type=float, help="sent with every request (default: the server's)")
    p.add_argument("--seed", type=int, default=17, help="of the prompts' random ids")
    p.add_argument("--id-range", help="LO:HI: draw prompt ids from this range instead of the server's tokenization")
    p.add_argument("--text-file", help="a text whose tokenization gives the prompt ids")
    p.add_argument("--json", help="write the results (with every request's raw figures) here")
    p.add_argument("--markdown", help="write the Markdown table here too")
    p.add_argument("--compare-seed", action="store_true", help="add the user's V100 figures as a column")
    p.add_argument("--progress", choices=["auto", "on", "off"], default="auto", help="stderr progress (auto: on a TTY)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per request")
    p.add_argument("--wait-ready", type=float, default=0,
                   help="first wait up to this many seconds for GET /health to answer 200 (a server still loading)")
    a = p.parse_args(argv)
    a.c3_prompt = a.c3_prompt or a.prompt
    cases = [c for c in a.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {unknown}; expected some of {CASES}")
    a.case_list = [c for c in CASES if c in cases]
    if a.long_prompt <= 0 and "long" in a.case_list:
        a.case_list.remove("long")
    return a


def main(argv=None):
    a = parse_args(argv if argv is not None else sys.argv[1:])
    server = Server(a.url, a.api_key, a.timeout)
    if a.wait_ready > 0:
        wait_ready(server, a.wait_ready)
    try:
        status, models, _ = server.request("GET", "/v1/models", timeout=30)
    except OSError as e:
        raise SystemExit(f"cannot reach {a.url}: {e}")
    if status != 200 or not isinstance(models, dict) or not models.get("data"):
        raise SystemExit(f"GET /v1/models: HTTP {status}: {str(models)[:300]}")
    info = models["data"][0]
    model = a.model or info["id"]
    ctx = info.get("max_model_len")
    slots_status = server.request("GET", "/slots", timeout=30)[0]
    server.has_slots = slots_status == 200
    # The endpoint exists when an unknown id is accepted or answered "no such request" (404).
    server.has_cancel = server.request("POST", "/v1/requests/cmpl-0/cancel", timeout=30)[0] in (200, 202, 404)
    progress = Progress(server, a.progress)
    bench = Bench(a, server, progress)
    bench.model, bench.ctx = model, ctx
    bench.prompts = Prompts(server, model, a.seed, a.id_range, a.text_file)
    health = server.request("GET", "/health", timeout=30)[1]
    bench.describe = (f"Server: {json.dumps(info, separators=(',', ':'))}; health: "
                      f"{json.dumps(health, separators=(',', ':')) if isinstance(health, dict) else 'n/a'}. "
                      f"Prompts: token ids from {bench.prompts.source}; sampling: "
                      f"{'temperature %s' % a.temperature if a.temperature is not None else 'the server defaults'}, "
                      f"ignore_eos + min_tokens. Admin endpoints: /slots {'yes' if server.has_slots else 'no'}, "
                      f"cancel {'yes' if server.has_cancel else 'no'}.")
    started = time.perf_counter()
    for case in a.case_list:
        progress.say(f"== {case}")
        try:
            if case in ("warm", "long"):
                bench.single(case, a.prompt if case == "warm" else a.long_prompt)
            else:
                getattr(bench, {"stop": "stop_done"}.get(case, case))()
        except (OSError, http.client.HTTPException) as e:  # the server went away: say so, go on
            bench.results[case] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    progress.close()
    md = markdown(bench)
    sys.stdout.write(md)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"url": a.url, "model": model, "server": info, "health": health,
                       "args": {k: v for k, v in vars(a).items() if k not in ("api_key",)},
                       "seconds": time.perf_counter() - started, "results": bench.results,
                       "requests": bench.requests}, f, indent=1)
    failed = [k for k, v in bench.results.items() if v.get("ok") is False]
    if failed:
        sys.stderr.write(f"bench_serve: failed: {', '.join(failed)}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
