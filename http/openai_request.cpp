#include "http/openai_request.hpp"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>

#include "http/safe_text.hpp"

namespace ferry::http {
namespace {

namespace od = simdjson::ondemand;
using model::JsonValue;
using MaybeError = std::optional<ApiError>;

constexpr int kMaxDepth = 64;

ApiError malformed(simdjson::error_code e, std::string_view where) {
  std::string message = "the request body is not valid JSON";
  if (e == simdjson::UTF8_ERROR) message = "the request body is not valid UTF-8";
  if (!where.empty()) message += std::string(" (at ") + std::string(where) + ")";
  message += std::string(": ") + simdjson::error_message(e);
  return invalid_field(std::string(where), std::move(message), "invalid_json");
}

// The value of a JSON number literal; NaN when it does not read (never throws).
double number_value(const JsonValue& v) {
  if (!v.is_number()) return std::numeric_limits<double>::quiet_NaN();
  const std::string& t = v.as_number().text;
  double d = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
  if (ec != std::errc() || end != t.data() + t.size()) return std::numeric_limits<double>::quiet_NaN();
  return d;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Reads any JSON value into the text side's document model (numbers kept as written), validating
// every scalar on the way so that malformed JSON anywhere in the body is reported.
MaybeError to_json(od::value v, const std::string& path, int depth, JsonValue& out) {
  if (depth > kMaxDepth) return invalid_field(path, path + ": nested deeper than 64 levels");
  od::json_type type;
  if (auto e = v.type().get(type)) return malformed(e, path);
  switch (type) {
    case od::json_type::object: {
      od::object obj;
      if (auto e = v.get_object().get(obj)) return malformed(e, path);
      model::JsonObject members;
      for (auto field : obj) {
        std::string_view key;
        if (auto e = field.unescaped_key().get(key)) return malformed(e, path);
        std::string name(key);
        od::value child;
        if (auto e = field.value().get(child)) return malformed(e, path + "." + name);
        JsonValue value;
        if (auto err = to_json(child, path + "." + name, depth + 1, value)) return err;
        bool replaced = false;  // a repeated key keeps its first position and its last value
        for (auto& [k, existing] : members) {
          if (k == name) {
            existing = std::move(value);
            replaced = true;
            break;
          }
        }
        if (!replaced) members.emplace_back(std::move(name), std::move(value));
      }
      out = JsonValue(std::move(members));
      return std::nullopt;
    }
    case od::json_type::array: {
      od::array arr;
      if (auto e = v.get_array().get(arr)) return malformed(e, path);
      model::JsonArray items;
      size_t i = 0;
      for (auto element : arr) {
        const std::string at = path + "[" + std::to_string(i++) + "]";
        od::value child;
        if (auto e = element.get(child)) return malformed(e, at);
        JsonValue value;
        if (auto err = to_json(child, at, depth + 1, value)) return err;
        items.push_back(std::move(value));
      }
      out = JsonValue(std::move(items));
      return std::nullopt;
    }
    case od::json_type::string: {
      std::string_view s;
      if (auto e = v.get_string().get(s)) return malformed(e, path);
      out = JsonValue(std::string(s));
      return std::nullopt;
    }
    case od::json_type::number: {
      const std::string_view raw = v.raw_json_token();
      auto parsed = model::parse_json(trim(raw));
      if (!parsed || !parsed->is_number()) {
        return invalid_field(path, "the request body is not valid JSON (at " + path + "): bad number '" +
                                       excerpt(trim(raw)) + "'",
                             "invalid_json");
      }
      out = std::move(parsed.value());
      return std::nullopt;
    }
    case od::json_type::boolean: {
      bool b = false;
      if (auto e = v.get_bool().get(b)) return malformed(e, path);
      out = JsonValue(b);
      return std::nullopt;
    }
    case od::json_type::null: {
      bool null = false;
      if (auto e = v.is_null().get(null); e || !null) return malformed(e ? e : simdjson::INCORRECT_TYPE, path);
      out = JsonValue(nullptr);
      return std::nullopt;
    }
  }
  return malformed(simdjson::TAPE_ERROR, path);
}

bool is_null(od::value& v) {
  od::json_type type;
  return !v.type().get(type) && type == od::json_type::null;
}

MaybeError read_float(od::value& v, const std::string& name, double lo, double hi, bool lo_open,
                      std::optional<float>& out) {
  if (is_null(v)) return std::nullopt;
  double d = 0;
  if (v.get_double().get(d)) return invalid_field(name, name + " must be a number");
  const bool ok = std::isfinite(d) && (lo_open ? d > lo : d >= lo) && d <= hi;
  if (!ok) {
    return invalid_field(name, name + " = " + short_number(d) + ": expected a number in " + (lo_open ? "(" : "[") +
                                   short_number(lo) + ", " + short_number(hi) + "]");
  }
  out = static_cast<float>(d);
  return std::nullopt;
}

MaybeError read_int(od::value& v, const std::string& name, int64_t lo, int64_t hi, int64_t& out) {
  if (v.get_int64().get(out)) return invalid_field(name, name + " must be an integer");
  if (out < lo || out > hi) {
    return invalid_field(name, name + " = " + std::to_string(out) + ": expected an integer in [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return std::nullopt;
}

MaybeError read_bool(od::value& v, const std::string& name, bool& out) {
  if (is_null(v)) return std::nullopt;
  if (v.get_bool().get(out)) return invalid_field(name, name + " must be true or false");
  return std::nullopt;
}

MaybeError read_string(od::value& v, const std::string& name, std::string& out) {
  std::string_view s;
  if (v.get_string().get(s)) return invalid_field(name, name + " must be a string");
  out.assign(s);
  return std::nullopt;
}

// A field the request may carry only with its "off" value: ferry does not implement the feature.
MaybeError only_default(od::value& v, const std::string& name, const char* what) {
  JsonValue value;
  if (auto err = to_json(v, name, 1, value)) return err;
  const bool off = value.is_null() || (value.is_bool() && !value.as_bool()) ||
                   (value.is_number() && number_value(value) == 0) ||
                   (value.is_object() && value.as_object().empty());
  if (off) return std::nullopt;
  return invalid_field(name, name + " is not supported by ferry (" + what + ")", "unsupported_parameter");
}

// The fields chat and completions share. Returns false when `key` is not one of them.
bool read_common(const std::string& key, od::value& v, GenerationOptions& o, MaybeError& err) {
  int64_t i = 0;
  if (key == "model") {
    err = read_string(v, key, o.model);
  } else if (key == "temperature") {
    err = read_float(v, key, 0, 2, false, o.temperature);
  } else if (key == "top_p") {
    err = read_float(v, key, 0, 1, true, o.top_p);
  } else if (key == "min_p") {
    err = read_float(v, key, 0, 1, false, o.min_p);
  } else if (key == "top_k") {
    if (!is_null(v) && !(err = read_int(v, key, -1, std::numeric_limits<uint32_t>::max(), i))) {
      o.top_k = static_cast<uint32_t>(i < 0 ? 0 : i);
    }
  } else if (key == "seed") {
    if (!is_null(v) && !(err = read_int(v, key, std::numeric_limits<int64_t>::min(),
                                        std::numeric_limits<int64_t>::max(), i))) {
      o.seed = static_cast<uint64_t>(i);
    }
  } else if (key == "max_tokens" || key == "max_completion_tokens") {
    if (!is_null(v) && !(err = read_int(v, key, 1, std::numeric_limits<uint32_t>::max(), i))) {
      // max_completion_tokens (the current name) wins over max_tokens, in whatever order they come.
      if (key == "max_completion_tokens" || !o.max_completion_tokens_seen) o.max_tokens = static_cast<uint32_t>(i);
      if (key == "max_completion_tokens") o.max_completion_tokens_seen = true;
    }
  } else if (key == "min_tokens") {
    if (!is_null(v) && !(err = read_int(v, key, 0, std::numeric_limits<uint32_t>::max(), i))) {
      o.min_tokens = static_cast<uint32_t>(i);
    }
  } else if (key == "stop") {
    JsonValue stop;
    if ((err = to_json(v, key, 1, stop))) return true;
    if (stop.is_null()) return true;
    if (stop.is_string()) stop = JsonValue(model::JsonArray{stop});
    if (!stop.is_array()) {
      err = invalid_field(key, "stop must be a string or an array of strings");
      return true;
    }
    if (stop.as_array().size() > 16) {
      err = invalid_field(key, "stop has " + std::to_string(stop.as_array().size()) + " strings: at most 16");
      return true;
    }
    for (size_t k = 0; k < stop.as_array().size(); ++k) {
      const JsonValue& s = stop.as_array()[k];
      if (!s.is_string() || s.as_string().empty()) {
        err = invalid_field("stop[" + std::to_string(k) + "]", "stop[" + std::to_string(k) + "] must be a non-empty string");
        return true;
      }
      o.stop.push_back(s.as_string());
    }
  } else if (key == "n") {
    if (!is_null(v) && !(err = read_int(v, key, 1, 1 << 20, i)) && i != 1) {
      err = invalid_field(key, "n = " + std::to_string(i) + ": ferry returns one choice per request (n = 1)",
                          "unsupported_parameter");
    }
  } else if (key == "stream") {
    err = read_bool(v, key, o.stream);
  } else if (key == "stream_options") {
    if (is_null(v)) return true;
    od::object obj;
    if (v.get_object().get(obj)) {
      err = invalid_field(key, "stream_options must be an object");
      return true;
    }
    for (auto field : obj) {
      std::string_view k;
      od::value fv;
      if (auto e = field.unescaped_key().get(k)) { err = malformed(e, key); return true; }
      if (auto e = field.value().get(fv)) { err = malformed(e, key); return true; }
      if (k == "include_usage") {
        err = read_bool(fv, "stream_options.include_usage", o.include_usage);
      } else {
        JsonValue ignored;
        err = to_json(fv, "stream_options." + std::string(k), 2, ignored);
      }
      if (err) return true;
    }
  } else if (key == "return_token_ids") {
    err = read_bool(v, key, o.return_token_ids);
  } else if (key == "ignore_eos") {
    err = read_bool(v, key, o.ignore_eos);
  } else if (key == "cache_prompt") {
    err = read_bool(v, key, o.cache_prompt);
  } else if (key == "repetition_penalty" || key == "best_of") {
    JsonValue value;
    if ((err = to_json(v, key, 1, value))) return true;
    if (!value.is_null() && number_value(value) != 1) {
      err = invalid_field(key, key + " is not supported by ferry (only 1)", "unsupported_parameter");
    }
  } else if (key == "frequency_penalty" || key == "presence_penalty") {
    err = only_default(v, key, "only 0");
  } else if (key == "logprobs" || key == "top_logprobs" || key == "logit_bias" || key == "echo" || key == "suffix") {
    err = only_default(v, key, "not implemented");
  } else {
    return false;
  }
  return true;
}

// Parses the body's top-level object; `on_field` handles each member (after the common ones).
MaybeError parse_object(std::string_view body, GenerationOptions& options,
                        const std::function<MaybeError(const std::string&, od::value&)>& on_field) {
  // A parser is not thread-safe: one per HTTP thread, reused. It keeps buffers as large as the largest
  // document it parsed, so a body of megabytes gets a parser of its own, freed with it.
  thread_local od::parser reused;
  std::optional<od::parser> own;
  od::parser& parser = body.size() > (size_t{1} << 20) ? own.emplace() : reused;
  const simdjson::padded_string padded(body);
  od::document doc;
  if (auto e = parser.iterate(padded).get(doc)) return malformed(e, "");
  // On-demand parsing stops at the end of the root value: anything after it must be whitespace.
  std::string_view root;
  if (auto e = doc.raw_json().get(root)) return malformed(e, "");
  auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  for (size_t i = static_cast<size_t>(root.data() - padded.data()) + root.size(); i < padded.size(); ++i) {
    if (!is_space(padded.data()[i])) {
      return invalid_field("", "the request body has content after the JSON value", "invalid_json");
    }
  }
  doc.rewind();
  od::object obj;
  if (auto e = doc.get_object().get(obj)) {
    if (e == simdjson::INCORRECT_TYPE) return invalid_field("", "the request body must be a JSON object", "invalid_json");
    return malformed(e, "");
  }
  for (auto field : obj) {
    std::string_view k;
    if (auto e = field.unescaped_key().get(k)) return malformed(e, "");
    const std::string key(k);
    od::value v;
    if (auto e = field.value().get(v)) return malformed(e, key);
    MaybeError err;
    if (!read_common(key, v, options, err)) {
      err = on_field(key, v);
    }
    if (err) return err;
  }
  return std::nullopt;
}

MaybeError ignore_field(const std::string& key, od::value& v) {
  JsonValue ignored;
  return to_json(v, key, 1, ignored);  // still validated: malformed JSON anywhere is an error
}

std::string at(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

MaybeError validate_content(const JsonValue* content, const std::string& path, bool optional) {
  if (content == nullptr || content->is_null()) {
    if (optional) return std::nullopt;
    return invalid_field(path, path + " is required (a string or an array of text parts)");
  }
  if (content->is_string()) return std::nullopt;
  if (!content->is_array()) return invalid_field(path, path + " must be a string or an array of text parts");
  const auto& parts = content->as_array();
  for (size_t j = 0; j < parts.size(); ++j) {
    const std::string part = at(path, j);
    const JsonValue* type = parts[j].find("type");
    if (!parts[j].is_object() || type == nullptr || !type->is_string()) {
      return invalid_field(part, part + " must be an object with a \"type\"");
    }
    if (type->as_string() != "text") {
      return invalid_field(part + ".type", part + ".type = '" + excerpt(type->as_string()) +
                                               "': only text parts are supported by this model server",
                           "unsupported_content");
    }
    const JsonValue* text = parts[j].find("text");
    if (text == nullptr || !text->is_string()) return invalid_field(part + ".text", part + ".text must be a string");
  }
  return std::nullopt;
}

MaybeError validate_tool_calls(const JsonValue& calls, const std::string& path) {
  if (calls.is_null()) return std::nullopt;
  if (!calls.is_array()) return invalid_field(path, path + " must be an array");
  for (size_t j = 0; j < calls.as_array().size(); ++j) {
    const JsonValue& call = calls.as_array()[j];
    const std::string p = at(path, j);
    if (!call.is_object()) return invalid_field(p, p + " must be an object");
    if (const JsonValue* type = call.find("type"); type && !(type->is_string() && type->as_string() == "function")) {
      return invalid_field(p + ".type", p + ".type must be \"function\"");
    }
    if (const JsonValue* id = call.find("id"); id && !id->is_string() && !id->is_null()) {
      return invalid_field(p + ".id", p + ".id must be a string");
    }
    const JsonValue* fn = call.find("function");
    if (fn == nullptr || !fn->is_object()) return invalid_field(p + ".function", p + ".function must be an object");
    const JsonValue* name = fn->find("name");
    if (name == nullptr || !name->is_string() || name->as_string().empty()) {
      return invalid_field(p + ".function.name", p + ".function.name must be a non-empty string");
    }
    const JsonValue* args = fn->find("arguments");
    if (args != nullptr && !args->is_string() && !args->is_object()) {
      return invalid_field(p + ".function.arguments", p + ".function.arguments must be a JSON object or a string holding one");
    }
  }
  return std::nullopt;
}

MaybeError validate_messages(const JsonValue& messages) {
  if (!messages.is_array()) return invalid_field("messages", "messages must be an array of message objects");
  if (messages.as_array().empty()) return invalid_field("messages", "messages must not be empty");
  for (size_t i = 0; i < messages.as_array().size(); ++i) {
    const JsonValue& m = messages.as_array()[i];
    const std::string p = at("messages", i);
    if (!m.is_object()) return invalid_field(p, p + " must be an object");
    const JsonValue* role = m.find("role");
    if (role == nullptr || !role->is_string()) return invalid_field(p + ".role", p + ".role is required (a string)");
    const std::string& r = role->as_string();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool") {
      return invalid_field(p + ".role",
                           p + ".role = '" + excerpt(r) + "': expected system, developer, user, assistant or tool");
    }
    if (auto err = validate_content(m.find("content"), p + ".content", r == "assistant")) return err;
    if (r == "assistant") {
      if (const JsonValue* calls = m.find("tool_calls")) {
        if (auto err = validate_tool_calls(*calls, p + ".tool_calls")) return err;
      }
      if (const JsonValue* rc = m.find("reasoning_content"); rc && !rc->is_null() && !rc->is_string()) {
        return invalid_field(p + ".reasoning_content", p + ".reasoning_content must be a string");
      }
    }
    if (const JsonValue* id = m.find("tool_call_id"); id && !id->is_null() && !id->is_string()) {
      return invalid_field(p + ".tool_call_id", p + ".tool_call_id must be a string");
    }
    if (const JsonValue* name = m.find("name"); name && !name->is_null() && !name->is_string()) {
      return invalid_field(p + ".name", p + ".name must be a string");
    }
  }
  return std::nullopt;
}

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

MaybeError validate_tools(const JsonValue& tools) {
  if (tools.is_null()) return std::nullopt;
  if (!tools.is_array()) return invalid_field("tools", "tools must be an array of tool objects");
  for (size_t i = 0; i < tools.as_array().size(); ++i) {
    const JsonValue& t = tools.as_array()[i];
    const std::string p = at("tools", i);
    if (!t.is_object()) return invalid_field(p, p + " must be an object");
    const JsonValue* type = t.find("type");
    if (type == nullptr || !type->is_string() || type->as_string() != "function") {
      return invalid_field(p + ".type", p + ".type must be \"function\"");
    }
    const JsonValue* fn = t.find("function");
    if (fn == nullptr || !fn->is_object()) return invalid_field(p + ".function", p + ".function must be an object");
    const JsonValue* name = fn->find("name");
    if (name == nullptr || !name->is_string() || !valid_function_name(name->as_string())) {
      return invalid_field(p + ".function.name",
                           p + ".function.name must be 1 to 64 characters of a-z, A-Z, 0-9, '_', '-' or '.'");
    }
    if (const JsonValue* d = fn->find("description"); d && !d->is_null() && !d->is_string()) {
      return invalid_field(p + ".function.description", p + ".function.description must be a string");
    }
    if (const JsonValue* params = fn->find("parameters"); params && !params->is_null()) {
      const std::string pp = p + ".function.parameters";
      if (!params->is_object()) return invalid_field(pp, pp + " must be a JSON Schema object");
      if (const JsonValue* ty = params->find("type"); ty && !(ty->is_string() && ty->as_string() == "object")) {
        return invalid_field(pp + ".type", pp + ".type must be \"object\"");
      }
      if (const JsonValue* props = params->find("properties"); props && !props->is_object()) {
        return invalid_field(pp + ".properties", pp + ".properties must be an object");
      }
    }
  }
  return std::nullopt;
}

// OpenAI's levels, and GLM's own "max" (what the template writes when the level is not low or high).
constexpr std::string_view kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};

MaybeError check_effort(const std::string& name, const std::string& effort) {
  for (std::string_view e : kEfforts) {
    if (effort == e) return std::nullopt;
  }
  return invalid_field(name, name + " = '" + excerpt(effort) +
                                 "': expected none, minimal, low, medium, high, xhigh or max (none and minimal turn "
                                 "thinking off)");
}

// Fields that are valid alone but not together.
MaybeError check_limits(const GenerationOptions& o) {
  if (o.max_tokens && o.min_tokens > *o.max_tokens) {
    return invalid_field("min_tokens", "min_tokens = " + std::to_string(o.min_tokens) + " is more than max_tokens = " +
                                           std::to_string(*o.max_tokens));
  }
  return std::nullopt;
}

// "developer" is what current OpenAI clients send for instructions that "system" carried before;
// the template knows system.
void developer_is_system(JsonValue& messages) {
  for (JsonValue& m : messages.as_array()) {
    for (auto& [key, value] : m.as_object()) {
      if (key == "role" && value.is_string() && value.as_string() == "developer") value = JsonValue("system");
    }
  }
}

MaybeError read_template_kwargs(od::value& v, ChatRequest& r) {
  if (is_null(v)) return std::nullopt;
  JsonValue kwargs;
  if (auto err = to_json(v, "chat_template_kwargs", 1, kwargs)) return err;
  if (!kwargs.is_object()) return invalid_field("chat_template_kwargs", "chat_template_kwargs must be an object");
  for (const auto& [key, value] : kwargs.as_object()) {
    const std::string p = "chat_template_kwargs." + key;
    if (key == "enable_thinking" || key == "thinking" || key == "clear_thinking") {
      if (value.is_null()) continue;
      if (!value.is_bool()) return invalid_field(p, p + " must be true or false");
      if (key == "clear_thinking") {
        r.clear_thinking = value.as_bool();
      } else {
        r.enable_thinking = value.as_bool();
      }
    } else if (key == "reasoning_effort") {
      if (value.is_null()) continue;
      if (!value.is_string()) return invalid_field(p, p + " must be a string");
      if (auto err = check_effort(p, value.as_string())) return err;
      r.reasoning_effort = value.as_string();
    }
    // Other template variables mean nothing to GLM-5.3's template: ignored, as Jinja would.
  }
  return std::nullopt;
}

}  // namespace

std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body) {
  ChatRequest r;
  bool have_messages = false;
  std::string tool_choice = "auto";
  auto on_field = [&](const std::string& key, od::value& v) -> MaybeError {
    if (key == "messages") {
      have_messages = true;
      if (auto err = to_json(v, key, 1, r.messages)) return err;
      return validate_messages(r.messages);
    }
    if (key == "tools") {
      if (auto err = to_json(v, key, 1, r.tools)) return err;
      return validate_tools(r.tools);
    }
    if (key == "tool_choice") {
      JsonValue choice;
      if (auto err = to_json(v, key, 1, choice)) return err;
      if (choice.is_null()) return std::nullopt;
      if (choice.is_string() && (choice.as_string() == "auto" || choice.as_string() == "none")) {
        tool_choice = choice.as_string();
        return std::nullopt;
      }
      return invalid_field(key, "tool_choice: ferry supports \"auto\" and \"none\" (forcing a tool call needs "
                                "constrained decoding, which it does not implement)",
                           "unsupported_parameter");
    }
    if (key == "chat_template_kwargs") return read_template_kwargs(v, r);
    if (key == "reasoning_effort") {
      if (is_null(v)) return std::nullopt;
      std::string effort;
      if (auto err = read_string(v, key, effort)) return err;
      if (auto err = check_effort(key, effort)) return err;
      r.reasoning_effort = effort;
      return std::nullopt;
    }
    if (key == "response_format") {
      JsonValue format;
      if (auto err = to_json(v, key, 1, format)) return err;
      const JsonValue* type = format.find("type");
      if (format.is_null() || (type && type->is_string() && type->as_string() == "text")) return std::nullopt;
      return invalid_field(key, "response_format: only {\"type\": \"text\"} is supported", "unsupported_parameter");
    }
    if (key == "parallel_tool_calls") {
      bool ignored = true;
      return read_bool(v, key, ignored);
    }
    return ignore_field(key, v);
  };
  if (auto err = parse_object(body, r.options, on_field)) return *err;
  if (!have_messages) return invalid_field("messages", "messages is required");
  if (auto err = check_limits(r.options)) return *err;
  developer_is_system(r.messages);
  if (r.reasoning_effort == "none" || r.reasoning_effort == "minimal") {
    if (r.enable_thinking.value_or(false)) {
      return invalid_field("reasoning_effort", "reasoning_effort = '" + *r.reasoning_effort +
                                                   "' turns thinking off, but chat_template_kwargs.enable_thinking is true");
    }
    r.enable_thinking = false;
  }
  if (tool_choice == "none" || (r.tools.is_array() && r.tools.as_array().empty())) r.tools = JsonValue(nullptr);
  return r;
}

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body) {
  CompletionRequest r;
  bool have_prompt = false;
  auto on_field = [&](const std::string& key, od::value& v) -> MaybeError {
    if (key != "prompt") return ignore_field(key, v);
    have_prompt = true;
    JsonValue prompt;
    if (auto err = to_json(v, key, 1, prompt)) return err;
    if (prompt.is_string()) {
      r.prompt = prompt.as_string();
      return std::nullopt;
    }
    if (prompt.is_array() && prompt.as_array().size() == 1 && prompt.as_array()[0].is_string()) {
      r.prompt = prompt.as_array()[0].as_string();
      return std::nullopt;
    }
    if (prompt.is_array() && !prompt.as_array().empty()) {
      std::vector<int32_t> ids;
      for (size_t i = 0; i < prompt.as_array().size(); ++i) {
        const JsonValue& t = prompt.as_array()[i];
        if (t.is_array() || t.is_string()) {
          return invalid_field("prompt", "prompt: a batch of prompts is not supported (send one request per prompt)",
                               "unsupported_parameter");
        }
        if (!t.is_number() || !t.as_number().is_integer()) {
          return invalid_field(at("prompt", i), at("prompt", i) + " must be a token id (an integer)");
        }
        const double id = number_value(t);
        if (!(id >= 0 && id <= std::numeric_limits<int32_t>::max())) {
          return invalid_field(at("prompt", i), at("prompt", i) + " = " + excerpt(t.as_number().text) + ": not a token id");
        }
        ids.push_back(static_cast<int32_t>(id));
      }
      r.prompt = std::move(ids);
      return std::nullopt;
    }
    return invalid_field("prompt", "prompt must be a non-empty string or a non-empty array of token ids");
  };
  if (auto err = parse_object(body, r.options, on_field)) return *err;
  if (!have_prompt) return invalid_field("prompt", "prompt is required");
  if (auto err = check_limits(r.options)) return *err;
  return r;
}

}  // namespace ferry::http
