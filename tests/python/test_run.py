"""`ferry run`: greedy generation on the CPU backend reproduces transformers' greedy decode of the
serve_tiny reference case, and --prompt goes through the tokenizer embedded by ferry convert."""
import json
import pathlib
import subprocess

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
CASE = FIXTURES / "glm5" / "serve_tiny"


def convert(ferry_bin, out, *extra):
    subprocess.run([ferry_bin, "convert", str(CASE), str(out), "--type", "f32", "--quiet", *extra], check=True,
                   capture_output=True)
    return out


def test_greedy_ids_match_transformers(ferry_bin, tmp_path):
    ref = json.loads((CASE / "reference.json").read_text())
    model = convert(ferry_bin, tmp_path / "m.gguf")
    r = subprocess.run([ferry_bin, "run", "--model", str(model), "--prompt-ids", ",".join(map(str, ref["input_ids"])),
                        "-n", str(ref["decode_steps"]), "--threads", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [int(x) for x in r.stdout.split()] == ref["decode_tokens"]


def test_prompt_text_and_bad_ids(ferry_bin, tmp_path):
    model = convert(ferry_bin, tmp_path / "t.gguf", "--tokenizer", str(FIXTURES / "tokenizer"))
    r = subprocess.run([ferry_bin, "run", "--model", str(model), "--prompt", "Hello, world", "-n", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and len(lines[0].split()) == 4
    r = subprocess.run([ferry_bin, "run", "--model", str(model), "--prompt-ids", "1,99999"], capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert "99999 is outside the vocabulary" in r.stderr


def test_without_model_runs_the_embedded_default_model_which_answers_in_words(ferry_bin):
    """No --model: the default model embedded in ferry, as `ferry serve` falls back to (the trained
    fixture, which knows its licenses by heart), the same as the file the build converts beside it."""
    default = pathlib.Path(ferry_bin).parent / "ferry-default.gguf"
    prompt = ["--prompt", "Permission is hereby granted", "-n", "12", "--threads", "2"]
    embedded = subprocess.run([ferry_bin, "run", *prompt], capture_output=True, text=True)
    assert embedded.returncode == 0, embedded.stderr
    assert "the embedded default model" in embedded.stderr
    from_file = subprocess.run([ferry_bin, "run", "--model", str(default), *prompt], capture_output=True, text=True)
    assert from_file.returncode == 0, from_file.stderr
    assert embedded.stdout == from_file.stdout
    text = embedded.stdout.splitlines()[1]
    assert "free of charge" in text, text  # the MIT license's next words, not gibberish
