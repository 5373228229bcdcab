#include "model/glm5/hf_checkpoint.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "model/formats/half.hpp"

namespace ferry::model {

Expected<HfCheckpoint> HfCheckpoint::open(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return Error(ErrorCode::io, dir.string() + ": not a directory");
  HfCheckpoint ck;
  std::vector<std::filesystem::path> opened;
  auto add = [&](const std::filesystem::path& path) -> Status {
    Expected<Safetensors> set = Safetensors::open(path);
    if (!set) return set.error();
    ck.sets_.push_back(std::move(set).value());
    for (const SafetensorsTensor& t : ck.sets_.back().tensors()) ck.by_name_.emplace(t.name, &t);  // first set wins
    for (const auto& shard : ck.sets_.back().shards()) opened.push_back(shard.filename());
    return std::nullopt;
  };
  const bool has_main = std::filesystem::exists(dir / "model.safetensors.index.json", ec) ||
                        std::filesystem::exists(dir / "model.safetensors", ec);
  if (has_main) {
    if (auto err = add(dir)) return *err;
  }
  std::vector<std::filesystem::path> others;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors" &&
        std::find(opened.begin(), opened.end(), entry.path().filename()) == opened.end()) {
      others.push_back(entry.path());
    }
  }
  if (ec) return Error(ErrorCode::io, dir.string() + ": cannot list the directory: " + ec.message());
  std::sort(others.begin(), others.end());
  for (const auto& f : others) {
    const size_t before = ck.by_name_.size();
    if (auto err = add(f)) return *err;
    // Without a main set, two loose files must not both define a tensor.
    if (!has_main && ck.by_name_.size() - before != ck.sets_.back().tensors().size()) {
      for (const SafetensorsTensor& t : ck.sets_.back().tensors()) {
        if (ck.by_name_.at(t.name) != &t) {
          return Error(f.string() + ": tensor " + t.name + " is also in another *.safetensors file");
        }
      }
    }
  }
  if (ck.sets_.empty()) {
    return Error(ErrorCode::io,
                 dir.string() + ": no model.safetensors, model.safetensors.index.json or other *.safetensors file");
  }
  return ck;
}

const SafetensorsTensor* HfCheckpoint::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void hf_release(const SafetensorsTensor& t) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // Only whole pages inside the tensor: its neighbours may still be in use.
  const auto begin = reinterpret_cast<uintptr_t>(t.data.data());
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + t.data.size()) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

bool hf_readable(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::F32 || dtype == SafetensorsDtype::F16 || dtype == SafetensorsDtype::BF16 ||
         dtype == SafetensorsDtype::F8_E4M3;
}

void hf_read_f32(const SafetensorsTensor& t, uint64_t first, uint64_t n, float* out, const HfFp8Scale* scale) {
  const uint8_t* p = t.data.data();
  switch (t.dtype) {
    case SafetensorsDtype::F32:
      std::memcpy(out, p + first * 4, n * 4);
      return;
    case SafetensorsDtype::F16:
    case SafetensorsDtype::BF16: {
      const bool bf = t.dtype == SafetensorsDtype::BF16;
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + (first + i) * 2, 2);
        out[i] = bf ? bf16_to_f32(h) : fp16_to_f32(h);
      }
      return;
    }
    case SafetensorsDtype::F8_E4M3: {
      const uint64_t scale_cols = (scale->cols + scale->block_cols - 1) / scale->block_cols;
      uint64_t i = 0;
      while (i < n) {
        const uint64_t idx = first + i;
        const uint64_t row = idx / scale->cols, col = idx % scale->cols;
        // One run shares a scale: to the end of the row or of the column block, whichever is first.
        const uint64_t run = std::min({n - i, scale->cols - col, scale->block_cols - col % scale->block_cols});
        float s = 0.0f;
        hf_read_f32(*scale->scale_inv, (row / scale->block_rows) * scale_cols + col / scale->block_cols, 1, &s);
        for (uint64_t j = 0; j < run; ++j) out[i + j] = fp8_e4m3_to_f32(p[idx + j]) * s;
        i += run;
      }
      return;
    }
    default:
      return;
  }
}

}  // namespace ferry::model
