// The default model of `ferry serve` and `ferry run` (a small trained glm5_next model with the 4096-token
// test tokenizer: model/default_model/README.md), served from the bytes default_model_bytes() gives:
// default_model_embedded.cpp assembles them into `ferry`, default_model_none.cpp gives none to the
// build's converter (tools/CMakeLists.txt).
#include "tools/ferry/default_model.hpp"

#include <sys/mman.h>
#include <unistd.h>

namespace ferry::cli {

Expected<std::string> default_model_path(const std::string& command) {
  const auto bytes = default_model_bytes();
  if (bytes.empty()) {
    return Error("no --model given and this binary has no default model built in: pass " + command +
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
