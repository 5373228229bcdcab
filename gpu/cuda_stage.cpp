#include "gpu/cuda_stage.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "gpu/cuda_blas.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/decode_graphs.hpp"
#include "gpu/handoff.hpp"
#include "gpu/head_sampling.hpp"
#include "gpu/layer_runner.hpp"
#include "gpu/mtp_block.hpp"
#include "gpu/pdl.hpp"
#include "gpu/stage_state.hpp"
#include "gpu/step_input.hpp"
#include "gpu/verify_keep.hpp"
#include "gpu/workspace.hpp"
#include "model/glm5/glm5_weights.hpp"

namespace ferry::gpu {
namespace {

std::string format_gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
  return text;
}

}  // namespace

struct CudaStage::Impl {
  model::Glm5Hparams hp;
  model::LayerRange layers;
  CudaStageOptions opt;
  bool synthetic = false;
  std::string name, kernels;
  Stream compute, copy;
  blas::Handle cublas = nullptr;
  std::optional<DeviceWeights> weights;
  std::unique_ptr<StageExperts> experts;  // when the device holds only some routed experts
  std::optional<StageState> state;
  std::optional<Workspace> work;
  std::optional<StepInput> input;
  std::optional<LayerRunner> runner;
  std::optional<Head> head;
  std::optional<DeviceWeights> mtp_weights, mtp_embed;  // loaded, until the MTP block takes them
  std::unique_ptr<CudaMtp> mtp;
  std::optional<VerifyKeep> keep;  // with opt.mtp, when the model has an MTP block (only it drafts)
  DecodeGraphs graphs;
  OpTimes op_times;
  bool time_ops = false;
  StepTrace* trace = nullptr;
  std::shared_ptr<HandoffLink> in, out;  // from the stage before, to the stage after
  Event computed{false}, sent{false};    // this step's layers done; its hand-off copy done
  Event copy_begin, copy_end;            // times the last hand-off copy
  bool copy_timed = false;
  model::StageCounters counters;
  std::optional<Error> dead;  // the device error that ended the stage
  uint64_t peak_used = 0;

  Impl(const model::Glm5Hparams& h, model::LayerRange l, const CudaStageOptions& o)
      : hp(h), layers(l), opt(o), graphs(o.graphs, o.pdl && pdl_env_allows()) {}
  ~Impl() {
    if (cublas != nullptr) blas::api().destroy(cublas);
  }

  bool first() const { return layers.first == 0; }
  bool last() const { return layers.end == hp.n_layers; }
  bool runs_mtp() const { return opt.mtp && last() && hp.n_nextn_layers > 0; }
  // Rows the workspace holds: a step's, and with the MTP block one pending entry per slot more.
  uint32_t work_rows() const { return mtp_work_rows(opt.max_step_rows, opt.max_slots, runs_mtp()); }

  // The MTP block's weights, made by `make` for a range of layers: its layer, and the token
  // embedding when the block has none of its own and the stage does not embed.
  void load_mtp(const std::function<DeviceWeights(model::LayerRange)>& make) {
    if (!runs_mtp()) return;
    mtp_weights.emplace(make({hp.n_layers, hp.n_layers + 1}));
    if (mtp_weights->layer(hp.n_layers).m(model::Glm5Tensor::nextn_embed_tokens).empty() && !first()) {
      mtp_embed.emplace(make({0, 0}));
    }
  }
  // Before a slot's rows: back to the state kept at a verify set's start when the rows start there;
  // a verify set keeps the state at its own start.
  void prepare_rollback(const model::SlotRows& r) {
    if (!keep) return;
    if (r.start != 0 && r.start != state->tokens[r.slot] && keep->start(r.slot)) {
      keep->restore(*state, r.slot, s());  // validate_rows let it through: the rows start there
      if (mtp) mtp->restore(r.slot);
    }
    keep->forget(r.slot);
    if (r.verify == 0) return;
    keep->save(*state, r.slot, s());
    if (mtp) mtp->keep(r.slot);
  }
  cudaStream_t s() const { return compute.get(); }
  uint64_t row_bytes() const { return ModelDims(hp).stream_floats() * sizeof(float); }

