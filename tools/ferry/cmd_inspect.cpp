// `ferry inspect FILE.gguf [--json]`: what a GGUF file of glm5_next holds and what it costs in memory.
// Exit status 0 when the file is a complete glm5next model, 1 when it cannot be read or has problems
// (which are listed; everything that could be read is still shown).
#include <boost/json.hpp>

#include <cstdio>
#include <string>

#include "model/glm5/glm5_inspect.hpp"
#include "tools/ferry/commands.hpp"

namespace ferry::cli {
namespace {

using model::Glm5FileReport;

std::string gib(uint64_t bytes) {
  char buf[64];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / double(uint64_t{1} << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / double(uint64_t{1} << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  }
  return buf;
}

const char* kind_name(const model::Glm5BlockPlan& b) {
  if (b.attention == model::LayerKind::kda) return "KDA";
  return b.indexer ? "DSA" : "DSA (shared indexer)";
}

void print_text(const std::string& path, const Glm5FileReport& r) {
  std::printf("file          %s: %s (%llu bytes), GGUF v%u, alignment %u, %llu metadata keys\n", path.c_str(),
              gib(r.file_size).c_str(), static_cast<unsigned long long>(r.file_size), r.version, r.alignment,
              static_cast<unsigned long long>(r.metadata_keys));
  std::printf("architecture  %s", r.architecture.empty() ? "(none)" : r.architecture.c_str());
  if (!r.name.empty()) std::printf(", name \"%s\"", r.name.c_str());
  if (r.file_type) std::printf(", file_type %u", *r.file_type);
  if (r.quantization_version) std::printf(", quantization_version %u", *r.quantization_version);
  std::printf("\ntensors       %llu, %s\n", static_cast<unsigned long long>(r.tensor_count), gib(r.tensor_bytes).c_str());
  for (const auto& t : r.by_type) {
    std::printf("  %-8s %6llu tensors  %12s\n", t.type.c_str(), static_cast<unsigned long long>(t.tensors),
                gib(t.bytes).c_str());
  }
  if (r.hparams) {
    const model::Glm5Hparams& hp = *r.hparams;
    uint32_t kda = 0, dsa = 0, dense = 0, moe = 0;
    for (auto k : hp.layer_kinds) (k == model::LayerKind::kda ? kda : dsa) += 1;
    for (auto k : hp.ffn_kinds) (k == model::FfnKind::dense ? dense : moe) += 1;
    std::printf("hyper-parameters\n");
    std::printf("  vocab %u, hidden %u, %u blocks + %u MTP, rms eps %g, context %u\n", hp.vocab_size, hp.hidden_size,
                hp.n_layers, hp.n_nextn_layers, hp.rms_eps, hp.context_length);
    std::printf("  KDA blocks %u: %u heads x %u, conv kernel %u, gate lower bound %g\n", kda, hp.kda_heads,
                hp.kda_head_dim, hp.conv_kernel, hp.kda_lower_bound);
    std::printf("  DSA blocks %u%s: MLA %u heads, q_lora %u, kv_lora %u, k %u, v %u; indexer %u x %u, top-k %u, "
                "kpool %u, tail %s\n",
                dsa, hp.n_nextn_layers ? " + MTP" : "", hp.n_heads, hp.q_lora_rank, hp.kv_lora_rank, hp.qk_nope_head_dim, hp.v_head_dim,
                hp.index_n_heads, hp.index_head_dim, hp.index_topk, hp.index_kpool, hp.index_select_tail ? "on" : "off");
    std::printf("  FFN: %u dense (%u), %u MoE: %u experts x %u, %u used, %u shared, %u groups (keep %u), scale %g, "
                "norm %s, SwiGLU limit %g\n",
                dense, hp.dense_ffn, moe, hp.n_experts, hp.moe_ffn, hp.n_experts_used, hp.n_shared_experts, hp.n_group,
                hp.topk_group, hp.routed_scaling, hp.norm_topk_prob ? "on" : "off", hp.swiglu_limit);
    std::printf("  mHC: %u streams, %u Sinkhorn iterations, eps %g\n", hp.hc_mult, hp.hc_sinkhorn_iters, hp.hc_eps);
    std::printf("plan\n  %-5s %-22s %-6s %12s %12s %12s  %s\n", "block", "attention", "ffn", "bytes", "experts",
                "per expert", "expert types");
    for (const auto& b : r.blocks) {
      std::string kind = std::string(b.nextn ? "MTP " : "") + kind_name(b);
      std::printf("  %-5u %-22s %-6s %12s %12s %12s  %s\n", b.index, kind.c_str(),
                  b.ffn == model::FfnKind::moe ? "MoE" : "dense", gib(b.bytes).c_str(),
                  b.expert_bytes ? gib(b.expert_bytes).c_str() : "-",
                  b.bytes_per_expert ? gib(b.bytes_per_expert).c_str() : "-", b.expert_types.c_str());
    }
    std::printf("type mix\n  %-26s %7s %12s  %s\n", "group", "tensors", "bytes", "types (tensors, bytes)");
    for (const auto& g : r.type_mix) {
      std::string types;
      for (const auto& t : g.types) {
        types += (types.empty() ? "" : ", ") + t.type + " " + std::to_string(t.tensors) + " (" + gib(t.bytes) + ")";
      }
      std::printf("  %-26s %7llu %12s  %s\n", g.group.c_str(), static_cast<unsigned long long>(g.tensors),
                  gib(g.bytes).c_str(), types.c_str());
    }
    std::printf("memory\n");
    std::printf("  routed experts  %s\n", gib(r.expert_bytes).c_str());
    std::printf("  dense           %s (of which embedding, output norm and head %s)\n", gib(r.dense_bytes).c_str(),
                gib(r.global_bytes).c_str());
    std::printf("  KV cache        %llu values per token (DSA latent + indexer key and gate scores)\n",
                static_cast<unsigned long long>(r.kv_values_per_token));
    std::printf("  KDA state       %s per slot (f32)\n", gib(r.kda_state_bytes_per_slot).c_str());
  }
  if (r.hparams) {
    if (r.extensions.empty()) {
      std::printf("compatibility the glm5next layout of the published files: llama.cpp-family loaders can read it\n");
    } else {
      std::printf("compatibility ferry's extensions of the glm5next layout, which llama.cpp-family loaders (PR #27754 "
                  "glm5next, PR #27773 glm5-next, ik_llama.cpp) will refuse:\n");
      for (const auto& e : r.extensions) std::printf("  %s\n", e.c_str());
    }
  }
  if (r.tokenizer) {
    const auto& t = *r.tokenizer;
    std::printf("tokenizer     %s/%s, %llu tokens, %llu merges", t.model.c_str(), t.pre.c_str(),
                static_cast<unsigned long long>(t.tokens), static_cast<unsigned long long>(t.merges));
    if (t.bos) std::printf(", bos %u", *t.bos);
    if (t.eos) std::printf(", eos %u", *t.eos);
    if (t.eot) std::printf(", eot %u", *t.eot);
    if (t.pad) std::printf(", pad %u", *t.pad);
    std::printf(", chat template %llu bytes\n", static_cast<unsigned long long>(t.chat_template_bytes));
  } else {
    std::printf("tokenizer     (none)\n");
  }
  if (r.problems.empty()) {
    std::printf("problems      none\n");
  } else {
    std::printf("problems      %zu\n", r.problems.size());
    for (const auto& p : r.problems) std::printf("  %s\n", p.c_str());
  }
}

boost::json::object to_json(const std::string& path, const Glm5FileReport& r) {
  namespace json = boost::json;
  json::object o;
  o["file"] = path;
  o["file_size"] = r.file_size;
  o["gguf_version"] = r.version;
  o["alignment"] = r.alignment;
  o["metadata_keys"] = r.metadata_keys;
  o["architecture"] = r.architecture;
  o["name"] = r.name;
  o["file_type"] = r.file_type ? json::value(*r.file_type) : json::value(nullptr);
  o["quantization_version"] = r.quantization_version ? json::value(*r.quantization_version) : json::value(nullptr);
  o["tensor_count"] = r.tensor_count;
  o["tensor_bytes"] = r.tensor_bytes;
  json::array types;
  for (const auto& t : r.by_type) types.push_back(json::object{{"type", t.type}, {"tensors", t.tensors}, {"bytes", t.bytes}});
  o["bytes_by_type"] = std::move(types);
  json::array mix;
  for (const auto& g : r.type_mix) {
    json::array gt;
    for (const auto& t : g.types) gt.push_back(json::object{{"type", t.type}, {"tensors", t.tensors}, {"bytes", t.bytes}});
    mix.push_back(json::object{{"group", g.group}, {"tensors", g.tensors}, {"bytes", g.bytes}, {"types", std::move(gt)}});
  }
  o["type_mix"] = std::move(mix);
  if (r.hparams) {
    const model::Glm5Hparams& hp = *r.hparams;
    o["hparams"] = json::object{
        {"vocab_size", hp.vocab_size}, {"hidden_size", hp.hidden_size}, {"n_layers", hp.n_layers},
        {"n_nextn_layers", hp.n_nextn_layers}, {"context_length", hp.context_length}, {"rms_eps", hp.rms_eps},
        {"dense_ffn", hp.dense_ffn}, {"moe_ffn", hp.moe_ffn}, {"n_experts", hp.n_experts},
        {"n_experts_used", hp.n_experts_used}, {"n_shared_experts", hp.n_shared_experts}, {"n_group", hp.n_group},
        {"topk_group", hp.topk_group}, {"routed_scaling", hp.routed_scaling}, {"norm_topk_prob", hp.norm_topk_prob},
        {"swiglu_limit", hp.swiglu_limit}, {"n_heads", hp.n_heads}, {"q_lora_rank", hp.q_lora_rank},
        {"kv_lora_rank", hp.kv_lora_rank}, {"qk_nope_head_dim", hp.qk_nope_head_dim}, {"v_head_dim", hp.v_head_dim},
        {"index_n_heads", hp.index_n_heads}, {"index_head_dim", hp.index_head_dim}, {"index_topk", hp.index_topk},
        {"index_kpool", hp.index_kpool}, {"index_select_tail", hp.index_select_tail},
        {"index_norm_eps", hp.index_norm_eps}, {"kda_heads", hp.kda_heads}, {"kda_head_dim", hp.kda_head_dim},
        {"conv_kernel", hp.conv_kernel}, {"kda_lower_bound", hp.kda_lower_bound}, {"hc_mult", hp.hc_mult},
        {"hc_sinkhorn_iters", hp.hc_sinkhorn_iters}, {"hc_eps", hp.hc_eps}};
    json::array blocks;
    for (const auto& b : r.blocks) {
      blocks.push_back(json::object{{"index", b.index},
                                    {"nextn", b.nextn},
                                    {"attention", b.attention == model::LayerKind::kda ? "kda" : "dsa"},
                                    {"indexer", b.indexer},
                                    {"ffn", b.ffn == model::FfnKind::moe ? "moe" : "dense"},
                                    {"bytes", b.bytes},
                                    {"expert_bytes", b.expert_bytes},
                                    {"bytes_per_expert", b.bytes_per_expert},
                                    {"expert_types", b.expert_types}});
    }
    o["blocks"] = std::move(blocks);
    o["global_bytes"] = r.global_bytes;
    o["expert_bytes"] = r.expert_bytes;
    o["dense_bytes"] = r.dense_bytes;
    o["kv_values_per_token"] = r.kv_values_per_token;
    json::array extensions;
    for (const auto& e : r.extensions) extensions.push_back(json::string(e));
    o["llama_cpp_compatible"] = r.extensions.empty();
    o["extensions"] = std::move(extensions);
    o["kda_state_bytes_per_slot"] = r.kda_state_bytes_per_slot;
  } else {
    o["hparams"] = nullptr;
  }
  if (r.tokenizer) {
    const auto& t = *r.tokenizer;
    auto id = [](const std::optional<uint32_t>& v) { return v ? json::value(*v) : json::value(nullptr); };
    o["tokenizer"] = json::object{{"model", t.model},   {"pre", t.pre},     {"tokens", t.tokens},
                                  {"merges", t.merges}, {"bos", id(t.bos)}, {"eos", id(t.eos)},
                                  {"eot", id(t.eot)},   {"pad", id(t.pad)}, {"chat_template_bytes", t.chat_template_bytes}};
  } else {
    o["tokenizer"] = nullptr;
  }
  json::array problems;
  for (const auto& p : r.problems) problems.push_back(json::string(p));
  o["problems"] = std::move(problems);
  return o;
}

}  // namespace

CommandRun add_inspect_command(CLI::App& app) {
  struct Options {
    std::string file;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "inspect",
      "Describe a GGUF file of GLM-5.3-Flash: architecture, hyper-parameters, tensor bytes by type, the per-block "
      "plan (KDA/DSA, dense/MoE) with routed-expert bytes, the type mix per tensor group, dense bytes, per-slot "
      "state, whether llama.cpp-family loaders can read it (ferry's extensions, which they refuse), tokenizer. Exit "
      "status 1 when the file is unreadable or incomplete (the problems are listed)");
  sub->add_option("file", opt->file, "GGUF file")->required();
  sub->add_flag("--json", opt->json, "Print one JSON object instead of text");
  return [opt]() -> int {
    auto file = model::GgufFile::open(opt->file);
    if (!file) {
      std::fprintf(stderr, "ferry inspect: %s\n", file.error().message.c_str());
      return 1;
    }
    const Glm5FileReport report = model::inspect_glm5_gguf(*file);
    if (opt->json) {
      std::printf("%s\n", boost::json::serialize(to_json(opt->file, report)).c_str());
    } else {
      print_text(opt->file, report);
    }
    return report.problems.empty() ? 0 : 1;
  };
}

}  // namespace ferry::cli
