// No default model: the build's converter (ferry_no_default, tools/CMakeLists.txt) is a ferry that makes
// the default model's GGUF before `ferry` can embed it.
#include "tools/ferry/default_model.hpp"

namespace ferry::cli {

std::span<const unsigned char> default_model_bytes() { return {}; }

}  // namespace ferry::cli
