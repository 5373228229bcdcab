#include "model/glm5/glm5_type_rules.hpp"

#include <array>
#include <fstream>
#include <sstream>

#include "model/formats/quant.hpp"

namespace ferry::model {
namespace {

constexpr std::array kWritable = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,   GgmlType::Q8_0, GgmlType::Q4_K,
                                  GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::IQ3_S};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

Expected<Glm5TypeRule> parse_rule(std::string_view spec, const std::string& origin) {
  const std::string quoted = "'" + std::string(spec) + "'";
  const size_t eq = spec.rfind('=');
  if (eq == std::string_view::npos) {
    return Error(origin + ": " + quoted + " is not REGEX=TYPE (e.g. 'ffn_down_exps=q5_k')");
  }
  Glm5TypeRule rule;
  rule.pattern = std::string(trim(spec.substr(0, eq)));
  rule.origin = origin;
  const std::string type_name(trim(spec.substr(eq + 1)));
  if (rule.pattern.empty()) return Error(origin + ": " + quoted + " has an empty regular expression");
  const auto type = ggml_type_from_name(type_name);
  if (!type || !glm5_writable_type(*type)) {
    return Error(ErrorCode::unsupported, origin + ": " + quoted + " names type '" + type_name + "', expected one of " +
                                             glm5_writable_type_names());
  }
  rule.type = *type;
  try {
    rule.regex = std::regex(rule.pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Error(origin + ": '" + rule.pattern + "' is not a valid regular expression: " + e.what());
  }
  return rule;
}

}  // namespace

bool glm5_writable_type(GgmlType type) {
  for (GgmlType t : kWritable) {
    if (t == type) return can_quantize(type);
  }
  return false;
}

std::string glm5_writable_type_names() {
  std::string out;
  for (GgmlType t : kWritable) out += (out.empty() ? "" : ", ") + std::string(ggml_type_traits(t).name);
  return out;
}

Expected<Glm5TypeRules> Glm5TypeRules::parse(const std::vector<std::string>& specs, std::string_view origin) {
  Glm5TypeRules out;
  for (const std::string& spec : specs) {
    auto rule = parse_rule(spec, std::string(origin));
    if (!rule) return rule.error();
    out.rules_.push_back(std::move(rule.value()));
  }
  return out;
}

Expected<Glm5TypeRules> Glm5TypeRules::parse_recipe(std::string_view text, std::string_view origin) {
  Glm5TypeRules out;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line = trim(text.substr(pos, end - pos));
    ++line_no;
    pos = end + 1;
    if (line.empty() || line.front() == '#') continue;
    auto rule = parse_rule(line, std::string(origin) + ":" + std::to_string(line_no));
    if (!rule) return rule.error();
    out.rules_.push_back(std::move(rule.value()));
  }
  return out;
}

Expected<Glm5TypeRules> Glm5TypeRules::load_recipe(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(ErrorCode::io, "--recipe " + path.string() + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Error(ErrorCode::io, "--recipe " + path.string() + ": read error");
  return parse_recipe(text.str(), path.string());
}

void Glm5TypeRules::append(const Glm5TypeRules& later) {
  rules_.insert(rules_.end(), later.rules_.begin(), later.rules_.end());
}

const Glm5TypeRule* Glm5TypeRules::match(std::string_view tensor_name) const {
  for (const Glm5TypeRule& r : rules_) {
    if (std::regex_search(tensor_name.begin(), tensor_name.end(), r.regex)) return &r;
  }
  return nullptr;
}

GgmlType Glm5TypeRules::requested(const Glm5TensorSpec& spec, GgmlType otherwise) const {
  if (spec.keep_f32) return GgmlType::F32;
  const Glm5TypeRule* r = match(spec.name);
  return r != nullptr ? r->type : otherwise;
}

}  // namespace ferry::model
