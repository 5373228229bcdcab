// `ferry gguf-dump FILE [--json] [--hash]`: every metadata key with its type and value and every
// tensor's placement, exactly as ferry's reader sees them. For users debugging a file (a converter's
// output, a download that will not load) and the handle the Python tests compare against the PyPI
// gguf package. `ferry inspect` is the model-level summary; this is the raw file.
#include <xxhash.h>

#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

#include "model/formats/gguf.hpp"
#include "tools/ferry/commands.hpp"

namespace ferry::cli {
namespace {

namespace json = boost::json;
using model::GgufArray;
using model::GgufValue;

constexpr char kHex[] = "0123456789abcdef";

std::string hex(std::string_view bytes) {
  std::string out;
  for (char c : bytes) {
    out += kHex[static_cast<unsigned char>(c) >> 4];
    out += kHex[static_cast<unsigned char>(c) & 15];
  }
  return out;
}

// JSON has no NaN or infinities: those are written as the strings "nan", "inf", "-inf".
json::value float_json(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

// A string that is not valid UTF-8 cannot be a JSON string: it becomes {"hex": "..."}.
json::value string_json(const std::string& s) {
  if (model::is_valid_utf8(s)) return json::string(s);
  return json::object{{"hex", hex(s)}};
}

json::value array_json(const GgufArray& a);

template <class T>
json::value item_json(const T& x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x;
  } else if constexpr (std::is_floating_point_v<T>) {
    return float_json(x);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return string_json(x);
  } else if constexpr (std::is_same_v<T, GgufArray>) {
    return array_json(x);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<int64_t>(x);
  } else {
    return static_cast<uint64_t>(x);
  }
}

json::value array_json(const GgufArray& a) {
  json::array items;
  std::visit(
      [&](const auto& v) {
        items.reserve(v.size());
        for (size_t i = 0; i < v.size(); ++i) {
          using T = typename std::decay_t<decltype(v)>::value_type;
          items.push_back(item_json<T>(v[i]));
        }
      },
      a.items);
  return json::object{{"element_type", model::gguf_value_type_name(a.element_type())}, {"items", std::move(items)}};
}

json::value value_json(const GgufValue& v) {
  return std::visit([](const auto& x) { return item_json<std::decay_t<decltype(x)>>(x); }, v);
}

// Text form: arrays show their first `max_items` elements (0: all).
std::string value_text(const GgufValue& v, size_t max_items);

std::string array_text(const GgufArray& a, size_t max_items) {
  std::string out = "[";
  const size_t n = a.size();
  const size_t shown = max_items == 0 ? n : std::min(n, max_items);
  std::visit(
      [&](const auto& items) {
        using T = typename std::decay_t<decltype(items)>::value_type;
        for (size_t i = 0; i < shown; ++i) {
          if (i > 0) out += ", ";
          out += value_text(GgufValue(std::in_place_type<T>, items[i]), max_items);
        }
      },
      a.items);
  if (shown < n) out += ", ... (" + std::to_string(n - shown) + " more)";
  return out + "]";
}

// Shortest text that reads back to the same f32 / f64.
template <class T>
std::string float_text(T x) {
  if (!std::isfinite(x)) return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string value_text(const GgufValue& v, size_t max_items) {
  if (const auto* a = std::get_if<GgufArray>(&v)) return array_text(*a, max_items);
  if (const auto* x = std::get_if<float>(&v)) return float_text(*x);
  if (const auto* x = std::get_if<double>(&v)) return float_text(*x);
  return json::serialize(value_json(v));
}

std::string type_text(const GgufValue& v) {
  std::string t = model::gguf_value_type_name(model::gguf_value_type(v));
  if (const auto* a = std::get_if<GgufArray>(&v)) {
    t += "<" + model::gguf_value_type_name(a->element_type()) + ">[" + std::to_string(a->size()) + "]";
  }
  return t;
}

std::string dims_text(const std::vector<uint64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

std::string xxh64_hex(std::span<const uint8_t> data) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH64(data.data(), data.size(), 0)));
  return buf;
}

struct Options {
  std::string file;
  bool json = false;
  bool hash = false;
  size_t max_items = 16;
};

int run(const Options& o) {
  auto opened = model::GgufFile::open(o.file);
  if (!opened) {
    std::fprintf(stderr, "ferry gguf-dump: %s\n", opened.error().message.c_str());
    return 1;
  }
  const model::GgufFile& f = *opened;
  if (o.json) {
    json::array metadata;
    for (const model::GgufKv& kv : f.metadata()) {
      metadata.push_back(json::object{{"key", string_json(kv.key)},
                                      {"type", model::gguf_value_type_name(model::gguf_value_type(kv.value))},
                                      {"value", value_json(kv.value)}});
    }
    json::array tensors;
    for (const model::GgufTensorInfo& t : f.tensors()) {
      json::array dims;
      for (uint64_t d : t.dims) dims.push_back(d);
      json::object obj{{"name", string_json(t.name)},
                       {"dims", std::move(dims)},
                       {"type", std::string(model::ggml_type_traits(t.type).name)},
                       {"type_id", static_cast<uint32_t>(t.type)},
                       {"offset", t.offset},
                       {"file_offset", t.file_offset},
                       {"n_elements", t.n_elements},
                       {"n_bytes", t.n_bytes}};
      if (o.hash) obj["xxh64"] = xxh64_hex(t.data);
      tensors.push_back(std::move(obj));
    }
    const json::object doc{{"file", o.file},
                           {"version", f.version()},
                           {"alignment", f.alignment()},
                           {"data_offset", f.data_offset()},
                           {"file_size", f.file_size()},
                           {"metadata", std::move(metadata)},
                           {"tensors", std::move(tensors)}};
    std::printf("%s\n", json::serialize(doc).c_str());
    return 0;
  }
  std::printf("%s: GGUF v%u, %zu metadata, %zu tensors, alignment %u, data at byte %llu, %llu bytes\n",
              o.file.c_str(), f.version(), f.metadata().size(), f.tensors().size(), f.alignment(),
              static_cast<unsigned long long>(f.data_offset()), static_cast<unsigned long long>(f.file_size()));
  std::printf("metadata:\n");
  for (const model::GgufKv& kv : f.metadata()) {
    std::printf("  %s  %s  %s\n", kv.key.c_str(), type_text(kv.value).c_str(), value_text(kv.value, o.max_items).c_str());
  }
  std::printf("tensors:\n");
  for (const model::GgufTensorInfo& t : f.tensors()) {
    const std::string hash = o.hash ? "  xxh64 " + xxh64_hex(t.data) : "";
    std::printf("  %s  %s  %s  offset %llu  %llu bytes%s\n", t.name.c_str(),
                std::string(model::ggml_type_traits(t.type).name).c_str(), dims_text(t.dims).c_str(),
                static_cast<unsigned long long>(t.offset), static_cast<unsigned long long>(t.n_bytes), hash.c_str());
  }
  return 0;
}

}  // namespace

CommandRun add_gguf_dump_command(CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "gguf-dump", "Print every metadata key (type, value) and every tensor (dims, type, offset, size) of a GGUF file");
  cmd->add_option("file", options->file, "The GGUF file")->required();
  cmd->add_flag("--json", options->json, "Print one JSON document (arrays in full; non-UTF-8 strings as {\"hex\": ...})");
  cmd->add_flag("--hash", options->hash, "Add the xxh64 (seed 0) of each tensor's bytes (reads all tensor data)");
  cmd->add_option("--max-items", options->max_items, "Array elements shown in the text form (0: all)")
      ->capture_default_str();
  return [options] { return run(*options); };
}

}  // namespace ferry::cli
