#pragma once
// What `ferry serve` loads before it can answer: the model's stages and the tokenizer of one GGUF file,
// with progress (bytes, percent, rate, ETA) on the terminal, in the log and in /health. With no
// --model, the default model embedded in the binary is served; with --synthetic, weights made on
// the GPU and a tokenizer from --tokenizer or a placeholder.
#include <atomic>
#include <memory>
#include <string>

#include "config/expected.hpp"
#include "config/serve_config.hpp"
#include "gpu/backend_factory.hpp"
#include "http/server_context.hpp"
#include "model/pipeline.hpp"
#include "model/text/tokenizer.hpp"
#include "tools/ferry/synthetic_source.hpp"

namespace ferry::cli {

struct LoadedModel {
  gpu::OpenedModel opened;
  std::shared_ptr<const model::Tokenizer> tokenizer;
};

// The file to serve: `config.model.path`, or the embedded default model written to an in-memory
// file; an error when neither exists.
Expected<std::string> resolve_model_path(const config::ServeConfig& config);

// Reads the file once through the page cache (so the first requests do not wait on the disk) while
// reporting progress, then opens the stages (--backend, --devices, --split; the context --ctx, or
// refused with the numbers when a device cannot hold it) and the tokenizer. `stop` cancels between chunks.
Expected<LoadedModel> load_model(const std::string& path, const config::ServeConfig& config,
                                 http::LoadProgress& progress, const std::atomic<bool>& stop);

// --synthetic: the shape, the weight type and --recipe, read and checked before the server listens.
Expected<SyntheticSource> read_synthetic_source(const config::ServeConfig& config);

// Makes the weights on the GPU (open_synthetic_pipeline) and the tokenizer: --tokenizer's, whose ids
// must fit the shape's vocabulary, or model::placeholder_tokenizer.
Expected<LoadedModel> load_synthetic(const SyntheticSource& source, const config::ServeConfig& config);

}  // namespace ferry::cli
