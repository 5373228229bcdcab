// `ferry plan`: the memory plan of a run, without running it (gpu/memory_plan.hpp): per device the
// dense weights, expert pool, slot state, workspace and margin; on the host the expert store, its
// shadow and the RAM floor. It takes the model arguments of `serve` and works on a machine without
// the GPUs when told their memory:
//   ferry plan --synthetic glm-5.3-flash.json --type q4_k --device-memory 32GiB,32GiB,32GiB,32GiB
//     --host-memory 128GiB --split 11,23,34 --expert-pool-cap 25.5GiB,26.5GiB,26.5GiB,25.4GiB
// With --mtp (auto or K, as serve) the last stage's device also holds the MTP block (its weights with
// every routed expert, its slots' state, the workspace's extra rows) and every stage a verify keep, and
// a step is wider by the verify sets: the expert pools get that much less.
// Exit 1 (with one line per problem) when the configuration cannot fit.
#include <cmath>
#include <cstdio>
#include <numeric>

#include "actors/spec_policy.hpp"
#include "config/byte_size.hpp"
#include "config/memory_options.hpp"
#include "gpu/backend_factory.hpp"
#include "gpu/device_info.hpp"
#include "gpu/stage_sizes.hpp"
#include "model/formats/gguf.hpp"
#include "model/glm5/glm5_gguf.hpp"
#include "tools/ferry/commands.hpp"
#include "tools/ferry/synthetic_source.hpp"

namespace ferry::cli {
namespace {

struct Options {
  std::string model, synthetic, type = "q4_k", recipe, split = "none", devices, device_memory, host_memory;
  std::string kv_type = "auto";
  std::string mtp = "off";
  uint32_t slots = 3, ctx = 524288, prefill_chunk = 4096;
  double checkpoint_budget_gib = 8;  // as serve's default
  std::optional<uint32_t> kv_resident;  // as serve's default: the plan chooses
  double kv_host_budget_gib = 0;     // 0: the host KV tier's need, counted against the RAM floor
  config::MemoryOptionsText memory;
  bool json = false;
};

int plan(const Options& o) {
  std::vector<std::string> errors;
  gpu::BackendOptions bo;
  bo.max_slots = o.slots;
  bo.max_context = o.ctx;
  bo.max_step_rows = o.prefill_chunk + o.slots;
  if (auto m = actors::parse_mtp_setting(o.mtp); !m) {
    errors.push_back(m.error().message);
  } else {
    bo.mtp = m->enabled;
    bo.verify_rows = o.slots * 2 * actors::kMaxDrafts;  // as serve
  }
  if (!(std::isfinite(o.checkpoint_budget_gib) && o.checkpoint_budget_gib >= 0 && o.checkpoint_budget_gib <= 65536)) {
    errors.push_back("--checkpoint-budget: GiB in [0, 65536], not " + std::to_string(o.checkpoint_budget_gib));
  } else {
    bo.checkpoint_bytes = static_cast<uint64_t>(o.checkpoint_budget_gib * 1073741824.0);
  }
  bo.kv_resident = o.kv_resident;
  if (!(std::isfinite(o.kv_host_budget_gib) && o.kv_host_budget_gib >= 0 && o.kv_host_budget_gib <= 65536)) {
    errors.push_back("--kv-host-budget: GiB in [0, 65536], not " + std::to_string(o.kv_host_budget_gib));
  } else if (o.kv_host_budget_gib > 0) {
    bo.kv_host_budget = static_cast<uint64_t>(o.kv_host_budget_gib * 1073741824.0);
  }
  if (auto e = config::parse_split(o.split, bo.split)) errors.push_back(e->message);
  if (auto e = gpu::parse_kv_type_option(o.kv_type, bo)) errors.push_back(e->message);
  if (!o.devices.empty()) {
    if (auto e = config::parse_devices(o.devices, bo.split)) errors.push_back(e->message);
  }
  for (auto& e : config::parse_memory_options(o.memory, bo.memory)) errors.push_back(std::move(e));
  // The devices' memory: as given, else what the visible ones have free now.
  std::vector<uint64_t> device_memory;
  if (!o.device_memory.empty()) {
    size_t at = 0;
    while (at <= o.device_memory.size()) {
      const size_t comma = std::min(o.device_memory.find(',', at), o.device_memory.size());
      auto v = config::parse_byte_size(o.device_memory.substr(at, comma - at));
      if (v) device_memory.push_back(v.value());
      else errors.push_back("--device-memory: " + v.error().message);
      at = comma + 1;
    }
  } else {
    for (const gpu::DeviceInfo& d : gpu::list_devices()) device_memory.push_back(d.free_bytes);
    if (device_memory.empty()) errors.push_back("no GPU is visible: give --device-memory (e.g. 32GiB,32GiB)");
  }
  if (bo.split.devices.empty() && device_memory.size() > 1) {
    bo.split.devices.resize(device_memory.size());
    std::iota(bo.split.devices.begin(), bo.split.devices.end(), 0);
  }
  uint64_t host = gpu::host_available_memory();
  if (!o.host_memory.empty()) {
    auto v = config::parse_byte_size(o.host_memory);
    if (v) host = v.value();
    else errors.push_back("--host-memory: " + v.error().message);
  }
  if (o.model.empty() == o.synthetic.empty()) errors.push_back("give exactly one of --model FILE and --synthetic CONFIG.json");

  model::Glm5Hparams hp;
  std::function<uint64_t(const model::Glm5TensorSpec&)> tensor_bytes;
  std::optional<model::GgufFile> file;
  if (errors.empty() && !o.synthetic.empty()) {
    auto source = read_synthetic_source(o.synthetic, o.type, o.recipe);
    if (!source) {
      errors.push_back(source.error().message);
    } else {
      hp = source->hparams;
      tensor_bytes = [t = source->type, rules = source->rules](const model::Glm5TensorSpec& s) -> uint64_t {
        return *model::ggml_bytes(gpu::synthetic_tensor_type(s, t, rules), s.n_elements());
      };
    }
  } else if (errors.empty()) {
    auto f = model::GgufFile::open(o.model);
    if (!f) errors.push_back(f.error().message);
    if (f) {
      file.emplace(std::move(f.value()));
      auto h = model::glm5_hparams_from_gguf(*file);
      if (!h) errors.push_back(o.model + ": " + h.error().message);
      else hp = h.value();
      tensor_bytes = [&file](const model::Glm5TensorSpec& s) -> uint64_t {
        const model::GgufTensorInfo* info = file->find_tensor(s.name);
        return info != nullptr ? info->data.size() : 0;
      };
    }
  }
  if (!errors.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "ferry plan: %s\n", e.c_str());
    return 2;
  }
  const gpu::MemoryPlan p = gpu::plan_for(hp, tensor_bytes, bo, device_memory, host, errors);
  if (!errors.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "ferry plan: %s\n", e.c_str());
    return 2;
  }
  std::printf("%s\n", o.json ? gpu::plan_json(p).c_str() : gpu::format_plan(p).c_str());
  return p.problems.empty() ? 0 : 1;
}

}  // namespace

