#!/usr/bin/env python3
"""Tokenize the Debian license texts into the training corpus of make_fixtures.py's trained case.

The accelerator machine may lack /usr/share/common-licenses, so the token ids are made here (with the
committed test tokenizer, vocab 4096) and carried there: every file but the held-out one, in name order,
joined by a blank line, goes to train.npy; the held-out file (not a near-copy of another license) goes to
heldout.npy. Both are int32. Needs only numpy and tokenizers.

Usage: python3 tokenize_corpus.py --out DIR [--licenses /usr/share/common-licenses] [--heldout Apache-2.0]
"""
import argparse
import os

import numpy as np
import tokenizers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--licenses", default="/usr/share/common-licenses")
    ap.add_argument("--heldout", default="Apache-2.0")
    ap.add_argument("--tokenizer", default=os.path.join(REPO, "tests/fixtures/tokenizer/tokenizer.json"))
    args = ap.parse_args()
    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    train, names = [], []
    heldout = None
    for name in sorted(os.listdir(args.licenses)):
        path = os.path.join(args.licenses, name)
        if os.path.islink(path) or not os.path.isfile(path):  # GPL -> GPL-3 and the like: no duplicates
            continue
        with open(path, encoding="utf-8") as f:
            ids = tok.encode(f.read().strip() + "\n\n", add_special_tokens=False).ids
        if name == args.heldout:
            heldout = ids
        else:
            train += ids
            names.append(name)
    if heldout is None:
        raise SystemExit(f"held-out file {args.heldout} not found in {args.licenses}")
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "train.npy"), np.array(train, dtype=np.int32))
    np.save(os.path.join(args.out, "heldout.npy"), np.array(heldout, dtype=np.int32))
    print(f"train: {len(train)} tokens from {names}; held out: {len(heldout)} tokens of {args.heldout}")


if __name__ == "__main__":
    main()