  void note_peak() {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) peak_used = std::max<uint64_t>(peak_used, total_b - free_b);
  }

  // The slots' state is sized for the whole context up front: a context the device cannot hold is
  // refused here, with the numbers, before anything else is allocated.
  Status check_state_fits() {
    const uint32_t win = opt.kv_resident;
    const uint32_t step = opt.max_step_rows;
    const uint64_t need = StageState::bytes_for(hp, layers, opt.max_slots, opt.max_context, opt.kv.latent, win, step);
    size_t free_b = 0, total_b = 0;
    FERRY_CUDA(cudaMemGetInfo(&free_b, &total_b));
    if (need <= free_b) return std::nullopt;
    // Past the window only the pool keys grow with the context: the marginal token's bytes, over a pool.
    const uint32_t c = opt.max_context, span = std::min(c, std::max<uint32_t>(1, hp.index_kpool));
    const uint64_t per_token = (StageState::bytes_for(hp, layers, 1, c, opt.kv.latent, win, step) -
                                StageState::bytes_for(hp, layers, 1, c - span, opt.kv.latent, win, step) + span - 1) /
                               span;
    const uint64_t fixed = need - per_token * c * opt.max_slots;
    const uint64_t fits = free_b > fixed ? (free_b - fixed) / std::max<uint64_t>(1, per_token * opt.max_slots) : 0;
    return Error(ErrorCode::out_of_memory,
                 model::describe_layers(layers) + " on cuda:" + std::to_string(opt.device) + ": " +
                     std::to_string(opt.max_slots) + " slots of " + std::to_string(opt.max_context) +
                     " tokens need " + format_gib(need) + " of state, and " + format_gib(free_b) +
                     " is free after the weights; lower --ctx to at most " + std::to_string(fits) +
                     " (the state of " + std::to_string(opt.max_slots) + " slots) or --slots");
  }

  // Everything but the weights, after them.
  void finish_setup() {
    state.emplace(hp, layers, opt.max_slots, opt.max_context, opt.kv, s(), opt.kv_resident, opt.max_step_rows);
    const model::LayerRange work_layers{layers.first, runs_mtp() ? hp.n_layers + 1 : layers.end};
    work.emplace(hp, work_layers, work_rows(), opt.max_context);
    FERRY_CUBLAS(blas::api().set_workspace(cublas, work->cublas_ws, Workspace::kCublasWorkspace));
    input.emplace(opt.max_step_rows);
    runner.emplace(hp, *weights, *state, *work, experts.get(), cublas, s());
    runner->set_decode_branches(opt.decode_branches);
    if (last()) head.emplace(hp, *weights, *work, *runner, s());
    if (opt.mtp && hp.n_nextn_layers > 0) keep.emplace(hp, layers, opt.max_slots);
    if (mtp_weights) {
      mtp = std::make_unique<CudaMtp>(hp, std::move(*mtp_weights), std::move(mtp_embed), *weights, *work, cublas,
                                      opt.max_slots, opt.max_context, work_rows(), opt.kv, opt.graphs, s());
      mtp_weights.reset();
      mtp_embed.reset();
    }
    FERRY_CUDA(cudaDeviceSynchronize());
    note_peak();
  }

  void collect_copy_time() {
    if (copy_timed && copy_end.done()) {
      counters.handoff_ms += copy_end.since(copy_begin);
      ++counters.handoffs_timed;
      copy_timed = false;
    }
  }

  Expected<model::StageOutput> run(const std::vector<model::SlotRows>& rows, const CudaHandoff* h);
};

namespace {

void set_device(int device) {
  int count = 0;
  FERRY_CUDA(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    throw CudaError("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " visible)",
                    ErrorCode::invalid_input);
  }
  FERRY_CUDA(cudaSetDevice(device));
}

}  // namespace