CommandRun add_plan_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("plan", "Show the memory plan of a run (devices and host) without running it");
  sub->add_option("--model,-m", o->model, "GGUF model file")->check(CLI::ExistingFile);
  sub->add_option("--synthetic", o->synthetic, "config.json of a glm5_next shape")->check(CLI::ExistingFile);
  sub->add_option("--type", o->type, "with --synthetic: ggml type of the large matrices")->capture_default_str();
  sub->add_option("--recipe", o->recipe, "with --synthetic: REGEX=TYPE rules per tensor, as ferry convert --recipe")
      ->check(CLI::ExistingFile);
  sub->add_option("--device-memory", o->device_memory,
                  "memory of devices 0, 1, ... (e.g. 32GiB,32GiB,32GiB,32GiB; default: what the visible GPUs have free)");
  sub->add_option("--host-memory", o->host_memory, "RAM available (default: this machine's MemAvailable)");
  sub->add_option("--checkpoint-budget", o->checkpoint_budget_gib, "GiB of host RAM for prefix-cache checkpoints (as serve; default 8)");
  sub->add_option("--devices", o->devices, "CUDA devices of the stages (default: every device given)");
  sub->add_option("--split", o->split, "pipeline stages: first layer of each stage after the first, auto or none")
      ->capture_default_str();
  sub->add_option("--slots", o->slots, "concurrent requests")->capture_default_str();
  sub->add_option("--ctx", o->ctx, "tokens per slot")->capture_default_str();
  sub->add_option("--kv-type", o->kv_type, "DSA latent rows on the device: f32, f16, int8 or auto (int8)")
      ->capture_default_str();
  sub->add_option("--kv-resident", o->kv_resident,
                  "DSA latent rows per layer and slot on the device; the rest in a pinned host tier (0: all on the "
                  "device; default: all when every slot's rows fit beside the rest of the plan, else 32768)");
  sub->add_option("--kv-host-budget", o->kv_host_budget_gib,
                  "GiB of host RAM the host KV tier may take (0: what it needs, counted against --ram-floor)")
      ->capture_default_str();
  sub->add_option("--prefill-chunk", o->prefill_chunk, "prompt tokens per step")->capture_default_str();
  sub->add_option("--mtp", o->mtp,
                  "auto, off or K drafts (as serve): count the MTP block on the last stage's device (weights with "
                  "every routed expert, slot state, verify keep, workspace rows); no effect on a model without one")
      ->capture_default_str();
  config::for_each_memory_option(o->memory, [&](const std::string& name, std::string& value, const std::string& help) {
    sub->add_option("--" + name, value, help)->capture_default_str();
  });
  sub->add_flag("--json", o->json, "print the plan as JSON");
  return [o] { return plan(*o); };
}

}  // namespace ferry::cli
