#pragma once
#include <span>
#include <string>

#include "config/expected.hpp"

namespace ferry::cli {

// The GGUF bytes of the embedded default model; empty when this build has none.
std::span<const unsigned char> default_model_bytes();

// A path to the embedded default model, for the commands that fall back to it without --model
// (serve, run): an in-memory file (memfd) that the backend maps like any model file, open for the
// process's life. The error says that this build has none, naming `command`.
Expected<std::string> default_model_path(const std::string& command);

}  // namespace ferry::cli
