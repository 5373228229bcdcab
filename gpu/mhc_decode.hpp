#pragma once
// mhc_pre for decode rows (issue 15): a cluster of blocks a row instead of one block (gpu/ops.cu),
// and the same kernel with the site's mixer product and the post of the site before in one launch.
#include "gpu/cuda_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/stream_branch.hpp"

namespace ferry::gpu {

// Rows up to which mhc_pre takes the cluster kernel; above it the one-block kernel fills the device.
inline constexpr uint32_t kMhcClusterMaxRows = 256;

// Launches mhc_pre as a cluster of 16 blocks a row (8 where the device cannot place 16), each
// reading its slice of the H streams once (the 1/rms and the collapsed stream's norm both come from
// the slices' Gram sums, in f64), when the kernels were built for sm90+ and the shape fits (H = 4, D a
// multiple of 4 and at most 8,192, rows <= kMhcClusterMaxRows); returns false (launching nothing)
// otherwise. Inside a PdlScope it launches with PDL (gpu/pdl.hpp). Same coefficients as the
// one-block kernel for the same 1/rms (the same operations in the same order); the 1/rms and the
// norm differ in rounding only.
bool mhc_pre_clustered(const MhcArgs& a, cudaStream_t stream);
// The one-block-a-row kernel, whatever the rows (mhc_pre picks; the tests compare the two).
void mhc_pre_one_block(const MhcArgs& a, cudaStream_t stream);

// The MoE combine of a decode step (moe_combine without `where`) for a site to make the post's y
// itself: y[r] = shared[r] + sum_j weights[r][j] * eo[r * k + j], moe_combine's operations in its
// order (the same bits), so that the combine needs no launch of its own.
struct MoeCombineIn {
  const float* eo = nullptr;       // [rows * k][D]
  const float* weights = nullptr;  // [rows][k]
  const float* shared = nullptr;   // [rows][D]; null: none
  uint32_t k = 0;
};

struct MhcPostPre;

// comb off the critical path of a decode step. The site's Sinkhorn (20 rounds on one warp of rank 0,
// ~2 us) holds up the grid's end, which the next kernel waits for, though only the next site's post
// reads comb. A site launched with a branch writes comb's logits instead, and a one-warp kernel on the
// branch's stream, forked after the site, makes comb (the same operations: the same bits) while the
// sublayer runs; in a captured step the fork and join are graph edges. Everything that reads comb
// after such a site waits on join(): the next site does so itself, the last post and any fallback
// are the caller's.
class MhcCombBranch {
 public:
  MhcCombBranch();
  // `stream` waits for the comb being made on the branch (nothing when none is).
  void join(cudaStream_t stream) { branch_.join(stream); }
  // Forgets an unjoined fork: a step that threw may have left one in a capture that is gone.
  void abandon() { branch_.abandon(); }

 private:
  friend bool mhc_post_pre(const MhcPostPre& p, cudaStream_t stream);

  StreamBranch branch_;
  DeviceBuffer logits_;  // [kMhcClusterMaxRows][H*H], H = 4
};

// One mHC site in one launch: when y or combine is set, first the post of the site before
// (streams[h'] = post_in[h'] * y + sum_h comb_in[h][h'] * streams[h], in place: mhc_post's bits);
// then the mixing logits fn @ streams (pre.mix is not read), then mhc_pre's outputs into pre.x /
// pre.post / pre.comb (which may be post_in / comb_in: they are read first). fn is the site's
// [(2+H)*H][H*D] mixer. Returns false (launching nothing) where mhc_pre_clustered would, or when fn
// is not f32 of that shape or fn / y (or the combine's eo / shared) are not 16-byte aligned: the
// caller then runs moe_combine, mhc_post, the product and mhc_pre. A combine without its expert
// outputs, weights or k is refused.
struct MhcPostPre {
  MhcArgs pre;
  const DevMatrix* fn = nullptr;
  float* streams = nullptr;        // pre.streams, writable
  const float* y = nullptr;        // [rows][D]; null: no post before this site (unless `combine`)
  const MoeCombineIn* combine = nullptr;  // set: the post's y is this sum (y is not read)
  const float* post_in = nullptr;  // [rows][H]
  const float* comb_in = nullptr;  // [rows][H*H]
  MhcCombBranch* branch = nullptr;  // set: pre.comb is made on the branch (joined here before the post)
};
bool mhc_post_pre(const MhcPostPre& p, cudaStream_t stream);

// mhc_post with y the MoE combine (the last sublayer of a decode step): moe_combine then mhc_post in
// one launch, the same bits (gpu/ops.cu); any device.
void mhc_post_combine(float* streams, const MoeCombineIn& combine, const float* post, const float* comb, uint32_t rows,
                      uint32_t H, uint32_t D, cudaStream_t stream);

}  // namespace ferry::gpu