Expected<std::unique_ptr<CudaStage::Impl>> CudaStage::make_impl(const model::Glm5Hparams& hp, model::LayerRange layers,
                                                                const CudaStageOptions& opt,
                                                                const std::function<void(Impl&)>& load) {
  if (opt.max_slots == 0 || opt.max_context == 0 || opt.max_step_rows == 0) {
    return Error(ErrorCode::invalid_input, "CUDA stage: max_slots, max_context and max_step_rows must be positive");
  }
  try {
    set_device(opt.device);
    auto impl = std::make_unique<CudaStage::Impl>(hp, layers, opt);
    cudaDeviceProp prop{};
    FERRY_CUDA(cudaGetDeviceProperties(&prop, opt.device));
    impl->name = prop.name;
    impl->kernels = kernel_image();
    FERRY_CUBLAS(blas::api().create(&impl->cublas));
    FERRY_CUBLAS(blas::api().set_stream(impl->cublas, impl->s()));
    upload_quant_tables();
    load(*impl);
    if (auto e = impl->check_state_fits()) return *e;
    impl->finish_setup();
    return impl;
  } catch (const CudaError& e) {
    return Error(e.code(), model::describe_layers(layers) + " on cuda:" + std::to_string(opt.device) + ": " + e.what());
  }
}

CudaStage::CudaStage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaStage::~CudaStage() {
  if (impl_) cudaSetDevice(impl_->opt.device);  // its buffers are freed on their own device
}

Expected<std::unique_ptr<CudaStage>> CudaStage::from_weights(const model::Glm5Weights& weights,
                                                             model::LayerRange layers, const CudaStageOptions& opt) {
  auto impl = make_impl(weights.hparams(), layers, opt, [&](Impl& m) {
    m.weights.emplace(DeviceWeights::upload(weights, layers, !opt.tiers, m.s()));
    if (opt.tiers) {
      const auto source = file_experts(weights);
      m.experts = std::make_unique<StageExperts>(m.hp, layers, *source, opt.tiers->host, opt.tiers->plan, m.s(),
                                                 m.copy.get());
    }
    m.load_mtp([&](model::LayerRange r) { return DeviceWeights::upload(weights, r, true, m.s()); });
  });
  if (!impl) return impl.error();
  return std::unique_ptr<CudaStage>(new CudaStage(std::move(impl.value())));
}

Expected<std::unique_ptr<CudaStage>> CudaStage::synthetic(const SyntheticModel& model, model::LayerRange layers,
                                                          const CudaStageOptions& opt) {
  const std::vector<std::string> problems = model.hparams.validate();
  if (!problems.empty()) return Error(ErrorCode::invalid_input, "synthetic model: " + problems.front());
  auto impl = make_impl(model.hparams, layers, opt, [&](Impl& m) {
    m.synthetic = true;
    m.weights.emplace(DeviceWeights::synthesize(model, layers, !opt.tiers, m.s()));
    if (opt.tiers) {
      const auto source = synthetic_experts(model);
      m.experts = std::make_unique<StageExperts>(m.hp, layers, *source, opt.tiers->host, opt.tiers->plan, m.s(),
                                                 m.copy.get());
    }
    m.load_mtp([&](model::LayerRange r) { return DeviceWeights::synthesize(model, r, true, m.s()); });
  });
  if (!impl) return impl.error();
  return std::unique_ptr<CudaStage>(new CudaStage(std::move(impl.value())));
}

