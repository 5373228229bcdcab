#pragma once
// A reference case written by tools/reference/make_fixtures.py (reference.json, prefill_logits.f32,
// decode_logits.f32, optional mtp_logits.f32), and running ferry's CPU forward pass over it. A case
// whose JSON names no logits_files is token ids only (an evaluation window of a trained case): it can
// only be used to compare two conversions of one model.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "config/expected.hpp"
#include "model/cpu/glm5_forward.hpp"
#include "model/pipeline.hpp"

namespace ferry::cli {

struct ReferenceCase {
  std::string name;
  std::vector<int32_t> input_ids, decode_tokens;
  uint32_t vocab = 0;
  bool has_logits = false;                  // false: prefill and decode are empty
  std::vector<float> prefill, decode, mtp;  // rows x vocab
  uint32_t kpool = 0;
  // layer ("3", "mtp") -> per query position, the selected pools
  std::map<std::string, std::vector<std::vector<uint32_t>>> selections;

  // `path`: a case directory (its reference.json) or a case JSON file; logits files are found beside
  // the JSON. The error names the file and what was wrong.
  static Expected<ReferenceCase> load(const std::filesystem::path& path);
};

// What ferry computed for a case: logits of every prompt row (prefilled in chunks of `chunk`, 0 =
// whole prompt), of every decode step (the reference's tokens fed one at a time), and of the MTP
// block over all positions when the model has one and `with_mtp` asks for it.
struct CaseRun {
  std::vector<float> prefill, decode, mtp;
  std::map<std::string, std::vector<std::vector<uint32_t>>> selections;  // as ReferenceCase's
  double prefill_seconds = 0, decode_seconds = 0;
};

// `kv`: the DSA caches' row formats (f32: the reference's own).
CaseRun run_case(model::Glm5Forward& model, const ReferenceCase& ref, size_t chunk, bool with_mtp,
                 config::KvFormats kv = {});

// The same run through a pipeline of stages (any backend, any split): prompt logits in chunks, then
// the decode tokens one step at a time, on slot 0. No selections and no MTP logits (stages return
// neither; eval-ref takes a CUDA last stage's MTP logits from the stage itself).
// `after_step` runs after every step (the expert policy of a tiered model).
Expected<CaseRun> run_case_pipeline(model::Pipeline& pipeline, const ReferenceCase& ref, size_t chunk,
                                    const std::function<void()>& after_step = {});

}  // namespace ferry::cli
