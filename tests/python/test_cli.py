"""The ferry binary's command line: every subcommand is there and documents itself."""
import subprocess


def test_help_lists_subcommands(ferry_bin):
    out = subprocess.run([ferry_bin, "--help"], capture_output=True, text=True, check=True).stdout
    for sub in ("serve", "run", "bench", "convert", "inspect"):
        assert sub in out


def test_unknown_subcommand_fails(ferry_bin):
    r = subprocess.run([ferry_bin, "frobnicate"], capture_output=True, text=True)
    assert r.returncode != 0
    assert "frobnicate" in (r.stderr + r.stdout)
