"""A real `ferry serve` for the API tests: started on a free port (--port 0, the bound port read from
its log), waited for until /health says ok, stopped with SIGTERM (exit code checked). With no --model
it serves the embedded default model (the build's ferry-default.gguf, beside the binary) on the CPU backend."""
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# The default model as a file: the build converts it next to the ferry binary (tools/CMakeLists.txt).
DEFAULT_MODEL = pathlib.Path(os.environ.get("FERRY_BIN", str(REPO / "build" / "ferry"))).parent / "ferry-default.gguf"
TOKENIZER_JSON = REPO / "tests" / "fixtures" / "tokenizer" / "tokenizer.json"


class FerryServer:
    def __init__(self, ferry_bin, *args, api_key=None, ready=True, preexec_fn=None):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="ferry-serve-", suffix=".log", delete=False)
        env = dict(os.environ)
        env.pop("FERRY_API_KEY", None)
        # FERRY_SERVE_ARGS adds options to every test server, e.g. "--backend cuda" on a GPU machine.
        cmd = [ferry_bin, "serve", "--port", "0", "--threads", "1", *shlex.split(os.environ.get("FERRY_SERVE_ARGS", "")), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.api_key = api_key
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec_fn)
        self.base = None
        deadline = time.monotonic() + 60
        while self.base is None:
            self._check_alive()
            m = re.search(r"listening on (http://[0-9.]+:\d+)", self.output())
            if m:
                self.base = m.group(1)
            elif time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"ferry serve did not start listening:\n{self.output()}")
            else:
                time.sleep(0.02)
        if ready:
            self.wait_ready()

    def output(self):
        return pathlib.Path(self.log.name).read_text(errors="replace")

    def _check_alive(self):
        if self.proc.poll() is not None:
            pytest.fail(f"ferry serve exited with {self.proc.returncode}:\n{self.output()}")

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            status, _ = self.get("/health")
            if status == 200:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"/health never became ok:\n{self.output()}")
            time.sleep(0.02)

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        """Plain HTTP, for what the openai client cannot send (bad JSON, wrong types, admin calls)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.api_key or "unused", max_retries=0, **kw)

    def cpu_seconds(self):
        """User + system CPU time the server has used so far."""
        fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metric(self, name):
        """One sample of /metrics, by its name with labels as printed."""
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(name)

    def rss_kib(self):
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signals the server and returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"ferry serve did not exit {timeout}s after {sig.name}:\n{self.output()}")
        os.unlink(self.log.name)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server(ferry_bin):
    """The default model, greedy by default so that answers are reproducible."""
    s = FerryServer(ferry_bin, "--temperature", "0")
    yield s
    code = s.stop()
    assert code == 0, s.output()


def chat_messages(text="Hello, who are you?"):
    return [{"role": "user", "content": text}]


def tokenizer():
    """The test vocabulary, through Hugging Face `tokenizers` (an independent decoder)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER_JSON))
