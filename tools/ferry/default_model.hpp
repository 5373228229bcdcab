#pragma once
#include <span>

namespace ferry::cli {

// The GGUF bytes of the embedded default model; empty when this build has none.
std::span<const unsigned char> default_model_bytes();

}  // namespace ferry::cli
