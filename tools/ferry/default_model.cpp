// The default model of `ferry serve` and `ferry run` (model/default_model/ferry-default.gguf, a small
// trained glm5_next model with the 4096-token test tokenizer), assembled into the binary with .incbin
// so that both work with no --model on any machine. tools/CMakeLists.txt makes this file depend on
// the GGUF; a checkout without the file builds a ferry without a default model.
#include "tools/ferry/default_model.hpp"

#include <sys/mman.h>
#include <unistd.h>

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

Expected<std::string> default_model_path(const std::string& command) {
  const auto bytes = default_model_bytes();
  if (bytes.empty()) {
    return Error("no --model given and this ferry was built without the default model "
                 "(model/default_model/ferry-default.gguf was missing at build time): pass " + command +
                 " --model FILE.gguf");
  }
  // An in-memory file: the backend maps it by path like any model file, nothing touches the disk.
  const int fd = ::memfd_create("ferry-default.gguf", MFD_CLOEXEC);
  if (fd < 0) return Error(ErrorCode::io, "cannot create an in-memory file for the default model");
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n <= 0) {
      ::close(fd);
      return Error(ErrorCode::io, "cannot write the default model to its in-memory file");
    }
    written += static_cast<size_t>(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);  // the descriptor stays open for the process's life
}

}  // namespace ferry::cli
