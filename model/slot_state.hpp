#pragma once
// One slot's state on a stage, laid out once for the CPU and the CUDA stage alike: the parts in order
// (for each of the stage's layers, then the MTP block on the last stage), each of a fixed size (a KDA
// layer's conv inputs and recurrent state), one row per token (a DSA layer's latent), per complete
// pool (pool keys) or per token of the incomplete pool (the indexer's keys and gates: tokens % kpool
// rows, the last ones). A stage saves a slot into an image of this layout and restores one; the
// prefix cache and MTP rollback keep such images.
//
// Why only the incomplete pool's keys and gates: nothing reads a token's indexer key or gate once its
// pool's key is made (the scores read pool keys), so the CUDA stage keeps them in a ring of a step's
// rows (gpu/stage_sizes.hpp) and an image carries just what the next pool needs. The tail is in every
// image, with rows or without: a slot that appended past a checkpoint has overwritten its ring.
// Images live only in the process (checkpoints, bench, hand-over), so there is no stored version.
#include <cstdint>
#include <functional>
#include <vector>

#include "config/expected.hpp"
#include "config/kv_type.hpp"
#include "config/stage_split.hpp"
#include "model/glm5/glm5_hparams.hpp"

namespace ferry::model {

// kda_conv: the last kernel-1 conv inputs, oldest first, each a row of 3 * heads * head_dim;
// kda_recurrent: heads x head_dim (k) x head_dim (v); latent one row per token, pool_key per complete
// pool, index_key and index_gate per token of the incomplete pool (tokens - tokens % kpool on).
enum class StatePart : uint8_t { kda_conv, kda_recurrent, latent, index_key, index_gate, pool_key };
enum class StateUnit : uint8_t { fixed, token, pool, tail };

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
  bool with_rows = false;   // per-token and per-pool parts included (the tail parts always are); without
                            // them a restore keeps the slot's own rows [0, tokens), which must be
                            // unchanged since the save
  std::vector<float> data;  // the parts in layout order
};

class SlotStateLayout {
 public:
  SlotStateLayout(const Glm5Hparams& hp, config::LayerRange layers, bool with_mtp, config::KvFormats formats = {});

  const std::vector<StatePartSpec>& parts() const { return parts_; }
  config::KvFormats formats() const { return formats_; }
  // Floats of one part in an image covering `tokens` (trunk) and `mtp_tokens` positions.
  uint64_t part_floats(const StatePartSpec& p, uint32_t tokens, uint32_t mtp_tokens) const;
  // Floats of a whole image; without rows only the fixed and tail parts count.
  uint64_t image_floats(uint32_t tokens, uint32_t mtp_tokens, bool with_rows) const;
  // Calls f(part, offset into image.data, floats) for every part the image holds, in order.
  void for_each(const SlotStateImage& image,
                const std::function<void(const StatePartSpec&, uint64_t, uint64_t)>& f) const;
  // An image of this layout: its size agrees with its token counts. The error names the numbers.
  Status check(const SlotStateImage& image) const;
  // Whether an image without rows holds part `p`.
  static bool in_every_image(const StatePartSpec& p) { return p.unit == StateUnit::fixed || p.unit == StateUnit::tail; }
  uint32_t kpool() const { return kpool_; }

 private:
  std::vector<StatePartSpec> parts_;
  uint32_t kpool_ = 1;
  config::KvFormats formats_;
};

}  // namespace ferry::model
