"""tools/kernel_timeline.py: a `ferry bench --kernel-timeline` CSV cut at its mHC sites into sublayers whose
shares (own time plus the idle before each kernel) add up to the step's span."""
import subprocess
import sys

from ferry_server import REPO

SCRIPT = REPO / "tools" / "kernel_timeline.py"

# One step: embedding, two sites (attention, FFN) with a product each, a branch kernel beside the
# first product, 2 us idle before the final post, the head.
CSV = """# tg1 @ d0
start_us,duration_us,gap_us,stream,name
0.000,5.000,0.000,1,"embed_kernel<12, true>"
6.000,4.000,1.000,1,"mhc_site_kernel<16u>"
8.000,10.000,0.000,1,"matvec_mma_kernel<12, false>"
9.000,3.000,0.000,2,"mhc_comb_kernel"
17.000,5.000,0.000,1,"mhc_site_kernel<16u>"
20.000,8.000,0.000,1,"matvec_mma_kernel<12, false>"
30.000,2.000,2.000,1,"mhc_post_combine_kernel"
31.000,4.000,0.000,1,"hc_head_kernel"
"""


def run(tmp_path, *args):
    path = tmp_path / "timeline.csv"
    path.write_text(CSV)
    r = subprocess.run([sys.executable, str(SCRIPT), str(path), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_sublayers_add_up_to_the_span(tmp_path):
    out = run(tmp_path)
    assert "tg1 @ d0: span 35.0 us, 8 kernels" in out, out
    shares = {line.split()[0] + " " + line.split()[1]: float(line.split()[-2])
              for line in out.splitlines()[1:] if "L0" in line}
    # The attention's site starts after 1 us idle; its product ends at 18, inside the FFN site's start.
    assert shares == {"L0 attention": 13.0, "L0 ffn": 10.0}, out
    assert "head                5.0 us" in out and "tail                7.0 us" in out, out


def test_kernels_lists_each_share(tmp_path):
    out = run(tmp_path, "--kernels")
    assert "mhc_site_kernel 5.0, matvec_mma_kernel 8.0, mhc_comb_kernel 0.0" in out, out
