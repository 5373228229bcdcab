#pragma once
// Per-tensor type rules: what `ferry convert --tensor-type REGEX=TYPE` and `--recipe FILE` say, and
// what `--synthetic ... --recipe FILE` builds. A rule gives every GGUF tensor whose name matches its
// regular expression (ECMAScript, searched anywhere in the name, as llama-quantize's --tensor-type)
// a type; the first matching rule wins. The catalogue's small state (Glm5TensorSpec::keep_f32: norms,
// biases, conv taps, the router, the mHC mixers) stays F32 whatever the rules say, as llama-quantize
// never quantizes those; rows that are not a whole number of the type's blocks fall back (the
// converter and the synthesizer each say to what).
//
// A recipe file holds one rule per line; blank lines and lines whose first non-blank character is
// '#' are comments. The rule splits at its last '=' (a type name has none, a regex may).
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "config/expected.hpp"
#include "model/formats/ggml_type.hpp"
#include "model/glm5/glm5_tensors.hpp"

namespace ferry::model {

struct Glm5TypeRule {
  std::string pattern;  // as written
  GgmlType type = GgmlType::F32;
  std::string origin;   // "--tensor-type" or "FILE:LINE", for messages
  std::regex regex;
};

class Glm5TypeRules {
 public:
  // "REGEX=TYPE" specs (each an error naming the spec and `origin` when malformed: no '=', an empty
  // pattern, an invalid regular expression, a type ferry cannot write).
  static Expected<Glm5TypeRules> parse(const std::vector<std::string>& specs, std::string_view origin);
  static Expected<Glm5TypeRules> parse_recipe(std::string_view text, std::string_view origin);
  static Expected<Glm5TypeRules> load_recipe(const std::filesystem::path& path);

  // Rules of `later` after these (so these win where both match).
  void append(const Glm5TypeRules& later);
  bool empty() const { return rules_.empty(); }
  const std::vector<Glm5TypeRule>& rules() const { return rules_; }

  // The first matching rule, or nullptr.
  const Glm5TypeRule* match(std::string_view tensor_name) const;
  // The type these rules ask for `spec` before any block fallback: F32 for the catalogue's small
  // state, else the first matching rule's type, else `otherwise`.
  GgmlType requested(const Glm5TensorSpec& spec, GgmlType otherwise) const;

 private:
  std::vector<Glm5TypeRule> rules_;
};

// Types `ferry convert` can write (and a rule may name): f32, f16, bf16, q8_0, q4_K, q5_K, q6_K,
// iq4_xs, iq3_s.
bool glm5_writable_type(GgmlType type);
std::string glm5_writable_type_names();  // "f32, f16, ..., iq3_s"

}  // namespace ferry::model
