// GLM-5.3-Flash's chat_template.jinja, rendered natively. Each function below names the part of the
// template it reproduces; Jinja's semantics that matter for the bytes are spelled out where they
// occur (Python truthiness, str() of scalars, str.strip(), split()).
#include "model/text/chat_template.hpp"

#include <array>
#include <unordered_map>

#include "model/text/unicode.hpp"

namespace ferry::model {
namespace {

constexpr std::string_view kImage = "<|begin_of_image|><|image|><|end_of_image|>";
constexpr std::string_view kVideo = "<|begin_of_video|><|video|><|end_of_video|>";
constexpr std::string_view kAudio = "<|begin_of_audio|><|end_of_audio|>";
constexpr std::string_view kToolsHeader =
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
constexpr std::string_view kToolsFooter =
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";

// Python's str.isspace(), which str.strip() uses: more than Unicode White_Space (U+001C..U+001F).
bool python_space(uint32_t cp) {
  static constexpr std::array<uint32_t, 13> kOther{0x1C, 0x1D,   0x1E,   0x1F,   0x20,   0x85,  0xA0,
                                                   0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
  if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x2000 && cp <= 0x200A)) return true;
  for (uint32_t c : kOther) {
    if (c == cp) return true;
  }
  return false;
}

std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const unicode::Decoded d = unicode::decode_utf8(s, begin);
    if (!python_space(d.cp)) break;
    begin += d.len;
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the start of the last character.
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    const unicode::Decoded d = unicode::decode_utf8(s, start);
    if (d.len != end - start || !python_space(d.cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

bool is_string(const JsonValue* v) { return v && v->is_string(); }
bool truthy(const JsonValue* v) { return v && v->truthy(); }
const JsonValue* attr(const JsonValue* obj, std::string_view key) { return obj ? obj->find(key) : nullptr; }
// `x.0`: the first element of a list (nullptr when there is none or x is not a list).
const JsonValue* first(const JsonValue* v) {
  return v && v->is_array() && !v->as_array().empty() ? &v->as_array()[0] : nullptr;
}
bool equals(const JsonValue* v, std::string_view s) { return is_string(v) && v->as_string() == s; }

// What Jinja prints for a value: undefined prints nothing, None "None", booleans "True"/"False",
// numbers as Python's str. Lists and mappings would print as Python reprs, which ferry refuses.
Status append_str(std::string& out, const JsonValue* v, const std::string& where) {
  if (!v) return std::nullopt;
  if (v->is_string()) {
    out += v->as_string();
  } else if (v->is_null()) {
    out += "None";
  } else if (v->is_bool()) {
    out += v->as_bool() ? "True" : "False";
  } else if (v->is_number()) {
    std::string json;
    append_python_json(json, *v);
    out += json;
  } else {
    return Error(where + ": expected a string, got " + (v->is_array() ? "an array" : "an object"));
  }
  return std::nullopt;
}

class Renderer {
 public:
  Renderer(const JsonArray& messages, const JsonValue* tools, const ChatOptions& options)
      : messages_(messages), tools_(truthy(tools) ? tools : nullptr), options_(options) {}

  Expected<RenderedChat> render();

 private:
  Status visible_text(const JsonValue* content, std::string& out, const std::string& where) const;
  void tool_to_json(const JsonValue& tool, std::string& out) const;
  Status tool_references(const JsonValue& refs, const std::string& where);
  Status tool_response(const JsonValue& m, const std::string& where);
  Status assistant(size_t i, const JsonValue& m);
  Status tool_block(size_t start);
  std::string id_of(const JsonValue* obj) const;
  bool is_list_of_outputs(const JsonValue& m) const;

  const JsonArray& messages_;
  const JsonValue* tools_;  // nullptr when the template's `if tools` is false
  const ChatOptions& options_;
  std::string out_;
  int64_t last_user_index_ = -1;
};

// {%- if tools -%} `'function' in tool`: an OpenAI tool wraps its function; a bare one is itself.
const JsonValue& function_of(const JsonValue& tool) {
  const JsonValue* f = tool.find("function");
  return f ? *f : tool;
}

// macro visible_text(content)
Status Renderer::visible_text(const JsonValue* content, std::string& out, const std::string& where) const {
  if (!content || content->is_null()) return std::nullopt;
  if (content->is_string()) {
    out += content->as_string();
    return std::nullopt;
  }
  if (!content->is_array()) return append_str(out, content, where);
  for (size_t i = 0; i < content->as_array().size(); ++i) {
    const JsonValue& item = content->as_array()[i];
    const JsonValue* type = item.find("type");
    if (item.is_object() && equals(type, "text")) {
      if (auto e = append_str(out, item.find("text"), where + "[" + std::to_string(i) + "].text")) return e;
    } else if (item.is_string()) {
      out += item.as_string();
    } else if (item.is_object() && (equals(type, "image") || equals(type, "image_url"))) {
      out += kImage;
    } else if (item.is_object() && (equals(type, "video") || equals(type, "video_url"))) {
      out += kVideo;
    } else if (item.is_object() && (equals(type, "audio") || equals(type, "audio_url") || equals(type, "input_audio"))) {
      out += kAudio;
    }
  }
  return std::nullopt;
}

// macro tool_to_json(tool): keys are printed raw, values as tojson; defer_loading and strict left out.
void Renderer::tool_to_json(const JsonValue& tool, std::string& out) const {
  out += '{';
  bool first_key = true;
  if (tool.is_object()) {
    for (const auto& [k, v] : tool.as_object()) {
      if (k == "defer_loading" || k == "strict") continue;
      if (!first_key) out += ", ";
      first_key = false;
      out += '"';
      out += k;
      out += "\": ";
      append_python_json(out, v);
    }
  }
  out += '}';
}

// macro tool_references_to_response(refs)
Status Renderer::tool_references(const JsonValue& refs, const std::string& where) {
  if (!tools_) {
    // The macro is only defined inside {%- if tools -%}: the template fails here.
    return Error(where + ": a tool_reference result needs the request's tools");
  }
  out_ += "<tool_response><tools>\n";
  if (refs.is_array()) {
    for (const JsonValue& tr : refs.as_array()) {
      for (const JsonValue& t : tools_->as_array()) {
        const JsonValue& tool = function_of(t);
        const JsonValue* name = tool.find("name");
        const JsonValue* wanted = tr.find("name");
        // Jinja's `tool.name == tr.name` also holds when both are undefined.
        if (name ? (wanted && *name == *wanted) : !wanted) {
          tool_to_json(tool, out_);
          out_ += '\n';
        }
      }
    }
  }
  out_ += "</tools></tool_response>";
  return std::nullopt;
}

bool is_tool_reference_list(const JsonValue* v) {
  // `x is iterable and x is not string and x is not mapping and x and x.0.type == "tool_reference"`
  return v && v->is_array() && equals(attr(first(v), "type"), "tool_reference");
}

// macro is_list_of_outputs(m): `m.content and m.content.0.output is defined`
bool Renderer::is_list_of_outputs(const JsonValue& m) const {
  const JsonValue* first_item = first(m.find("content"));
  return first_item && first_item->find("output") != nullptr;
}

// macro render_tool_response(m)
Status Renderer::tool_response(const JsonValue& m, const std::string& where) {
  const JsonValue* content = m.find("content");
  if (is_string(content)) {
    out_ += "<tool_response>" + content->as_string() + "</tool_response>";
    return std::nullopt;
  }
  if (is_tool_reference_list(content)) return tool_references(*content, where + ".content");
  if (is_list_of_outputs(m)) {
    for (size_t i = 0; i < content->as_array().size(); ++i) {
      const JsonValue* output = attr(&content->as_array()[i], "output");
      const std::string at = where + ".content[" + std::to_string(i) + "].output";
      if (is_tool_reference_list(output)) {
        if (auto e = tool_references(*output, at)) return e;
      } else {
        std::string text;
        if (auto e = visible_text(output, text, at)) return e;
        out_ += "<tool_response>" + text + "</tool_response>";
      }
    }
    return std::nullopt;
  }
  std::string text;
  if (auto e = visible_text(content, text, where + ".content")) return e;
  out_ += "<tool_response>" + text + "</tool_response>";
  return std::nullopt;
}

// macro id_of(obj): tool_call_id, else id, as text ('' when neither is truthy).
std::string Renderer::id_of(const JsonValue* obj) const {
  std::string out;
  for (const char* key : {"tool_call_id", "id"}) {
    const JsonValue* v = attr(obj, key);
    if (truthy(v)) {
      if (append_str(out, v, "")) out.clear();  // a list or mapping id matches nothing
      return out;
    }
  }
  return out;
}

// The assistant branch of the message loop.
Status Renderer::assistant(size_t i, const JsonValue& m) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  out_ += "<|assistant|>";
  std::string content;
  if (auto e = visible_text(m.find("content"), content, where + ".content")) return e;
  std::optional<std::string> reasoning;
  if (const JsonValue* rc = m.find("reasoning_content"); is_string(rc)) {
    reasoning = rc->as_string();
  } else if (const size_t close = content.find("</think>"); close != std::string::npos) {
    // content.split('</think>')[0].split('<think>')[-1], then content.split('</think>')[-1]
    const std::string_view head = std::string_view(content).substr(0, close);
    const size_t open = head.rfind("<think>");
    reasoning = std::string(open == std::string_view::npos ? head : head.substr(open + 7));
    content = content.substr(content.rfind("</think>") + 8);
  }
  const bool keep = !options_.clear_thinking || static_cast<int64_t>(i) > last_user_index_;
  if (keep && reasoning) {
    out_ += "<think>" + *reasoning + "</think>";
  } else {
    out_ += "<think></think>";
  }
  out_ += python_strip(content);

  const JsonValue* calls = m.find("tool_calls");
  if (!truthy(calls)) return std::nullopt;
  if (!calls->is_array()) return Error(where + ".tool_calls: expected an array");
  for (size_t c = 0; c < calls->as_array().size(); ++c) {
    const std::string at = where + ".tool_calls[" + std::to_string(c) + "]";
    const JsonValue* tc = &calls->as_array()[c];
    if (const JsonValue* fn = attr(tc, "function"); truthy(fn)) tc = fn;
    out_ += "<tool_call>";
    if (auto e = append_str(out_, attr(tc, "name"), at + ".name")) return e;
    // OpenAI sends arguments as a JSON string; the template iterates a mapping (servers parse the
    // string first, as ferry does here).
    const JsonValue* args = attr(tc, "arguments");
    JsonValue parsed;
    if (is_string(args)) {
      auto p = parse_json(args->as_string());
      if (!p) return p.error().prefixed(at + ".arguments: ");
      parsed = std::move(*p);
      args = &parsed;
    }
    if (!args || !args->is_object()) return Error(at + ".arguments: expected a JSON object");
    for (const auto& [k, v] : args->as_object()) {
      out_ += "<arg_key>" + k + "</arg_key><arg_value>";
      if (v.is_string()) {
        out_ += v.as_string();
      } else {
        append_python_json(out_, v);
      }
      out_ += "</arg_value>";
    }
    out_ += "</tool_call>";
  }
  return std::nullopt;
}

// The tool branch, at the first message of a run of tool messages: <|observation|>, then the
// results in the order of the preceding assistant's tool_calls when every id matches exactly one
// call (the template's can_sort), else in the order received.
Status Renderer::tool_block(size_t start) {
  out_ += "<|observation|>";
  size_t end = start;
  while (end + 1 < messages_.size() && equals(messages_[end + 1].find("role"), "tool")) ++end;

  const JsonValue* calls = nullptr;
  if (start > 0 && equals(messages_[start - 1].find("role"), "assistant")) {
    if (const JsonValue* tc = messages_[start - 1].find("tool_calls"); truthy(tc) && tc->is_array()) calls = tc;
  }
  // Every result id: from each entry of a list-of-outputs message, else from the message.
  std::vector<std::string> result_ids;
  for (size_t k = start; k <= end; ++k) {
    if (is_list_of_outputs(messages_[k])) {
      for (const JsonValue& entry : messages_[k].find("content")->as_array()) result_ids.push_back(id_of(&entry));
    } else {
      result_ids.push_back(id_of(&messages_[k]));
    }
  }
  // Counted with maps: the template's nested loops are quadratic in the calls of one turn.
  bool can_sort = calls != nullptr;
  std::vector<std::string> call_ids;
  if (can_sort) {
    std::unordered_map<std::string_view, size_t> calls_seen;
    std::unordered_map<std::string_view, size_t> results_seen;
    for (const JsonValue& tc : calls->as_array()) call_ids.push_back(id_of(&tc));
    for (const std::string& id : call_ids) ++calls_seen[id];
    for (const std::string& id : result_ids) ++results_seen[id];
    for (const std::string& id : result_ids) {
      if (id.empty() || results_seen[id] > 1 || !calls_seen.count(id)) can_sort = false;
    }
    for (const std::string& id : call_ids) {
      if (id.empty() || calls_seen[id] > 1) can_sort = false;
    }
  }
  if (!can_sort) {
    for (size_t k = start; k <= end; ++k) {
      if (auto e = tool_response(messages_[k], "messages[" + std::to_string(k) + "]")) return e;
    }
    return std::nullopt;
  }
  // Sortable: every result id is unique and names a call, so each call has at most one result.
  struct Result {
    size_t message;
    std::optional<size_t> entry;  // set for an entry of a list-of-outputs message
  };
  std::unordered_map<std::string, Result> by_id;
  for (size_t k = start; k <= end; ++k) {
    if (!is_list_of_outputs(messages_[k])) {
      by_id.emplace(id_of(&messages_[k]), Result{k, std::nullopt});
      continue;
    }
    const JsonArray& entries = messages_[k].find("content")->as_array();
    for (size_t i = 0; i < entries.size(); ++i) by_id.emplace(id_of(&entries[i]), Result{k, i});
  }
  for (const std::string& call_id : call_ids) {
    const auto found = by_id.find(call_id);
    if (found == by_id.end()) continue;
    const Result& r = found->second;
    const std::string where = "messages[" + std::to_string(r.message) + "]";
    if (!r.entry) {
      if (auto e = tool_response(messages_[r.message], where)) return e;
      continue;
    }
    const JsonValue* output = messages_[r.message].find("content")->as_array()[*r.entry].find("output");
    const std::string at = where + ".content[" + std::to_string(*r.entry) + "].output";
    if (is_tool_reference_list(output)) {
      if (auto e = tool_references(*output, at)) return e;
    } else {
      std::string text;
      if (auto e = visible_text(output, text, at)) return e;
      out_ += "<tool_response>" + text + "</tool_response>";
    }
  }
  return std::nullopt;
}

Expected<RenderedChat> Renderer::render() {
  for (size_t i = 0; i < messages_.size(); ++i) {
    if (!messages_[i].is_object()) return Error("messages[" + std::to_string(i) + "]: expected an object");
    if (equals(messages_[i].find("role"), "user")) last_user_index_ = static_cast<int64_t>(i);
  }
  const bool thinking = options_.enable_thinking.value_or(true);
  out_ = "[gMASK]<sop>";
  if (thinking) {
    const std::string& effort = options_.reasoning_effort.value_or("");
    out_ += "<|system|>Reasoning Effort: ";
    out_ += effort == "low" ? "Low" : effort == "high" ? "High" : "Max";
  }
  if (tools_) {
    if (!tools_->is_array()) return Error("tools: expected an array");
    out_ += kToolsHeader;
    for (const JsonValue& t : tools_->as_array()) {
      const JsonValue& tool = function_of(t);
      if (truthy(tool.find("defer_loading"))) continue;
      tool_to_json(tool, out_);
      out_ += '\n';
    }
    out_ += kToolsFooter;
  }
  for (size_t i = 0; i < messages_.size(); ++i) {
    const JsonValue& m = messages_[i];
    const JsonValue* role = m.find("role");
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (equals(role, "user")) {
      out_ += "<|user|>";
      if (auto e = visible_text(m.find("content"), out_, where + ".content")) return *e;
    } else if (equals(role, "assistant")) {
      if (auto e = assistant(i, m)) return *e;
    } else if (equals(role, "tool")) {
      if (i == 0 || !equals(messages_[i - 1].find("role"), "tool")) {
        if (auto e = tool_block(i)) return *e;
      }
    } else if (equals(role, "system")) {
      out_ += "<|system|>";
      if (auto e = visible_text(m.find("content"), out_, where + ".content")) return *e;
    }
  }
  RenderedChat rendered;
  if (options_.add_generation_prompt) {
    out_ += thinking ? "<|assistant|><think>" : "<|assistant|><think></think>";
    rendered.generation_starts_in_reasoning = thinking;
  }
  rendered.prompt = std::move(out_);
  return rendered;
}

}  // namespace

Expected<RenderedChat> ChatTemplate::render(const JsonValue& messages, const JsonValue* tools,
                                            const ChatOptions& options) const {
  if (!messages.is_array()) return Error("messages: expected an array");
  return Renderer(messages.as_array(), tools, options).render();
}

Expected<RenderedChat> ChatTemplate::render(std::string_view messages_json, std::string_view tools_json,
                                            const ChatOptions& options) const {
  auto messages = parse_json(messages_json);
  if (!messages) return messages.error().prefixed("messages: ");
  JsonValue tools;
  if (!tools_json.empty()) {
    auto t = parse_json(tools_json);
    if (!t) return t.error().prefixed("tools: ");
    tools = std::move(*t);
  }
  return render(*messages, &tools, options);
}

}  // namespace ferry::model
