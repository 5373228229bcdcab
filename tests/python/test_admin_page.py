"""The admin page in headless Chromium (Debian's `chromium`): it loads from /admin against a running
server, draws the actor graph, shows a running request in its slot, cancels it with the slot's
cancel button, and shows it end; a screenshot of it is checked (a PNG of the window's size whose
throughput chart has been drawn). FERRY_ADMIN_SCREENSHOT=PATH keeps the screenshot (the README's
picture is made so)."""
import json
import os
import struct
import threading
import time
import zlib

import pytest

from ferry_server import FerryServer
from headless_chromium import Browser, chromium_binary
from test_api_load import stream_request

pytestmark = pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed (tools/setup.sh installs it)")

WIDTH, HEIGHT = 1440, 1000


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert zlib.crc32(data[12:16 + length]) == struct.unpack(">I", data[16 + length:20 + length])[0]
    return width, height


def test_page_shows_the_graph_and_cancels_a_running_request(ferry_bin, tmp_path):
    server = FerryServer(ferry_bin, "--temperature", "0")
    browser = Browser(WIDTH, HEIGHT)
    results = {}
    threads = []
    try:
        browser.open(server.base + "/admin")
        browser.wait_for("window.ferryAdmin && window.ferryAdmin.connected", what="the page's WebSocket")
        names = browser.wait_for(
            "(() => { const n = [...document.querySelectorAll('#nodes g.node')].map(g => g.dataset.name);"
            " return n.includes('scheduler') && n.includes('stage 0') && n.includes('admin') ? n : null; })()",
            what="the actor graph")
        assert {"scheduler", "stage 0", "admin"} <= set(names)
        assert browser.eval("document.querySelectorAll('#edges path').length") >= 2

        def run(key, prompt):
            results[key] = stream_request(server.base, {"prompt": prompt, "stream": True, "ignore_eos": True,
                                                        "max_tokens": 4000})
        # The running request: a busy slot with its cancel button, and its bridge in the graph.
        threads.append(threading.Thread(target=run, args=("first", [7, 8, 9])))
        threads[-1].start()
        request = browser.wait_for(
            "(() => { const r = document.querySelector('#slots tbody tr[data-state=decoding]');"
            " return r && document.querySelector('#nodes g[data-name=\"bridge ' + r.dataset.request + '\"]')"
            " ? Number(r.dataset.request) : null; })()", what="a decoding slot and its bridge")
        threads.append(threading.Thread(target=run, args=("second", [9, 8, 7, 6])))
        threads[-1].start()
        other = browser.wait_for(
            f"(() => {{ const r = [...document.querySelectorAll('#slots tbody tr[data-state=decoding]')]"
            f".find(r => Number(r.dataset.request) !== {request}); return r ? Number(r.dataset.request) : null; }})()",
            what="the second request in its slot")
        browser.wait_for("window.ferryAdmin.history.some(p => p.gen > 0)", what="the throughput chart moving")
        browser.eval(f"document.querySelector('button.cancel[data-request=\"{request}\"]').click()")
        # It ends: out of its slot, in the finished list as cancelled, its stream closed with the error.
        browser.wait_for(f"!document.querySelector('#slots tbody tr[data-request=\"{request}\"]')",
                         what="the cancelled request leaving its slot")
        end = browser.wait_for(
            f"(() => {{ const r = document.querySelector('#finished tbody tr[data-request=\"{request}\"]');"
            " return r ? r.textContent : null; })()", what="the request in the finished list")
        assert "cancelled" in end
        assert "ok: cancel" in browser.eval("document.getElementById('log').textContent")
        time.sleep(1)  # a few more points on the chart
        shot = browser.screenshot()
        threads[0].join(timeout=60)
        assert results["first"][-1] == "[DONE]" and "cancelled by an administrator" in results["first"][-2]
        assert server.post(f"/v1/requests/{other}/cancel")[0] == 202  # the second one, through the API
        threads[1].join(timeout=60)

        # The screenshot: the window's size, the chart drawn (pixels other than its background).
        assert png_size(shot) == (WIDTH, HEIGHT) and len(shot) > 20000
        drawn = browser.eval(
            "(() => { const c = document.getElementById('chart'); const d = c.getContext('2d')"
            ".getImageData(0, 0, c.width, c.height).data; let n = 0;"
            " for (let i = 0; i < d.length; i += 4) if (d[i+1] > 150 && d[i] < 150) n++; return n; })()")
        assert drawn > 50, "the throughput chart has no line"
        (tmp_path / "admin.png").write_bytes(shot)
        if os.environ.get("FERRY_ADMIN_SCREENSHOT"):
            with open(os.environ["FERRY_ADMIN_SCREENSHOT"], "wb") as f:
                f.write(shot)
        assert not [c for c in browser.console if c.startswith("exception")], browser.console
    finally:
        browser.close()
        for t in threads:
            t.join(timeout=60)
        assert server.stop() == 0
