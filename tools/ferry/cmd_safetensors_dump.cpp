// `ferry safetensors-dump PATH [--json] [--hash]`: the tensors of a Hugging Face checkpoint (one
// .safetensors file, an index, or a directory) as ferry's reader sees them — what `ferry convert`
// will read. Also the handle the Python tests compare against the PyPI safetensors package.
#include <xxhash.h>

#include <boost/json.hpp>
#include <cstdio>
#include <string>

#include "model/formats/safetensors.hpp"
#include "tools/ferry/commands.hpp"

namespace ferry::cli {
namespace {

namespace json = boost::json;

struct Options {
  std::string path;
  bool json = false;
  bool hash = false;
};

std::string xxh64_hex(std::span<const uint8_t> data) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH64(data.data(), data.size(), 0)));
  return buf;
}

int run(const Options& o) {
  auto opened = model::Safetensors::open(o.path);
  if (!opened) {
    std::fprintf(stderr, "ferry safetensors-dump: %s\n", opened.error().message.c_str());
    return 1;
  }
  const model::Safetensors& s = *opened;
  if (o.json) {
    json::array shards;
    for (const auto& p : s.shards()) shards.push_back(json::string(p.string()));
    json::object metadata;
    for (const auto& [k, v] : s.metadata()) metadata[k] = v;
    json::array tensors;
    for (const model::SafetensorsTensor& t : s.tensors()) {
      json::array shape;
      for (uint64_t d : t.shape) shape.push_back(d);
      json::object obj{{"name", t.name},
                       {"dtype", std::string(model::safetensors_dtype_name(t.dtype))},
                       {"shape", std::move(shape)},
                       {"shard", t.shard},
                       {"file_offset", t.file_offset},
                       {"n_elements", t.n_elements},
                       {"n_bytes", t.n_bytes}};
      if (o.hash) obj["xxh64"] = xxh64_hex(t.data);
      tensors.push_back(std::move(obj));
    }
    const json::object doc{{"shards", std::move(shards)}, {"metadata", std::move(metadata)}, {"tensors", std::move(tensors)}};
    std::printf("%s\n", json::serialize(doc).c_str());
    return 0;
  }
  uint64_t total = 0;
  for (const model::SafetensorsTensor& t : s.tensors()) total += t.n_bytes;
  std::printf("%s: %zu shards, %zu tensors, %llu bytes of tensor data\n", o.path.c_str(), s.shards().size(),
              s.tensors().size(), static_cast<unsigned long long>(total));
  for (const auto& [k, v] : s.metadata()) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
  for (const model::SafetensorsTensor& t : s.tensors()) {
    std::string shape = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
    shape += "]";
    const std::string hash = o.hash ? "  xxh64 " + xxh64_hex(t.data) : "";
    std::printf("  %s  %s  %s  shard %u  %llu bytes%s\n", t.name.c_str(),
                std::string(model::safetensors_dtype_name(t.dtype)).c_str(), shape.c_str(), t.shard,
                static_cast<unsigned long long>(t.n_bytes), hash.c_str());
  }
  return 0;
}

}  // namespace

CommandRun add_safetensors_dump_command(CLI::App& app) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "safetensors-dump",
      "Print the tensors (dtype, shape, shard, size) of a safetensors file, index or checkpoint directory");
  cmd->add_option("path", options->path,
                  "A .safetensors file, a model.safetensors.index.json, or a directory holding either")
      ->required();
  cmd->add_flag("--json", options->json, "Print one JSON document");
  cmd->add_flag("--hash", options->hash, "Add the xxh64 (seed 0) of each tensor's bytes (reads all tensor data)");
  return [options] { return run(*options); };
}

}  // namespace ferry::cli
