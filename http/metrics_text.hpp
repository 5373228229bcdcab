#pragma once
// GET /metrics: Prometheus text exposition (version 0.0.4) of the engine's counters, gauges and
// histograms and the HTTP side's request counters.
#include <optional>
#include <string>

#include "actors/messages.hpp"
#include "http/server_context.hpp"

namespace ferry::http {

// `engine` is absent while the model loads.
std::string render_metrics(const ServerContext& context, const std::optional<actors::EngineSnapshot>& engine);

}  // namespace ferry::http
