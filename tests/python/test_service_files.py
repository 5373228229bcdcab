"""The service files: tools/ferry.service passes `systemd-analyze verify` with no warning and carries
the user's limits; tools/ferry.toml, the user's settings, is read by `ferry serve` (here with the
embedded model on the CPU and loopback addresses in place of the machine-specific values)."""
import json
import pathlib
import re
import shutil
import subprocess

import pytest

from ferry_server import FerryServer

REPO = pathlib.Path(__file__).resolve().parents[2]
UNIT = REPO / "tools" / "ferry.service"
CONFIG = REPO / "tools" / "ferry.toml"


def unit_values():
    values = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            values.setdefault(key.strip(), value.strip())
    return values


def test_unit_has_the_users_limits_and_a_graceful_stop():
    v = unit_values()
    assert (v["MemoryHigh"], v["MemoryMax"], v["MemorySwapMax"]) == ("98G", "102G", "0")
    assert v["KillSignal"] == "SIGTERM" and v["Restart"] == "on-failure"
    drain = float(re.search(r"^drain-timeout = (\d+)", CONFIG.read_text(), re.M).group(1))
    stop = float(v["TimeoutStopSec"])
    assert stop > drain + 60, "TimeoutStopSec must be beyond the drain deadline (plus ferry's 60 s for the drain itself)"
    assert v["ExecStart"].split()[1:] == ["serve", "--config", "/etc/ferry/ferry.toml"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (Debian's systemd)")
def test_systemd_analyze_verify_is_clean(ferry_bin, tmp_path):
    # verify checks that ExecStart's program exists: point it at the built binary, change nothing else.
    unit = tmp_path / "ferry.service"
    unit.write_text(UNIT.read_text().replace("/opt/ferry/bin/ferry", str(pathlib.Path(ferry_bin).resolve())))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stdout + r.stderr


def test_example_config_is_read_by_serve(ferry_bin):
    # The machine's own values (its model file, four GPUs, 0.0.0.0) are overridden; the rest is the file's.
    s = FerryServer(ferry_bin, "--config", str(CONFIG), "--model", "", "--backend", "cpu", "--devices", "0",
                    "--split", "none", "--host", "127.0.0.1", "--admin-port", "0")
    try:
        slots = json.loads(s.get("/slots")[1])
        assert len(slots["slots"]) == 3 and slots["queue_limit"] == 64
        assert "--ctx asked for 500000" in s.output()
        assert s.client().models.list().data[0].id == "glm-5.3-flash"
        # log-format json: every line an object.
        lines = [line for line in s.output().splitlines() if line.strip()]
        assert lines and all(json.loads(line)["level"] for line in lines)
    finally:
        assert s.stop() == 0