Expected<model::StageOutput> CudaStage::Impl::run(const std::vector<model::SlotRows>& rows, const CudaHandoff* h) {
  const auto begin = std::chrono::steady_clock::now();
  // This step's streams overwrite the workspace: the previous step's hand-off must have read it.
  FERRY_CUDA(cudaStreamWaitEvent(s(), sent.get(), 0));
  const uint32_t n = model::total_rows(rows);
  if (!first()) {
    if (h == nullptr || h->rows() != n) {
      if (h != nullptr) in->discard(*h);
      return Error(ErrorCode::internal, model::describe_layers(layers) + ": no hand-off of " + std::to_string(n) + " rows");
    }
    in->receive(*h, work->R, s());
  }
  const model::RowLimits limits{opt.max_slots, opt.max_context, opt.max_step_rows, first() ? hp.vocab_size : 0};
  std::vector<uint32_t> restart(opt.max_slots, model::kNoRestart);
  for (uint32_t i = 0; keep && i < opt.max_slots; ++i) restart[i] = keep->start(i).value_or(model::kNoRestart);
  if (auto e = model::validate_rows(rows, state->tokens, limits, restart)) return *e;
  for (const model::SlotRows& r : rows) {
    const std::string slot = "slot " + std::to_string(r.slot);
    if (r.verify > 0 && !keep) {
      return Error(ErrorCode::invalid_plan, slot + " has drafts to verify, but the stage was made without --mtp");
    }
    if (r.draft > 0 && last() && !mtp) {
      return Error(ErrorCode::invalid_plan, slot + " asks for drafts, but " +
                                                (hp.n_nextn_layers > 0 ? "this stage does not run the MTP block"
                                                                       : "the model has no MTP block"));
    }
    if (r.draft > kMaxCudaDrafts) {
      return Error(ErrorCode::invalid_plan, slot + " asks for " + std::to_string(r.draft) + " drafts, more than " +
                                                std::to_string(kMaxCudaDrafts));
    }
  }
  for (const model::SlotRows& r : rows) {
    if (r.start == 0 && !r.tokens.empty()) {
      state->zero_slot(r.slot, s());
      if (mtp) mtp->reset(r.slot);
    }
    prepare_rollback(r);
  }
  // A windowed step can be captured when the device plans it (gpu/kv_window.hpp); its graphs are
  // apart from the in-window steps' of the same shape.
  const bool windowed = state->begin_step(rows, s());
  const bool window_graphable = !windowed || state->window()->device_planned();
  if (experts) experts->before_step();
  const StepGeometry g = input->stage(rows, last(), last() ? work->logit_rows : 1, s());
  const int32_t* tokens = first() ? input->tokens() : nullptr;
  model::StageOutput output;
  const bool graphable = trace == nullptr && window_graphable && input->decode_only() && g.rows <= kMaxMatvecTokens &&
                         (!last() || (input->logit_list().size() == g.rows && g.rows <= work->logit_rows));
  runner->set_op_times(nullptr);  // a step that threw may have left its timer (and trace) attached
  runner->set_trace(nullptr);
  if (graphable) {
    graphs.run(DecodeGraphs::shape(g.rows, g.segments, g.max_seg_rows, windowed), s(), [&] {
      runner->forward(layers, g, tokens);
      if (last()) head->decode(*input, g.rows);
    });
    if (last()) output.results = head->decode_results(rows, *input);
  } else {
    OpTimes* times = time_ops ? &op_times : nullptr;
    if (times != nullptr) times->begin(s());
    runner->set_op_times(times);
    runner->set_trace(trace);
    runner->forward(layers, g, tokens);
    runner->set_trace(nullptr);
    if (last()) output.results = head->results(rows, *input);
    runner->set_op_times(nullptr);
    if (times != nullptr) {
      if (last()) times->mark(OpGroup::head, s());
      times->finish();
    }
  }
  if (mtp) mtp->extend(rows, output.results);
  if (experts) experts->after_step();
  for (const model::SlotRows& r : rows) {
    if (!r.tokens.empty()) state->tokens[r.slot] = r.start + static_cast<uint32_t>(r.tokens.size());
  }
  if (!last()) {
    collect_copy_time();
    // Between devices the copy stream carries the rows while the next step computes; on one device
    // nothing runs beside it, and the compute stream saves the two cross-stream fences.
    const cudaStream_t via = out->sender() == out->receiver() ? s() : copy.get();
    if (via != s()) {
      computed.record(s());
      FERRY_CUDA(cudaStreamWaitEvent(via, computed.get(), 0));
    }
    const bool time_it = !copy_timed;
    if (time_it) copy_begin.record(via);
    const CudaHandoff sent_rows = out->send(work->R, uint64_t{n} * row_bytes(), n, via);
    if (time_it) {
      copy_end.record(via);
      copy_timed = true;
    }
    sent.record(via);
    output.handoff = std::make_shared<CudaHandoff>(sent_rows);
    counters.handoff_bytes += sent_rows.bytes();
  }
  ++counters.steps;
  counters.rows += n;
  counters.compute_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  note_peak();
  return output;
}

