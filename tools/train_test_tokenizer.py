#!/usr/bin/env python3
"""Trains ferry's small test tokenizer: tests/fixtures/tokenizer/ (tokenizer.json, tokenizer_config.json,
chat_template.jinja).

A byte-level BPE with GLM-5.3-Flash's pre-tokenizer (its tokenizer.json `pre_tokenizer`: one Split
with the glm4 regex, "Isolated", then ByteLevel without its own regex; `ignore_merges` on), trained
with Hugging Face `tokenizers` on the English licence texts that Debian's base-files package ships in
/usr/share/common-licenses (on every Debian system), followed by GLM-5's 36 added tokens in GLM's
order and with its `special` flags. 4,060 merged tokens + 36 added = exactly 4,096, the vocab_size of
ferry's tiny test models. The chat template is the model's own (tests/fixtures/chat_template/).

    build/venv/bin/python tools/train_test_tokenizer.py [--corpus-dir /usr/share/common-licenses]
"""
import argparse
import json
import pathlib
import shutil

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures" / "tokenizer"
TEMPLATE = REPO / "tests" / "fixtures" / "chat_template" / "glm-5.3-flash.jinja"

VOCAB_SIZE = 4096
# GLM-4.5 .. GLM-5.3's pre-tokenizer regex (tokenizer.json; llama.cpp `glm4`).
GLM4_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
# GLM-5.3-Flash's added tokens (ids 154820..154855 there), in order; the first 18 are special.
SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
    "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
]
ADDED_TOKENS = [
    "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>",
]


def glm_pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])


def corpus_files(corpus_dir):
    files = sorted(p for p in pathlib.Path(corpus_dir).iterdir() if p.is_file() and not p.is_symlink())
    if not files:
        raise SystemExit(f"no corpus files in {corpus_dir}")
    return files


def train(corpus_dir):
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = glm_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    n_merged = VOCAB_SIZE - len(SPECIAL_TOKENS) - len(ADDED_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=n_merged, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train([str(p) for p in corpus_files(corpus_dir)], trainer)
    if tok.get_vocab_size() != n_merged:
        raise SystemExit(f"training gave {tok.get_vocab_size()} tokens, expected {n_merged}: corpus too small")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])

    doc = json.loads(tok.to_str())
    doc["model"]["ignore_merges"] = True  # as GLM's tokenizer.json
    return Tokenizer.from_str(json.dumps(doc)), doc


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-dir", default="/usr/share/common-licenses")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()

    tok, doc = train(args.corpus_dir)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    first_added = VOCAB_SIZE - len(SPECIAL_TOKENS) - len(ADDED_TOKENS)
    for i, t in enumerate(SPECIAL_TOKENS + ADDED_TOKENS):
        assert tok.token_to_id(t) == first_added + i, t

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    config = {
        "backend": "tokenizers",
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": "<|endoftext|>",
        "extra_special_tokens": SPECIAL_TOKENS,
        "model_max_length": 1048576,
        "pad_token": "<|endoftext|>",
        "padding_side": "left",
        "remove_space": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(TEMPLATE, args.out / "chat_template.jinja")
    print(f"wrote {args.out}: {tok.get_vocab_size()} tokens ({first_added} merged + "
          f"{len(SPECIAL_TOKENS) + len(ADDED_TOKENS)} added), {len(doc['model']['merges'])} merges")


if __name__ == "__main__":
    main()
