#!/usr/bin/env python3
"""A decode step kernel by kernel, by sublayer (issue 15): reads the CSV that `ferry bench --kernel-times
--kernel-timeline FILE` writes and cuts each tg test's step at its mHC sites (one before each sublayer:
attention, then FFN, per layer) and the final post, as gpu/PERF.md's h91 section does. A kernel's share is
its "own" time plus the idle time before it (kernel_times.hpp: the span's shares, in start order), so the
sublayers add up to the step's span. Standard library only.

  tools/kernel_timeline.py timeline.csv             every test in the file
  tools/kernel_timeline.py timeline.csv --kernels   each sublayer's kernels too
"""
import argparse
import csv
import sys


def tests(path):
    """[(title, [(start_us, duration_us, name)])] in the file's order."""
    out = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0].startswith("#"):
                out.append((row[0].lstrip("# ").strip(), []))
            elif row[0] != "start_us" and out:
                out[-1][1].append((float(row[0]), float(row[1]), row[4]))
    return out


def sublayers(kernels):
    """[(label, share_us, [(name, share_us)])]: cut before each mhc_site and the final post."""
    groups = [["head", 0.0, []]]
    sites = 0
    latest = kernels[0][0] if kernels else 0.0
    for start, dur, name in sorted(kernels, key=lambda k: k[0]):
        end = start + dur
        share = max(0.0, end - max(start, latest)) + max(0.0, start - latest)
        latest = max(latest, end)
        if name.startswith("mhc_site") or name.startswith("mhc_post_combine"):
            if name.startswith("mhc_site"):
                label = f"L{sites // 2} {'attention' if sites % 2 == 0 else 'ffn'}"
                sites += 1
            else:
                label = "tail"
            groups.append([label, 0.0, []])
        groups[-1][1] += share
        groups[-1][2].append((name, share))
    return [g for g in groups if g[2]]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("--kernels", action="store_true", help="list each sublayer's kernels and their shares")
    a = p.parse_args(argv)
    for title, kernels in tests(a.csv):
        groups = sublayers(kernels)
        print(f"{title}: span {sum(g[1] for g in groups):.1f} us, {len(kernels)} kernels")
        for label, share, items in groups:
            line = f"  {label:14s} {share:8.1f} us"
            if a.kernels:
                line += ": " + ", ".join(f"{n.split('<')[0]} {s:.1f}" for n, s in items)
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
