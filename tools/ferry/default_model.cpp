// The default model of `ferry serve` (model/default_model/ferry-default.gguf, a small glm5_next
// checkpoint with the 4096-token test tokenizer), assembled into the binary with .incbin so that
// `ferry serve` with no --model works on any machine. tools/CMakeLists.txt makes this file depend on
// the GGUF; a checkout without the file builds a ferry without a default model.
#include "tools/ferry/default_model.hpp"

#if __has_include("model/default_model/ferry-default.gguf")
#define FERRY_HAS_DEFAULT_MODEL 1
__asm__(
    ".section .rodata.ferry_default_model,\"a\",@progbits\n"
    ".balign 64\n"
    ".global ferry_default_model_begin\n"
    "ferry_default_model_begin:\n"
    ".incbin \"" FERRY_SOURCE_DIR "/model/default_model/ferry-default.gguf\"\n"
    ".global ferry_default_model_end\n"
    "ferry_default_model_end:\n"
    ".previous\n");
extern "C" const unsigned char ferry_default_model_begin[];
extern "C" const unsigned char ferry_default_model_end[];
#endif

namespace ferry::cli {

std::span<const unsigned char> default_model_bytes() {
#ifdef FERRY_HAS_DEFAULT_MODEL
  return {ferry_default_model_begin, static_cast<size_t>(ferry_default_model_end - ferry_default_model_begin)};
#else
  return {};
#endif
}

}  // namespace ferry::cli
