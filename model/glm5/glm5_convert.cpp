#include "model/glm5/glm5_convert.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "model/formats/gguf_writer.hpp"
#include "model/formats/quant.hpp"
#include "model/glm5/glm5_gguf.hpp"
#include "model/glm5/hf_checkpoint.hpp"
#include "model/text/tokenizer_gguf.hpp"

namespace ferry::model {
namespace {

// f32 values a tensor is made of per write: large enough for quantization threads to share, small
// enough that conversion stays in constant memory (16 MiB in, at most as much out).
constexpr uint64_t kChunkFloats = uint64_t{4} << 20;

std::string shape_text(const std::vector<uint64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

std::vector<uint64_t> squeezed(const std::vector<uint64_t>& s) {
  std::vector<uint64_t> out;
  for (uint64_t v : s) {
    if (v != 1) out.push_back(v);
  }
  return out;
}

std::string type_name(GgmlType t) { return std::string(ggml_type_traits(t).name); }

// What config.json says beyond the hyper-parameters.
struct ConfigExtras {
  bool tied = false;
  bool fp8 = false;
  uint32_t block_rows = 128, block_cols = 128;
};

Expected<ConfigExtras> read_extras(const std::filesystem::path& path) {
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (parser.load(path.string()).get(root) != simdjson::SUCCESS) return Error(path.string() + ": not a JSON object");
  ConfigExtras ex;
  simdjson::dom::object text = root;
  if (root["text_config"].get_object().get(text) != simdjson::SUCCESS) text = root;
  bool tied = false;
  if (root["tie_word_embeddings"].get_bool().get(tied) == simdjson::SUCCESS) ex.tied = tied;
  if (text["tie_word_embeddings"].get_bool().get(tied) == simdjson::SUCCESS) ex.tied = ex.tied || tied;
  simdjson::dom::object q;
  if (root["quantization_config"].get_object().get(q) != simdjson::SUCCESS &&
      text["quantization_config"].get_object().get(q) != simdjson::SUCCESS) {
    return ex;
  }
  std::string_view method;
  if (q["quant_method"].get_string().get(method) != simdjson::SUCCESS || method != "fp8") {
    return Error(ErrorCode::unsupported,
                 path.string() + ": quantization_config.quant_method is '" + std::string(method) +
                     "', expected 'fp8' (block-scaled e4m3 weights) or no quantization_config");
  }
  std::string_view fmt;
  if (q["fmt"].get_string().get(fmt) == simdjson::SUCCESS && fmt != "e4m3") {
    return Error(ErrorCode::unsupported,
                 path.string() + ": quantization_config.fmt is '" + std::string(fmt) + "', expected 'e4m3'");
  }
  ex.fp8 = true;
  simdjson::dom::array block;
  if (q["weight_block_size"].get_array().get(block) == simdjson::SUCCESS) {
    uint64_t b0 = 0, b1 = 0;
    if (block.size() != 2 || block.at(0).get_uint64().get(b0) != simdjson::SUCCESS ||
        block.at(1).get_uint64().get(b1) != simdjson::SUCCESS || b0 == 0 || b1 == 0 || b0 > 65536 || b1 > 65536) {
      return Error(path.string() + ": quantization_config.weight_block_size is not two positive integers");
    }
    ex.block_rows = static_cast<uint32_t>(b0);
    ex.block_cols = static_cast<uint32_t>(b1);
  }
  return ex;
}

// The FP8 scale of an e4m3 weight, checked against the weight's shape.
Status fp8_scale(const HfCheckpoint& ck, const SafetensorsTensor& t, uint32_t b0, uint32_t b1, HfFp8Scale* out) {
  const SafetensorsTensor* s = ck.find(t.name + "_scale_inv");
  if (s == nullptr) return Error("FP8 tensor " + t.name + " has no " + t.name + "_scale_inv");
  if (t.shape.size() != 2) {
    return Error("FP8 tensor " + t.name + " has shape " + shape_text(t.shape) + ", expected a matrix");
  }
  if (s->dtype == SafetensorsDtype::F8_E4M3 || !hf_readable(s->dtype)) {
    return Error(ErrorCode::unsupported,
                 "scale " + s->name + " has dtype " + std::string(safetensors_dtype_name(s->dtype)) +
                     ", expected F32, BF16 or F16");
  }
  const std::vector<uint64_t> want = {(t.shape[0] + b0 - 1) / b0, (t.shape[1] + b1 - 1) / b1};
  if (s->shape != want) {
    return Error("scale " + s->name + " has shape " + shape_text(s->shape) + ", expected " + shape_text(want) +
                 " for " + shape_text(t.shape) + " in " + std::to_string(b0) + "x" + std::to_string(b1) + " blocks");
  }
  if (out != nullptr) *out = HfFp8Scale{s, t.shape[0], t.shape[1], b0, b1};
  return std::nullopt;
}

// Checks one recipe source against the checkpoint; nothing when usable.
Status check_source(const HfCheckpoint& ck, const HfSource& src, const std::string& gguf_name,
                    const ConfigExtras& ex) {
  const SafetensorsTensor* t = ck.find(src.name);
  if (squeezed(t->shape) != squeezed(src.shape)) {
    return Error("tensor " + src.name + " has shape " + shape_text(t->shape) + ", expected " + shape_text(src.shape) +
                 " (for " + gguf_name + "; does config.json describe this checkpoint?)");
  }
  if (!hf_readable(t->dtype)) {
    return Error(ErrorCode::unsupported,
                 "tensor " + src.name + " has dtype " + std::string(safetensors_dtype_name(t->dtype)) +
                     ", expected F32, F16, BF16 or F8_E4M3");
  }
  if (t->dtype == SafetensorsDtype::F8_E4M3) return fp8_scale(ck, *t, ex.block_rows, ex.block_cols, nullptr);
  return std::nullopt;
}

std::optional<std::string> detect_prefix(const HfCheckpoint& ck) {
  for (std::string_view p : {kHfPrefixMultimodal, kHfPrefixText}) {
    if (ck.find(std::string(p) + "embed_tokens.weight") != nullptr) return std::string(p);
  }
  return std::nullopt;
}

// ---- writing ----------------------------------------------------------------------------------------

// Collects f32 rows of one tensor and writes them encoded, a chunk at a time.
class RowWriter {
 public:
  RowWriter(GgufSink& sink, GgmlType type, uint64_t ne0, uint64_t n_elements, unsigned threads)
      : sink_(sink), type_(type), ne0_(ne0), threads_(std::max(threads, 1u)),
        row_bytes_(*ggml_bytes(type, ne0)),
        rows_cap_(std::min(std::max<uint64_t>(1, kChunkFloats / ne0), n_elements / ne0)),
        buf_(rows_cap_ * ne0), out_(rows_cap_ * row_bytes_) {}

  // Appends elements [first, first + n) of `t`.
  void read(const SafetensorsTensor& t, uint64_t first, uint64_t n, const HfFp8Scale* scale) {
    while (n > 0 && !sink_.failed()) {
      const uint64_t k = std::min(n, buf_.size() - filled_);
      hf_read_f32(t, first, k, buf_.data() + filled_, scale);
      filled_ += k;
      first += k;
      n -= k;
      if (filled_ == buf_.size()) flush();
    }
  }
  void push(const float* data, uint64_t n) {
    while (n > 0 && !sink_.failed()) {
      const uint64_t k = std::min(n, buf_.size() - filled_);
      std::memcpy(buf_.data() + filled_, data, k * sizeof(float));
      filled_ += k;
      data += k;
      n -= k;
      if (filled_ == buf_.size()) flush();
    }
  }
  void finish() {
    if (filled_ > 0) flush();
  }

 private:
  void flush() {
    const uint64_t rows = filled_ / ne0_;  // producers emit whole rows; a partial one is a bug caught by the writer
    // Threads only pay for chunks of some size; small tensors are encoded here.
    const uint64_t workers = filled_ < (uint64_t{1} << 16) ? 1 : threads_;
    const uint64_t per = (rows + workers - 1) / workers;
    std::vector<std::thread> pool;
    for (uint64_t a = 0; a < rows; a += per) {
      const uint64_t b = std::min(rows, a + per);
      auto work = [this, a, b] { quantize_row(type_, buf_.data() + a * ne0_, out_.data() + a * row_bytes_, (b - a) * ne0_); };
      if (b == rows) {
        work();  // the last share runs here
      } else {
        pool.emplace_back(work);
      }
    }
    for (std::thread& t : pool) t.join();
    sink_.write(out_.data(), rows * row_bytes_);
    filled_ = 0;
  }

  GgufSink& sink_;
  GgmlType type_;
  uint64_t ne0_;
  unsigned threads_;
  uint64_t row_bytes_;
  uint64_t rows_cap_;
  std::vector<float> buf_;
  std::vector<uint8_t> out_;
  uint64_t filled_ = 0;
};

struct Producer {
  const HfCheckpoint& ck;
  const Glm5ConvertPlan& plan;
  unsigned threads;

  HfFp8Scale scale_of(const SafetensorsTensor& t) const {
    HfFp8Scale s;
    if (t.dtype == SafetensorsDtype::F8_E4M3) fp8_scale(ck, t, plan.fp8_block_rows, plan.fp8_block_cols, &s);
    return s;
  }

  void operator()(const Glm5ConvertItem& item, GgufSink& sink) const {
    const Glm5Hparams& hp = plan.hparams;
    const HfRecipe& r = item.recipe;
    RowWriter w(sink, item.type, item.spec.dims[0], item.spec.n_elements(), threads);
    std::vector<const SafetensorsTensor*> src;
    std::vector<HfFp8Scale> scales;
    for (const HfSource& s : r.sources) {
      src.push_back(ck.find(s.name));
      scales.push_back(scale_of(*src.back()));
    }
    const SafetensorsTensor& t0 = *src[0];
    const HfFp8Scale* s0 = &scales[0];
    switch (r.transform) {
      case HfTransform::copy:
        w.read(t0, 0, t0.n_elements, s0);
        break;
      case HfTransform::slice:
        w.read(t0, r.offset, r.count, s0);
        break;
      case HfTransform::neg_exp: {
        std::vector<float> v(t0.n_elements);
        hf_read_f32(t0, 0, v.size(), v.data(), s0);
        for (float& x : v) {
          const double e = std::exp(static_cast<double>(x));
          if (!std::isfinite(e) || !(e > 0)) {
            sink.fail(t0.name + ": exp(A_log) must be finite and positive, got exp(" + std::to_string(x) + ")");
            return;
          }
          x = static_cast<float>(-e);  // rounded once, from double
        }
        w.push(v.data(), v.size());
        break;
      }
      case HfTransform::stack:
        for (size_t e = 0; e < src.size(); ++e) w.read(*src[e], 0, src[e]->n_elements, &scales[e]);
        break;
      case HfTransform::fused_half: {
        const uint64_t I = hp.moe_ffn, D = hp.hidden_size;
        for (uint64_t e = 0; e < hp.n_experts; ++e) w.read(t0, e * 2 * I * D + r.part * I * D, I * D, s0);
        break;
      }
      case HfTransform::kv_b_k:
      case HfTransform::kv_b_v: {
        const uint64_t nope = hp.qk_nope_head_dim, vd = hp.v_head_dim, rank = hp.kv_lora_rank;
        std::vector<float> k(nope * rank), kt(nope * rank);
        for (uint64_t h = 0; h < hp.n_heads; ++h) {
          const uint64_t head = h * (nope + vd) * rank;
          if (r.transform == HfTransform::kv_b_v) {
            w.read(t0, head + nope * rank, vd * rank, s0);
            continue;
          }
          // k_b is stored transposed per head: rows of the latent, each nope wide.
          hf_read_f32(t0, head, nope * rank, k.data(), s0);
          for (uint64_t i = 0; i < nope; ++i) {
            for (uint64_t j = 0; j < rank; ++j) kt[j * nope + i] = k[i * rank + j];
          }
          w.push(kt.data(), kt.size());
        }
        break;
      }
    }
    w.finish();
    for (size_t i = 0; i < src.size(); ++i) {
      hf_release(*src[i]);
      if (scales[i].scale_inv != nullptr) hf_release(*scales[i].scale_inv);
    }
  }
};

}  // namespace

namespace {

// The head's type before block fallbacks (see glm5_tensor_type), and whether it is the 6-bit upgrade.
GgmlType head_type(const Glm5TypePolicy& p, bool* upgraded) {
  *upgraded = false;
  if (p.output_type) return *p.output_type;
  switch (p.type) {
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::IQ4_XS: case GgmlType::IQ3_S:
      *upgraded = true;
      return GgmlType::Q6_K;
    default:
      return p.type;
  }
}

}  // namespace

GgmlType glm5_tensor_type(const Glm5TensorSpec& spec, const Glm5TypePolicy& policy, std::string* why) {
  if (why != nullptr) why->clear();
  const auto keep = [&](const std::string& name) {
    return policy.keep_f32 && std::regex_search(name, *policy.keep_f32);
  };
  if (spec.keep_f32 || keep(spec.name)) return GgmlType::F32;
  GgmlType want = policy.type;
  bool asked = false;  // a rule or --keep-f32 named this type: no note for choosing it
  std::string note;
  if (const Glm5TypeRule* r = policy.rules.match(spec.name)) {
    want = r->type;
    asked = true;
  } else if (spec.role == Glm5Tensor::output ||
             (spec.role == Glm5Tensor::token_embd && policy.tied_embedding)) {
    // The output head's error lands on every logit unaveraged, so 4- and 5-bit files keep it at 6
    // bits, as llama.cpp's do. A tied embedding is the head too: llama.cpp stores it at the head's type.
    const std::string head_name(glm5_tensor_suffix(Glm5Tensor::output));
    const Glm5TypeRule* head_rule = policy.rules.match(head_name);
    bool upgraded = false;
    if (spec.role == Glm5Tensor::token_embd && keep(head_name)) {
      want = GgmlType::F32;
    } else {
      want = head_rule != nullptr && spec.role == Glm5Tensor::token_embd ? head_rule->type : head_type(policy, &upgraded);
    }
    if (spec.role == Glm5Tensor::output && upgraded) {
      note = spec.name + ": the output head is stored as " + type_name(want) + " in a " + type_name(policy.type) + " file";
    } else if (spec.role == Glm5Tensor::token_embd && want != policy.type) {
      note = spec.name + ": the tied embedding is the output head too, stored at the head's type " + type_name(want) +
             " (as llama.cpp stores it)";
    }
  }
  const uint64_t ne0 = spec.dims.empty() ? 1 : spec.dims[0];
  auto fits = [&](GgmlType t) { return ne0 % ggml_type_traits(t).block_elems == 0; };
  if (fits(want)) {
    if (why != nullptr && !asked) *why = note;
    return want;
  }
  const GgmlType fallback = want != GgmlType::Q8_0 && fits(GgmlType::Q8_0) ? GgmlType::Q8_0 : GgmlType::F16;
  if (why != nullptr) {
    *why = spec.name + ": rows of " + std::to_string(ne0) + " are not a whole number of " + type_name(want) +
           " blocks (" + std::to_string(ggml_type_traits(want).block_elems) + "): stored as " + type_name(fallback);
  }
  return fallback;
}

GgmlType glm5_mostly_type(const Glm5ConvertPlan& plan, const Glm5ConvertOptions& options) {
  if (options.rules.empty()) return options.type;
  std::map<GgmlType, uint64_t> bytes;
  for (const Glm5ConvertItem& item : plan.items) {
    if (item.type != GgmlType::F32) bytes[item.type] += *ggml_bytes(item.type, item.spec.n_elements());
  }
  GgmlType most = options.type;
  uint64_t most_bytes = 0;
  for (const auto& [type, b] : bytes) {
    if (b > most_bytes) {
      most = type;
      most_bytes = b;
    }
  }
  return most;
}

uint32_t glm5_file_type(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q4_K: return 14;  // LLAMA_FTYPE_MOSTLY_Q4_K_S (its output head is Q6_K there too)
    case GgmlType::Q5_K: return 16;  // LLAMA_FTYPE_MOSTLY_Q5_K_S
    case GgmlType::Q6_K: return 18;
    case GgmlType::IQ3_S: return 26;   // LLAMA_FTYPE_MOSTLY_IQ3_S
    case GgmlType::IQ4_XS: return 30;  // LLAMA_FTYPE_MOSTLY_IQ4_XS
    case GgmlType::BF16: return 32;
    default: return 0;
  }
}

Expected<Glm5ConvertPlan> plan_glm5_conversion(const std::filesystem::path& hf_dir, const HfCheckpoint& ck,
                                               const Glm5ConvertOptions& options) {
  for (GgmlType t : {options.type, options.output_type.value_or(options.type)}) {
    if (!glm5_writable_type(t)) {
      return Error(ErrorCode::unsupported,
                   "cannot write type " + type_name(t) + " (expected one of " + glm5_writable_type_names() + ")");
    }
  }
  Glm5TypePolicy policy;
  policy.type = options.type;
  policy.output_type = options.output_type;
  policy.rules = options.rules;
  if (!options.keep_f32_regex.empty()) {
    try {
      policy.keep_f32.emplace(options.keep_f32_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return Error("--keep-f32 '" + options.keep_f32_regex + "' is not a valid regular expression: " + e.what());
    }
  }
  const std::filesystem::path config = hf_dir / "config.json";
  Expected<Glm5Hparams> hp = glm5_hparams_from_hf_config_file(config);
  if (!hp) return hp.error();
  Expected<ConfigExtras> ex = read_extras(config);
  if (!ex) return ex.error();

  Glm5ConvertPlan plan;
  plan.hparams = std::move(hp).value();
  plan.fp8_block_rows = ex->block_rows;
  plan.fp8_block_cols = ex->block_cols;
  const std::optional<std::string> prefix = detect_prefix(ck);
  if (!prefix) {
    return Error(hf_dir.string() + ": no " + std::string(kHfPrefixMultimodal) + "embed_tokens.weight or " +
                 std::string(kHfPrefixText) + "embed_tokens.weight: not a glm5_next checkpoint");
  }
  plan.text_prefix = *prefix;

  // MTP blocks: as many as the checkpoint holds (transformers' save_pretrained drops them).
  Glm5Hparams& h = plan.hparams;
  uint32_t nextn = 0;
  while (ck.find(*prefix + "layers." + std::to_string(h.n_layers + nextn) + ".eh_proj.weight") != nullptr) ++nextn;
  if (nextn != h.n_nextn_layers) {
    plan.notes.push_back("config.json says num_nextn_predict_layers = " + std::to_string(h.n_nextn_layers) +
                         "; the checkpoint has " + std::to_string(nextn) + " MTP block(s), which the file gets");
    h.n_nextn_layers = nextn;
  }

  // A tied checkpoint without lm_head.weight: output.weight is made from the embedding.
  policy.tied_embedding = ex->tied && ck.find("lm_head.weight") == nullptr;
  std::set<std::string, std::less<>> used;
  for (Glm5TensorSpec& spec : glm5_all_tensors(h)) {
    std::vector<HfRecipe> recipes = glm5_hf_recipes(h, spec, *prefix);
    if (spec.role == Glm5Tensor::output && !ex->tied) recipes.resize(1);
    const HfRecipe* chosen = nullptr;
    for (const HfRecipe& r : recipes) {
      if (std::all_of(r.sources.begin(), r.sources.end(), [&](const HfSource& s) { return ck.find(s.name) != nullptr; })) {
        chosen = &r;
        break;
      }
    }
    if (chosen == nullptr) {
      if (spec.optional) continue;
      std::string missing;
      for (const HfSource& s : recipes.front().sources) {
        if (ck.find(s.name) == nullptr) {
          missing = s.name;
          break;
        }
      }
      return Error("the checkpoint has no " + missing + " (needed for " + spec.name + ")");
    }
    for (const HfSource& s : chosen->sources) {
      if (auto err = check_source(ck, s, spec.name, *ex)) return *err;
      used.insert(s.name);
      if (ck.find(s.name)->dtype == SafetensorsDtype::F8_E4M3) used.insert(s.name + "_scale_inv");
    }
    if (spec.role == Glm5Tensor::output && chosen != &recipes.front()) {
      plan.notes.push_back("no lm_head.weight and tie_word_embeddings is true: output.weight is the embedding");
    }
    std::string why;
    const GgmlType type = glm5_tensor_type(spec, policy, &why);
    if (!why.empty()) plan.notes.push_back(why);
    plan.gguf_bytes += *ggml_bytes(type, spec.n_elements());
    plan.items.push_back({std::move(spec), *chosen, type});
  }

  uint64_t vision = 0;
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : ck.tensors()) {
    if (used.contains(name)) continue;
    if (glm5_hf_is_vision(name)) {
      ++vision;
    } else {
      unexpected.push_back(name);
    }
  }
  if (!unexpected.empty()) {
    std::string msg = "checkpoint tensor " + unexpected[0];
    if (unexpected.size() > 1) msg += " (and " + std::to_string(unexpected.size() - 1) + " more)";
    return Error(msg + " is not part of the glm5_next text model that config.json describes");
  }
  if (vision > 0) {
    plan.notes.push_back("skipped " + std::to_string(vision) +
                         " vision-tower tensors (model.visual.*): ferry serves text; the vision tower is not converted");
  }
  return plan;
}

Expected<Glm5ConvertResult> convert_glm5_checkpoint(const std::filesystem::path& hf_dir,
                                                    const std::filesystem::path& out,
                                                    const Glm5ConvertOptions& options) {
  auto log = [&](const std::string& line) {
    if (options.log) options.log(line);
  };
  Expected<HfCheckpoint> ck = HfCheckpoint::open(hf_dir);
  if (!ck) return ck.error();
  Expected<Glm5ConvertPlan> planned = plan_glm5_conversion(hf_dir, ck.value(), options);
  if (!planned) return planned.error();
  const Glm5ConvertPlan& plan = planned.value();
  for (const std::string& n : plan.notes) log("note: " + n);

  GgufWriter w;
  if (auto err = write_glm5_hparams(w, plan.hparams)) return *err;
  std::string name = options.name;
  if (name.empty()) name = std::filesystem::absolute(hf_dir).lexically_normal().filename().string();
  if (name.empty()) name = "glm5next";
  for (auto err : {w.set("general.name", name), w.set("general.file_type", glm5_file_type(glm5_mostly_type(plan, options))),
                   w.set("general.quantization_version", uint32_t{2})}) {
    if (err) return *err;
  }
  if (!options.tokenizer_dir.empty()) {
    if (auto err = write_tokenizer_metadata(w, options.tokenizer_dir, plan.hparams.vocab_size)) {
      return err->prefixed("--tokenizer " + options.tokenizer_dir.string() + ": ");
    }
  }

  const unsigned threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  const Producer produce{ck.value(), plan, threads};
  const size_t total = plan.items.size();
  uint64_t done_bytes = 0;
  for (size_t i = 0; i < total; ++i) {
    const Glm5ConvertItem& item = plan.items[i];
    const uint64_t bytes = *ggml_bytes(item.type, item.spec.n_elements());
    auto producer = [&, i, bytes](GgufSink& sink) {
      char pct[16];
      std::snprintf(pct, sizeof pct, "%5.1f%%", plan.gguf_bytes ? 100.0 * double(done_bytes) / double(plan.gguf_bytes) : 100.0);
      log(std::string(pct) + " [" + std::to_string(i + 1) + "/" + std::to_string(total) + "] " + item.spec.name + " " +
          shape_text(item.spec.dims) + " " + type_name(item.type));
      produce(item, sink);
      done_bytes += bytes;
    };
    if (auto err = w.add_tensor(item.spec.name, item.spec.dims, item.type, producer)) return *err;
  }
  Expected<uint64_t> written = w.write_file(out);
  if (!written) return written.error();
  Glm5ConvertResult result;
  result.file_bytes = *written;
  result.tensors = total;
  result.notes = plan.notes;
  return result;
}

}  // namespace ferry::model
