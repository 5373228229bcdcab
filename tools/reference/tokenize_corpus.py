#!/usr/bin/env python3
"""Tokenize English text found on Debian into the training corpus of make_fixtures.py's trained case.

The accelerator machine may lack these files, so the token ids are made here (with the committed test
tokenizer, vocab 4096) and carried there. Sources, in order: every license in /usr/share/common-licenses
but the held-out one; the prose of every /usr/share/doc/*/copyright file (package license statements:
of a DEP-5 file only its License and Comment fields, whose " ." lines are paragraph breaks); the GNU info
manuals in /usr/share/info (without node headers, menus and tag tables). Lines are stripped of their
indentation. A paragraph already taken (same words) is skipped, and so is every paragraph that shares a
run of 13 words with the held-out license, so that held-out text is unseen text (the usual 13-gram
decontamination), and every paragraph under 70% plain words (code, tables, lists of paths, addresses
and copyright holders). Each kept paragraph is tokenized with a blank line after it. Writes

  train.npy, heldout.npy   uint16 token ids (the held-out file alone in heldout.npy)
  corpus.json              what went in: file and paragraph counts, tokens, sha256 of both arrays

Needs only numpy and tokenizers.

Usage: python3 tokenize_corpus.py --out DIR [--licenses DIR] [--docs DIR] [--info DIR] [--heldout Apache-2.0]
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import re

import numpy as np
import tokenizers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NGRAM = 13
MIN_PLAIN_WORDS = 0.7  # of a paragraph's whitespace-separated items; prose has ~0.85, code, tables and lists less


def regular_file(path):
    return os.path.isfile(path) and not os.path.islink(path)  # GPL -> GPL-3 and the like: no duplicates


def prose_lines(text):
    """The lines of a copyright file that are prose: in a DEP-5 file (first line "Format: ...") only the
    License and Comment fields, whose other fields are file lists and copyright holders."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Format:"):
        return lines
    out, keep = [], False
    for line in lines:
        field = re.match(r"([A-Za-z][A-Za-z0-9-]*):(\s|$)", line)
        if field:
            keep = field.group(1) in ("License", "Comment")
        if keep or not line.strip():
            out.append(line)
    return out


def info_lines(text):
    """The text lines of a GNU info file: its nodes without their header lines, menus and the tag table."""
    out = []
    for node in text.split("\x1f"):
        lines = node.strip("\n").splitlines()
        if not lines or not lines[0].startswith("File:"):
            continue  # the preamble, "Tag Table:", "Indirect:", "Local Variables:"
        out += [""] + [line for line in lines[1:] if not line.startswith("* ") or "::" not in line]
    return [line for line in out if line != "* Menu:"]


def paragraphs(lines):
    """Blank-line separated paragraphs with each line stripped; a DEP-5 " ." line is a break."""
    lines = ["" if line.strip() == "." else line.strip() for line in lines]
    return [p.strip() for p in re.split(r"\n{2,}", "\n".join(lines)) if p.strip()]


def plain_word_share(text):
    """The share of whitespace-separated items that are plain words: letters, capitalised at most at the
    start, with an apostrophe suffix, quotes, brackets and trailing punctuation allowed."""
    items = text.split()
    plain = sum(bool(re.fullmatch(r"[A-Za-z][a-z]*(['’][a-z]+)?", w.strip("(\"'‘“)’”.,;:!?"))) for w in items)
    return plain / max(1, len(items))


def words(text):
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(ws):
    return {tuple(ws[i:i + NGRAM]) for i in range(len(ws) - NGRAM + 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--licenses", default="/usr/share/common-licenses")
    ap.add_argument("--docs", default="/usr/share/doc", help="its */copyright files are read; '' for none")
    ap.add_argument("--info", default="/usr/share/info", help="its GNU info manuals are read; '' for none")
    ap.add_argument("--heldout", default="Apache-2.0")
    ap.add_argument("--tokenizer", default=os.path.join(REPO, "tests/fixtures/tokenizer/tokenizer.json"))
    args = ap.parse_args()
    tok = tokenizers.Tokenizer.from_file(args.tokenizer)

    held_path = os.path.join(args.licenses, args.heldout)
    if not regular_file(held_path):
        raise SystemExit(f"held-out file {held_path} not found")
    with open(held_path, encoding="utf-8") as f:
        held_text = f.read().strip()
    held_grams = ngrams(words(held_text))

    docs = []  # (source, lines)
    for name in sorted(os.listdir(args.licenses)):
        path = os.path.join(args.licenses, name)
        if name != args.heldout and regular_file(path):
            with open(path, encoding="utf-8") as f:
                docs.append(("license", f.read().splitlines()))
    n_copyright = 0
    if args.docs:
        for pkg in sorted(os.listdir(args.docs)):
            path = os.path.join(args.docs, pkg, "copyright")
            if not regular_file(path):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    docs.append(("copyright", prose_lines(f.read())))
                n_copyright += 1
            except UnicodeDecodeError:
                print(f"skipped {path}: not UTF-8")
    infos = sorted(glob.glob(os.path.join(args.info, "*.info*.gz"))) if args.info else []
    for path in infos:
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            docs.append(("info", info_lines(f.read())))

    seen = set()
    dropped = {"duplicate": 0, f"shares_{NGRAM}_words_with_heldout": 0, f"under_{MIN_PLAIN_WORDS}_plain_words": 0}
    kept = {"license": 0, "copyright": 0, "info": 0}
    taken = []
    for source, lines in docs:
        for para in paragraphs(lines):
            ws = words(para)
            key = " ".join(ws)
            if key in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(key)
            if ngrams(ws) & held_grams:
                dropped[f"shares_{NGRAM}_words_with_heldout"] += 1
            elif plain_word_share(para) < MIN_PLAIN_WORDS:
                dropped[f"under_{MIN_PLAIN_WORDS}_plain_words"] += 1
            else:
                kept[source] += 1
                taken.append(para + "\n\n")
    train = [i for enc in tok.encode_batch(taken, add_special_tokens=False) for i in enc.ids]
    heldout = tok.encode(held_text + "\n\n", add_special_tokens=False).ids
    os.makedirs(args.out, exist_ok=True)
    arrays = {"train": np.array(train, dtype=np.uint16), "heldout": np.array(heldout, dtype=np.uint16)}
    manifest = dict(tokenizer=f"{os.path.relpath(args.tokenizer, REPO)} (vocab {tok.get_vocab_size()})",
                    sources=dict(licenses=f"{args.licenses} (every file but {args.heldout})",
                                 copyright_files=f"{args.docs}/*/copyright: {n_copyright} files" if args.docs else None,
                                 info_manuals=[os.path.basename(p) for p in infos]),
                    heldout=args.heldout, paragraphs_kept=kept, paragraphs_dropped=dropped,
                    filters=f"paragraphs sharing a {NGRAM}-word run with {args.heldout} are dropped, and so are "
                            f"those with under {MIN_PLAIN_WORDS:.0%} plain words")
    for part, arr in arrays.items():
        path = os.path.join(args.out, part + ".npy")
        np.save(path, arr)
        manifest[part + "_tokens"] = int(arr.size)
        manifest[part + "_sha256"] = hashlib.sha256(arr.tobytes()).hexdigest()
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
