"""ferry's tokenizer against Hugging Face `tokenizers` on the same vocabulary (the test tokenizer in
tests/fixtures/tokenizer: GLM-5.3's pre-tokenizer, GLM-5's added tokens) over a corpus of hard cases,
through `ferry tokenize` / `ferry detokenize` with the tokenizer directory and with a GGUF written the
way llama.cpp's converter writes GLM's (gguf-py, an independent writer)."""
import pathlib
import subprocess

import gguf
import pytest
from tokenizers import Tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "tokenizer"


def _cases():
    cases = [
        "", " ", "  ", "\n", "\t", "\r\n", "\n\n\n", " \n ", "Hello world", " Hello world", "Hello, world!",
        "I'm I'M we'd WE'VE it'll They're can't DON'T 'ſ 'S 'RE 'VE 'LL 'ſtop", "rock'n'roll o'clock ''' '",
        "'ſtop 'Stop it'ſ", "'K 'I\u0307 'D x'LL'Re", "'",
        "1234567890 1234 12 1 0.5 3.14e-10 v1.2.3-rc4 0x1F 2024-06-01",
        "x²+y² ½ ¾ ⅓ Ⅻ ①②③ ١٢٣٤٥ ०१२३ ３．１４",
        "你好世界，今天天气很好。", "日本語のテキスト「こんにちは」！", "한국어 텍스트입니다.",
        "مرحبا بالعالم", "שלום עולם", "Привет, мир! Ёлка", "Γειά σου Κόσμε", "हिन्दी में लिखा गया वाक्य।",
        "ภาษาไทย ສະບາຍດີ ကမ္ဘာ", "cafe\u0301 café e\u0301\u0301 A\u030a\u0323 \u0301\u0308!a !\u0301! abc",
        "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 👨\u200d👩\u200d👧 🏳️\u200d🌈 ❤️",
        "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\tif x >= 10 and y != 'z':\n\t\tpass\n",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
        "    " * 50 + "x", " " * 1000, "\n" * 300, " \t \n \r\n\t\t  \n", "a" * 5000, "=" * 777,
        "!!!!!!??????......''''''```````\"\"\"\"------=======",
        "Hello <think>world</think> [gMASK]<sop><|system|>sys<|user|>hi<|assistant|><think>",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        "<|endoftext|><|endoftext|>x<|observation|><tool_response>ok</tool_response>",
        "text<|begin_of_image|><|image|><|end_of_image|>more /nothink <|code_prefix|>",
        "<think<think>>", "<|user", "</think", "[gMASK", "<arg_key></arg_key>",
        "\u00a0\u2002\u3000 \u2028\u2029 \u0085 \x1c\x1d\x1e\x1f \x0b\x0c", "\u200b\u200c\u200d\ufeff",
        "Ǆǅǆ ǈ ΐ ﬁ ß ẞ K Å ſ İ ı", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈 𓀀", "\x00\x01\x7f",
        "a\r\nb\rc\nd\n\re", "  Hello\n  Hello\n\n", "\n =", "' era", " discards",
        "The GNU General Public License is a free, copyleft license for software and other kinds of works.",
    ]
    # A longer mixed text: every case above joined, so context between them is exercised too.
    cases.append(" | ".join(c for c in cases if len(c) < 300))
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def hf():
    return Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))


