#pragma once
// The tokenizer's two storage forms and the bridges between them:
//  - GGUF metadata `tokenizer.ggml.*` (what ferry loads at run time), as llama.cpp's converter writes
//    it for GLM (`_set_vocab_glm`): model "gpt2", pre "glm4", tokens, token_type, merges, the
//    special ids (bos [gMASK], eos and pad <|endoftext|>, eot <|user|>, eom <|observation|>,
//    unk <|endoftext|>) and tokenizer.chat_template;
//  - a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json, chat_template.jinja
//    when present), which `ferry convert --tokenizer DIR` turns into the former.
#include <filesystem>

#include "model/formats/gguf.hpp"
#include "config/expected.hpp"
#include "model/text/tokenizer.hpp"

namespace ferry::model {

class GgufWriter;

// Reads `tokenizer.ggml.*` (model must be "gpt2"). The error names the key and what was wrong.
Expected<TokenizerSpec> read_tokenizer_spec(const GgufFile& file);
Expected<Tokenizer> load_tokenizer(const GgufFile& file);
// A GGUF file, or a Hugging Face tokenizer directory (for debugging a tokenizer before conversion).
Expected<Tokenizer> load_tokenizer(const std::filesystem::path& path);

// Reads a Hugging Face tokenizer directory: a byte-level BPE tokenizer.json (vocab, merges in either
// serialisation, added_tokens with their `special` flag, the pre-tokenizer regex, which must be one
// ferry implements), tokenizer_config.json (eos_token, pad_token) and chat_template.jinja (else
// tokenizer_config's chat_template). Token types follow llama.cpp's converter: added special →
// control, added non-special → user_defined, ids with no token → "[PADn]" unused. The special ids
// follow `_set_vocab_glm` when the GLM tokens are present (bos [gMASK], eot <|user|>,
// eom <|observation|>, unk <|endoftext|>). `vocab_size`, when larger than the tokenizer's, pads the
// token list to the model's embedding rows (GLM-5.3: 154,856 tokens, 154,880 rows).
Expected<TokenizerSpec> read_hf_tokenizer_dir(const std::filesystem::path& dir, size_t vocab_size = 0);

// Writes the spec as `tokenizer.ggml.*` keys (and tokenizer.chat_template when non-empty).
Status write_tokenizer_metadata(GgufWriter& writer, const TokenizerSpec& spec);
// read_hf_tokenizer_dir + write_tokenizer_metadata: what `ferry convert --tokenizer DIR` calls.
Status write_tokenizer_metadata(GgufWriter& writer, const std::filesystem::path& hf_tokenizer_dir,
                                size_t vocab_size = 0);

}  // namespace ferry::model
