// The default model's GGUF in `ferry`, assembled into the binary with .incbin so that serve and run
// work with no --model on any machine. FERRY_DEFAULT_MODEL is the file the build converts from the
// trained_small reference checkpoint (tools/CMakeLists.txt, which makes this file depend on it).
#include "tools/ferry/default_model.hpp"

__asm__(
    ".section .rodata.ferry_default_model,\"a\",@progbits\n"
    ".balign 64\n"
    ".global ferry_default_model_begin\n"
    "ferry_default_model_begin:\n"
    ".incbin \"" FERRY_DEFAULT_MODEL "\"\n"
    ".global ferry_default_model_end\n"
    "ferry_default_model_end:\n"
    ".previous\n");
extern "C" const unsigned char ferry_default_model_begin[];
extern "C" const unsigned char ferry_default_model_end[];

namespace ferry::cli {

std::span<const unsigned char> default_model_bytes() {
  return {ferry_default_model_begin, static_cast<size_t>(ferry_default_model_end - ferry_default_model_begin)};
}

}  // namespace ferry::cli
