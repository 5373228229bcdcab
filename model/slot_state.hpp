#pragma once
// One slot's state on a stage, laid out once for the CPU and the CUDA stage alike: the parts in order
// (for each of the stage's layers, then the MTP block on the last stage), each of a fixed size (a KDA
// layer's conv inputs and recurrent state) or one row per token (a DSA layer's latent, indexer keys
// and gates) or per complete pool (pool keys). A stage saves a slot into an image of this layout and
// restores one; the prefix cache and MTP rollback keep such images.
#include <cstdint>
#include <functional>
#include <vector>

#include "config/expected.hpp"
#include "config/kv_type.hpp"
#include "config/stage_split.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::model {

// kda_conv: the last kernel-1 conv inputs, oldest first, each a row of 3 * heads * head_dim;
// kda_recurrent: heads x head_dim (k) x head_dim (v); the rest one row per token or complete pool.
enum class StatePart : uint8_t { kda_conv, kda_recurrent, latent, index_key, index_gate, pool_key };
enum class StateUnit : uint8_t { fixed, token, pool };

struct StatePartSpec {
  uint32_t layer = 0;  // block index (n_layers for the MTP block)
  StatePart part = StatePart::kda_conv;
  StateUnit unit = StateUnit::fixed;
  uint64_t width = 0;  // floats per unit (in the image)
  bool mtp = false;    // counted in the MTP block's tokens, not the trunk's
};

struct SlotStateImage {
  uint32_t tokens = 0;      // trunk positions the state covers
  uint32_t mtp_tokens = 0;  // positions in the MTP block's cache
  bool with_rows = false;   // per-token and per-pool parts included; without them a restore keeps the
                            // slot's own rows [0, tokens), which must be unchanged since the save
  std::vector<float> data;  // the parts in layout order
};

class SlotStateLayout {
 public:
  SlotStateLayout(const Glm5Hparams& hp, config::LayerRange layers, bool with_mtp, config::KvFormats formats = {});

  const std::vector<StatePartSpec>& parts() const { return parts_; }
  config::KvFormats formats() const { return formats_; }
  // Floats of one part in an image covering `tokens` (trunk) and `mtp_tokens` positions.
  uint64_t part_floats(const StatePartSpec& p, uint32_t tokens, uint32_t mtp_tokens) const;
  // Floats of a whole image; without rows only the fixed parts count.
  uint64_t image_floats(uint32_t tokens, uint32_t mtp_tokens, bool with_rows) const;
  // Calls f(part, offset into image.data, floats) for every part the image holds, in order.
  void for_each(const SlotStateImage& image,
                const std::function<void(const StatePartSpec&, uint64_t, uint64_t)>& f) const;
  // An image of this layout: its size agrees with its token counts. The error names the numbers.
  Status check(const SlotStateImage& image) const;

 private:
  std::vector<StatePartSpec> parts_;
  uint32_t kpool_ = 1;
  config::KvFormats formats_;
};

}  // namespace ferry::model