@pytest.fixture(scope="module")
def glm_gguf(tmp_path_factory):
    """The fixture tokenizer as a vocab-only GGUF, written with gguf-py as llama.cpp's converter
    writes GLM tokenizers (get_vocab_base token types, _set_vocab_glm special ids)."""
    tok = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    added = {t.content: t for t in tok.get_added_tokens_decoder().values()}
    tokens, types = [], []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        t = by_id[i]
        tokens.append(t)
        if t in added:
            looks_special = t.startswith("<|") and t.endswith("|>")
            types.append(gguf.TokenType.CONTROL if added[t].special or looks_special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    import json
    merges = [" ".join(m) if isinstance(m, list) else m
              for m in json.loads((FIXTURE / "tokenizer.json").read_text())["model"]["merges"]]
    path = tmp_path_factory.mktemp("gguf") / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "glm5next")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("glm4")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["[gMASK]"])
    w.add_eos_token_id(vocab["<|endoftext|>"])
    w.add_eot_token_id(vocab["<|user|>"])
    w.add_eom_token_id(vocab["<|observation|>"])
    w.add_unk_token_id(vocab["<|endoftext|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_chat_template((FIXTURE / "chat_template.jinja").read_text())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def ferry_ids(ferry_bin, model, data: bytes, tmp_path, *extra):
    f = tmp_path / "input.bin"
    f.write_bytes(data)
    out = subprocess.run([ferry_bin, "tokenize", "--model", str(model), "--ids-only", "--file", str(f), *extra],
                         capture_output=True, check=True).stdout.decode()
    return [int(x) for x in out.split()]


def ferry_text(ferry_bin, model, ids, *extra) -> bytes:
    if not ids:
        return b""
    return subprocess.run([ferry_bin, "detokenize", "--model", str(model), *extra, ",".join(map(str, ids))],
                          capture_output=True, check=True).stdout


@pytest.mark.parametrize("model_kind", ["dir", "gguf"])
def test_ids_match_hugging_face(ferry_bin, hf, glm_gguf, tmp_path, model_kind):
    model = FIXTURE if model_kind == "dir" else glm_gguf
    for text in CASES:
        expected = hf.encode(text, add_special_tokens=False).ids
        got = ferry_ids(ferry_bin, model, text.encode(), tmp_path)
        assert got == expected, f"{text!r}"
        assert ferry_text(ferry_bin, model, got) == text.encode(), f"{text!r}"
        assert hf.decode(got, skip_special_tokens=False) == text


def _hf_bytes(hf, data: bytes):
    """What HF's pre-tokenizer and BPE model give for bytes that are not all valid UTF-8: each
    undecodable byte stands as U+FFFD (a symbol, like ferry's undecodable byte) for the regex, and
    the pieces are cut back out of the original bytes before BPE."""
    text = data.decode("utf-8", errors="surrogateescape")
    chars = [(c if not 0xDC80 <= ord(c) <= 0xDCFF else "\ufffd") for c in text]
    raw = [(c.encode("utf-8", errors="surrogateescape")) for c in text]
    ids = []
    for _, (start, end) in hf.pre_tokenizer.pre_tokenize_str("".join(chars)):
        piece = b"".join(raw[start:end])
        byte_level = "".join(BYTE_TO_UNICODE[b] for b in piece)
        ids += [t.id for t in hf.model.tokenize(byte_level)]
    return ids


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_UNICODE = _bytes_to_unicode()

INVALID_UTF8 = [
    b"\xff", b"abc\xffdef", b"\xc3", b"\xc3(", b"caf\xc3", b"\xe2\x82", b"\xe2\x82(x", b"\xf0\x9f\x98",
    b"\xf0\x9f\x98 ok", b"\xed\xa0\x80 surrogate", b"\xc0\xaf overlong", b"\xf5\x80\x80\x80", b"\x80\x80\x80",
    b"Hello \xfe\xfe world \xe4\xbd\xa0\xe5\xa5", b" \xff \xff\xff  \xff\n\xff", "日本".encode() + b"\x80" + "語".encode(),
]


def test_invalid_utf8_encodes_losslessly_like_the_byte_path(ferry_bin, hf, tmp_path):
    # The emulation reproduces HF exactly on valid text:
    for text in CASES[:20]:
        assert _hf_bytes(hf, text.encode()) == hf.encode(text, add_special_tokens=False).ids
    for data in INVALID_UTF8:
        got = ferry_ids(ferry_bin, FIXTURE, data, tmp_path)
        assert got == _hf_bytes(hf, data), data
        assert ferry_text(ferry_bin, FIXTURE, got) == data


def test_special_tokens_as_text_with_no_special(ferry_bin, hf, tmp_path):
    # Control tokens are not matched; user-defined added tokens (<think>) still are.
    text = "<|user|>hi<think>x</think>"
    got = ferry_ids(ferry_bin, FIXTURE, text.encode(), tmp_path, "--no-special")
    vocab = hf.get_vocab()
    assert vocab["<|user|>"] not in got
    assert vocab["<think>"] in got and vocab["</think>"] in got
    assert ferry_text(ferry_bin, FIXTURE, got) == text.encode()


def test_fixture_is_4096_tokens_with_glm_added_tokens_last(hf):
    assert hf.get_vocab_size(with_added_tokens=True) == 4096
    vocab = hf.get_vocab()
    assert vocab["<|endoftext|>"] == 4060 and vocab["</arg_value>"] == 4095 - 5 and vocab["<|video|>"] == 4095


def test_tokenize_output_lists_pieces(ferry_bin):
    out = subprocess.run([ferry_bin, "tokenize", "--model", str(FIXTURE), "Hello\tworld<think>"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[-1] == f"# {len(out) - 1} tokens"
    assert out[-2].endswith("\t<think>")
    assert any(line.endswith("\\t") or "\\t" in line for line in out)


def test_tokenize_and_detokenize_errors(ferry_bin, tmp_path):
    r = subprocess.run([ferry_bin, "tokenize", "--model", str(tmp_path / "nope.gguf"), "x"], capture_output=True, text=True)
    assert r.returncode != 0 and "nope.gguf" in r.stderr
    r = subprocess.run([ferry_bin, "detokenize", "--model", str(FIXTURE), "1,99999"], capture_output=True, text=True)
    assert r.returncode != 0 and "99999" in r.stderr
    r = subprocess.run([ferry_bin, "tokenize", "--model", str(FIXTURE)], capture_output=True, text=True)
    assert r.returncode != 0 and "exactly one" in r.stderr


def _unescape(line: str) -> bytes:
    """Reverses the escapes of `ferry tokenize` pieces (\\n \\t \\r \\\\ \\xNN)."""
    out, i, raw = bytearray(), 0, line.encode()
    while i < len(raw):
        if raw[i:i + 1] == b"\\":
            c = raw[i + 1:i + 2]
            if c == b"x":
                out.append(int(raw[i + 2:i + 4], 16))
                i += 4
                continue
            out += {b"n": b"\n", b"t": b"\t", b"r": b"\r", b"\\": b"\\"}[c]
            i += 2
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def test_pre_tokenizer_splits_exactly_like_hugging_face(ferry_bin, hf, tmp_path):
    """The pieces themselves (a different split could still give the same ids with a small vocab)."""
    added = hf.get_added_tokens_decoder()
    for text in CASES:
        if any(t.content in text for t in added.values()):
            continue  # added tokens are cut out before the pre-tokenizer runs
        expected = [text[a:b].encode() for _, (a, b) in hf.pre_tokenizer.pre_tokenize_str(text)]
        f = tmp_path / "input.txt"
        f.write_bytes(text.encode())
        out = subprocess.run([ferry_bin, "tokenize", "--model", str(FIXTURE), "--split", "--file", str(f)],
                             capture_output=True, check=True).stdout.decode()
        got = [_unescape(line) for line in out.split("\n")[:-1]]
        assert got == expected, f"{text!r}"
