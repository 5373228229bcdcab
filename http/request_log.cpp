#include "http/request_log.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace ferry::http {
namespace {

namespace bj = boost::json;

std::atomic<bool> json_lines{false};

// Bytes that are not UTF-8 become U+FFFD, so that a line is always valid JSON.
std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n != 0 && i + n <= s.size() && !(n == 2 && c < 0xC2);
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      ++i;
    }
  }
  return out;
}

double round3(double v) { return std::round(v * 1000.0) / 1000.0; }

double decode_rate(const RequestLogEntry& e) {
  return e.completion_tokens > 1 && e.predicted_ms > 0 ? (e.completion_tokens - 1) * 1000.0 / e.predicted_ms : 0;
}

// One JSON object per line: time and level first, then the request's fields or the message.
class JsonLineFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch - seconds).count();
    const std::time_t t = static_cast<std::time_t>(seconds.count());
    std::tm tm{};
    gmtime_r(&t, &tm);
    const std::string time = fmt::format("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}.{:03d}Z", tm.tm_year + 1900,
                                         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
    const auto level = spdlog::level::to_string_view(msg.level);
    std::string line = std::string("{\"time\":\"") + time + "\",\"level\":\"" + std::string(level.data(), level.size()) + "\",";
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    if (std::string_view(msg.logger_name.data(), msg.logger_name.size()) == "request" && payload.size() >= 2 &&
        payload.front() == '{') {
      line.append(payload.substr(1));  // the request's own object, opened above
    } else {
      line += "\"msg\":" + bj::serialize(bj::string(valid_utf8(payload))) + "}";
    }
    line += '\n';
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonLineFormatter>(); }
};

std::shared_ptr<spdlog::logger> request_logger() {
  if (auto logger = spdlog::get("request")) return logger;
  return spdlog::default_logger();
}

}  // namespace

std::string request_log_json(const RequestLogEntry& e) {
  bj::object o;
  o["event"] = "request";
  o["id"] = e.id;
  o["endpoint"] = e.endpoint;
  o["slot"] = e.slot;
  o["prompt_tokens"] = e.prompt_tokens;
  o["cached_tokens"] = e.cached_tokens;
  o["completion_tokens"] = e.completion_tokens;
  o["queue_ms"] = round3(e.queue_ms);
  o["prompt_ms"] = round3(e.prompt_ms);
  o["predicted_ms"] = round3(e.predicted_ms);
  o["ttft_ms"] = round3(e.ttft_ms);
  o["total_ms"] = round3(e.total_ms);
  o["decode_tokens_per_s"] = round3(decode_rate(e));
  o["finish_reason"] = e.finish_reason;
  o["status"] = e.status;
  if (!e.message.empty()) o["message"] = valid_utf8(e.message);
  if (e.client_gone) o["client_gone"] = true;
  return bj::serialize(o);
}

std::string request_log_text(const RequestLogEntry& e) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "request %s (%s): slot %lld, prompt %u tokens (%u cached), completion %u tokens; queue %.1f ms, "
                "prompt %.1f ms, decode %.1f ms (%.1f t/s), ttft %.1f ms, total %.1f ms; finish %s (%s)",
                e.id.empty() ? "-" : e.id.c_str(), e.endpoint.c_str(), static_cast<long long>(e.slot), e.prompt_tokens,
                e.cached_tokens, e.completion_tokens, e.queue_ms, e.prompt_ms, e.predicted_ms, decode_rate(e), e.ttft_ms,
                e.total_ms, e.finish_reason.c_str(), e.status.c_str());
  std::string line = buf;
  if (e.client_gone) line += ", client gone";
  if (!e.message.empty()) line += ": " + e.message;
  return line;
}

void configure_logging(bool json) {
  json_lines.store(json);
  // stdout, as spdlog's own default logger; the unnamed main logger keeps its lines as they were.
  auto sink = std::make_shared<spdlog::sinks::stdout_color_sink_mt>();
  auto main = std::make_shared<spdlog::logger>("", sink);
  auto request = std::make_shared<spdlog::logger>("request", sink);
  main->set_level(spdlog::get_level());
  request->set_level(spdlog::get_level());
  if (json) {
    sink->set_color_mode(spdlog::color_mode::never);
    sink->set_formatter(std::make_unique<JsonLineFormatter>());
  }
  spdlog::drop("request");
  spdlog::register_logger(request);
  spdlog::set_default_logger(main);
}

void log_request(const RequestLogEntry& entry) {
  const auto logger = request_logger();
  logger->info("{}", json_lines.load() ? request_log_json(entry) : request_log_text(entry));
}

}  // namespace ferry::http