Expected<model::StageOutput> CudaStage::run(const std::vector<model::SlotRows>& rows, const model::Handoff* in) {
  Impl& m = *impl_;
  const auto* h = dynamic_cast<const CudaHandoff*>(in);
  if (m.dead) {
    if (in != nullptr) discard(*in);
    return *m.dead;
  }
  try {
    FERRY_CUDA(cudaSetDevice(m.opt.device));
    return m.run(rows, h);
  } catch (const CudaError& e) {
    Error error(e.code(), model::describe_layers(m.layers) + " on cuda:" + std::to_string(m.opt.device) + ": " + e.what());
    if (ends_stage(e.code())) m.dead = error;
    return error;
  }
}

void CudaStage::discard(const model::Handoff& in) {
  if (const auto* h = dynamic_cast<const CudaHandoff*>(&in); h != nullptr && impl_->in) impl_->in->discard(*h);
}

Status CudaStage::connect(model::Stage& next) {
  auto* to = dynamic_cast<CudaStage*>(&next);
  if (to == nullptr) return Error(ErrorCode::unsupported, "a CUDA stage hands off only to another CUDA stage");
  try {
    const uint32_t rows = std::min(impl_->opt.max_step_rows, to->impl_->opt.max_step_rows);
    auto link = std::make_shared<HandoffLink>(impl_->opt.device, to->impl_->opt.device, rows * impl_->row_bytes());
    impl_->out = link;
    to->impl_->in = link;
    FERRY_CUDA(cudaSetDevice(impl_->opt.device));
    return std::nullopt;
  } catch (const CudaError& e) {
    return Error(e.code(), std::string("connecting the stages: ") + e.what());
  }
}

Status CudaStage::reset_slot(uint32_t slot) {
  Impl& m = *impl_;
  if (m.dead) return m.dead;
  if (slot >= m.opt.max_slots) return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " does not exist");
  try {
    FERRY_CUDA(cudaSetDevice(m.opt.device));
    m.state->zero_slot(slot, m.s());
    if (m.keep) m.keep->forget(slot);
    if (m.mtp) m.mtp->reset(slot);
    return std::nullopt;
  } catch (const CudaError& e) {
    Error error(e.code(), e.what());
    if (ends_stage(e.code())) m.dead = error;
    return error;
  }
}

Expected<model::SlotStateImage> CudaStage::save_slot(uint32_t slot, bool with_rows) {
  Impl& m = *impl_;
  if (m.dead) return *m.dead;
  try {
    FERRY_CUDA(cudaSetDevice(m.opt.device));
    return m.state->save(slot, with_rows, m.s());
  } catch (const CudaError& e) {
    Error error(e.code(), e.what());
    if (ends_stage(e.code())) m.dead = error;
    return error;
  }
}

Status CudaStage::restore_slot(uint32_t slot, const model::SlotStateImage& image) {
  Impl& m = *impl_;
  if (m.dead) return m.dead;
  try {
    FERRY_CUDA(cudaSetDevice(m.opt.device));
    if (m.keep && slot < m.opt.max_slots) m.keep->forget(slot);
    if (auto e = m.state->restore(slot, image, m.s())) return e;
    if (m.mtp) m.mtp->restored(slot, image.tokens, image.with_rows);
    return std::nullopt;
  } catch (const CudaError& e) {
    Error error(e.code(), e.what());
    if (ends_stage(e.code())) m.dead = error;
    return error;
  }
}

const model::Glm5Hparams& CudaStage::hparams() const { return impl_->hp; }
model::LayerRange CudaStage::layers() const { return impl_->layers; }
uint32_t CudaStage::max_slots() const { return impl_->opt.max_slots; }
uint32_t CudaStage::max_context() const { return impl_->opt.max_context; }
uint32_t CudaStage::max_step_rows() const { return impl_->opt.max_step_rows; }
const model::SlotStateLayout& CudaStage::state_layout() const { return impl_->state->layout(); }
int CudaStage::device() const { return impl_->opt.device; }
std::string CudaStage::device_name() const { return impl_->name; }
bool CudaStage::synthetic_weights() const { return impl_->synthetic; }
std::string CudaStage::handoff_path() const { return impl_->out ? impl_->out->path() : std::string(); }

model::ExpertTier* CudaStage::experts() { return impl_->experts.get(); }
bool CudaStage::drafts() const { return impl_->mtp != nullptr; }
void CudaStage::record_mtp_logits(bool on) {
  if (impl_->mtp) impl_->mtp->record_logits(on);
}
void CudaStage::time_ops(bool on) { impl_->time_ops = on; }
void CudaStage::trace_steps(StepTrace* trace) { impl_->trace = trace; }
OpTimeTotals CudaStage::take_op_times() { return impl_->op_times.take(); }
size_t CudaStage::mtp_graphs() const { return impl_->mtp ? impl_->mtp->graphs() : 0; }
size_t CudaStage::decode_graphs() const { return impl_->graphs.captured(); }
size_t CudaStage::decode_graph_pdl_edges() const { return impl_->graphs.programmatic_edges(); }
std::vector<std::string> CudaStage::decode_graph_kernels(uint32_t rows, uint32_t segments,
                                                        uint32_t longest_segment) const {
  return impl_->graphs.kernels(DecodeGraphs::shape(rows, segments, longest_segment));
}
std::vector<float> CudaStage::take_mtp_logits() { return impl_->mtp ? impl_->mtp->take_logits() : std::vector<float>{}; }

model::StageCounters CudaStage::counters() const {
  impl_->collect_copy_time();
  model::StageCounters c = impl_->counters;
  if (const KvWindow* w = impl_->state->window()) {
    const KvWindowStats k = w->stats(impl_->state->tokens);
    c.kv_window_rows = k.window_rows;
    c.kv_resident_rows = k.resident_rows;
    c.kv_windowed_steps = k.windowed_steps;
    c.kv_hits = k.hits;
    c.kv_fetched_rows = k.misses;
    c.kv_fetched_bytes = k.fetched_bytes;
    c.kv_last_fetched_rows = k.last_fetched_rows;
    c.kv_last_fetched_bytes = k.last_fetched_bytes;
    c.kv_host_slot_bytes = k.host_bytes;
  }
  return c;
}

CudaStage::PrefillGatherCounts CudaStage::prefill_gather_counts() const {
  PrefillGatherCounts c;
  if (const KvWindow* w = impl_->state->window()) {
    const KvWindowStats k = w->stats(impl_->state->tokens);
    c.groups = k.prefill_groups;
    c.rows = k.prefill_rows;
    c.tier_rows = k.prefill_tier_rows;
  }
  return c;
}

std::string CudaStage::describe() const {
  const Impl& m = *impl_;
  return "cuda:" + std::to_string(m.opt.device) + " " + m.name + " (kernels " + m.kernels + ", cuBLAS " +
         blas::api().library + "), " + model::describe_layers(m.layers) + (m.synthetic ? " (SYNTHETIC weights)" : "");
}

DeviceMemoryReport CudaStage::memory() const {
  impl_->note_peak();
  const Impl& m = *impl_;
  const uint64_t inbox = m.in ? m.in->capacity() : 0;
  const uint64_t spec = (m.keep ? m.keep->bytes() : 0) + (m.mtp ? m.mtp->bytes() : 0);
  return {m.weights->bytes(), m.state->bytes() + spec, m.work->bytes() + inbox, m.peak_used};
}

uint64_t CudaStage::decode_bytes_per_token(uint64_t depth) const {
  const Impl& m = *impl_;
  const ModelDims z(m.hp);
  uint64_t b = m.weights->decode_bytes(z.k, z.E) + uint64_t{z.D} * 4;
  for (uint32_t il = m.layers.first; il < m.layers.end; ++il) {
    const DevLayer& l = m.weights->layer(il);
    if (m.experts && l.ffn == model::FfnKind::moe) b += uint64_t{z.k} * m.experts->shape(il).bytes;
    if (l.kind == model::LayerKind::kda) {
      b += 2ull * z.kda_nh * z.kda_hd * z.kda_hd * 4;  // recurrent state read and written
    } else {
      const uint64_t attended = std::min<uint64_t>(depth + 1, m.hp.index_topk + z.kp - 1);
      b += attended * config::kv_row_bytes(m.opt.kv.latent, z.kvlr);  // selected latents
      if (l.has_indexer) b += (depth + 1) / z.kp * z.id * 4;  // pool keys scored
    }
  }
  return b;
}

}  // namespace ferry::gpu
