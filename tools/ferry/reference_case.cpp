#include "tools/ferry/reference_case.hpp"

#include <boost/json.hpp>
#include <chrono>
#include <fstream>
#include <sstream>

namespace ferry::cli {
namespace {

namespace json = boost::json;

Expected<std::vector<float>> read_f32(const std::filesystem::path& path, size_t rows, size_t vocab) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Error(ErrorCode::io, path.string() + ": cannot open");
  std::vector<float> v(rows * vocab);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (static_cast<size_t>(f.gcount()) != v.size() * sizeof(float) || f.peek() != std::char_traits<char>::eof()) {
    return Error(path.string() + ": expected " + std::to_string(rows) + " x " + std::to_string(vocab) +
                 " little-endian f32 values (" + std::to_string(v.size() * sizeof(float)) + " bytes)");
  }
  return v;
}

std::vector<int32_t> ints(const json::value& v) {
  std::vector<int32_t> out;
  for (const json::value& x : v.as_array()) out.push_back(static_cast<int32_t>(x.to_number<int64_t>()));
  return out;
}

std::vector<std::vector<uint32_t>> rows_of(const json::value& v) {
  std::vector<std::vector<uint32_t>> out;
  for (const json::value& row : v.as_array()) {
    out.emplace_back();
    for (const json::value& x : row.as_array()) out.back().push_back(static_cast<uint32_t>(x.to_number<int64_t>()));
  }
  return out;
}

}  // namespace

Expected<ReferenceCase> ReferenceCase::load(const std::filesystem::path& path) {
  const bool is_dir = std::filesystem::is_directory(path);
  const std::filesystem::path rj = is_dir ? path / "reference.json" : path;
  const std::filesystem::path dir = rj.parent_path();
  std::ifstream f(rj);
  if (!f) return Error(ErrorCode::io, rj.string() + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  ReferenceCase c;
  try {
    const json::value doc = json::parse(ss.str());
    const json::object& o = doc.as_object();
    c.name = o.contains("name") ? std::string(o.at("name").as_string())
                                  : (is_dir ? path.filename() : rj.stem()).string();
    c.input_ids = ints(o.at("input_ids"));
    c.decode_tokens = ints(o.at("decode_tokens"));
    c.vocab = static_cast<uint32_t>(o.at("vocab_size").to_number<int64_t>());
    if (c.input_ids.empty()) return Error(rj.string() + ": input_ids is empty");
    if (o.contains("dsa")) {
      const json::object& dsa = o.at("dsa").as_object();
      c.kpool = static_cast<uint32_t>(dsa.at("kpool").to_number<int64_t>());
      for (const auto& [layer, sel] : dsa.at("layers").as_object()) {
        const json::object& s = sel.as_object();
        std::vector<std::vector<uint32_t>> all;
        if (s.contains("positions")) {
          all = rows_of(s.at("positions"));
        } else {
          all = rows_of(s.at("prefill"));
          for (auto& r : rows_of(s.at("decode"))) all.push_back(std::move(r));
        }
        c.selections[std::string(layer)] = std::move(all);
      }
    }
    const size_t V = c.vocab;
    c.has_logits = o.contains("logits_files");
    if (c.has_logits) {
      const json::object& files = o.at("logits_files").as_object();
      auto pre = read_f32(dir / std::string(files.at("prefill").as_string()), c.input_ids.size(), V);
      if (!pre) return pre.error();
      c.prefill = std::move(*pre);
      auto dec = read_f32(dir / std::string(files.at("decode").as_string()), c.decode_tokens.size(), V);
      if (!dec) return dec.error();
      c.decode = std::move(*dec);
    }
    if (o.contains("mtp")) {
      const size_t rows = static_cast<size_t>(o.at("mtp").as_object().at("rows").to_number<int64_t>());
      auto m = read_f32(dir / "mtp_logits.f32", rows, V);
      if (!m) return m.error();
      c.mtp = std::move(*m);
    }
  } catch (const std::exception& e) {
    return Error(rj.string() + ": " + e.what());
  }
  return c;
}

CaseRun run_case(model::Glm5Forward& m, const ReferenceCase& ref, size_t chunk, bool with_mtp, config::KvFormats kv) {
  using clock = std::chrono::steady_clock;
  const model::Glm5Hparams& hp = m.hparams();
  const size_t V = hp.vocab_size, D = hp.hidden_size;
  CaseRun out;
  model::SequenceState state(hp, kv);
  model::SelectionObserver observe = [&](uint32_t layer, size_t, uint32_t pos, std::span<const uint32_t> pools, float) {
    const std::string key = layer >= hp.n_layers ? "mtp" : std::to_string(layer);
    auto& rows = out.selections[key];
    if (rows.size() <= pos) rows.resize(pos + 1);
    rows[pos].assign(pools.begin(), pools.end());
  };
  model::ForwardOptions opt;
  opt.selections = &observe;

  std::vector<float> hidden, all_hidden;
  const size_t P = ref.input_ids.size();
  if (chunk == 0) chunk = P;
  out.prefill.resize(P * V);
  auto t0 = clock::now();
  for (size_t at = 0; at < P; at += chunk) {
    const size_t n = std::min(chunk, P - at);
    const model::ForwardRows rows{&state, std::span<const int32_t>(ref.input_ids.data() + at, n)};
    m.forward(std::span<const model::ForwardRows>(&rows, 1), hidden, opt);
    m.logits(hidden.data(), n, out.prefill.data() + at * V);
    all_hidden.insert(all_hidden.end(), hidden.begin(), hidden.end());
  }
  auto t1 = clock::now();
  out.decode.resize(ref.decode_tokens.size() * V);
  for (size_t i = 0; i < ref.decode_tokens.size(); ++i) {
    const model::ForwardRows rows{&state, std::span<const int32_t>(&ref.decode_tokens[i], 1)};
    m.forward(std::span<const model::ForwardRows>(&rows, 1), hidden, opt);
    m.logits(hidden.data(), 1, out.decode.data() + i * V);
    all_hidden.insert(all_hidden.end(), hidden.begin(), hidden.end());
  }
  auto t2 = clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  out.decode_seconds = std::chrono::duration<double>(t2 - t1).count();

  if (with_mtp && m.has_mtp() && ref.input_ids.size() + ref.decode_tokens.size() > 1) {
    // Row t: the trunk's hidden state at t and the token at t+1; fed in the same chunks as the prompt.
    std::vector<int32_t> ids(ref.input_ids);
    ids.insert(ids.end(), ref.decode_tokens.begin(), ref.decode_tokens.end());
    const size_t rows = ids.size() - 1;
    out.mtp.resize(rows * V);
    for (size_t at = 0; at < rows; at += chunk) {
      const size_t n = std::min(chunk, rows - at);
      m.mtp_forward(state, all_hidden.data() + at * D, std::span<const int32_t>(ids.data() + at + 1, n), hidden, opt);
      m.mtp_logits(hidden.data(), n, out.mtp.data() + at * V);
    }
  }
  return out;
}

Expected<CaseRun> run_case_pipeline(model::Pipeline& b, const ReferenceCase& ref, size_t chunk,
                                    const std::function<void()>& after_step) {
  using clock = std::chrono::steady_clock;
  CaseRun out;
  const size_t P = ref.input_ids.size();
  if (chunk == 0) chunk = P;
  if (auto e = b.reset_slot(0)) return *e;
  auto t0 = clock::now();
  for (size_t at = 0; at < P; at += chunk) {
    const size_t n = std::min(chunk, P - at);
    model::SlotRows r;
    r.start = static_cast<uint32_t>(at);
    r.tokens.assign(ref.input_ids.begin() + static_cast<ptrdiff_t>(at), ref.input_ids.begin() + static_cast<ptrdiff_t>(at + n));
    r.logits_all = true;
    r.sample = false;
    auto res = b.step({r});
    if (after_step) after_step();
    if (!res) return res.error();
    out.prefill.insert(out.prefill.end(), (*res)[0].logits.begin(), (*res)[0].logits.end());
  }
  auto t1 = clock::now();
  for (size_t i = 0; i < ref.decode_tokens.size(); ++i) {
    model::SlotRows r;
    r.start = static_cast<uint32_t>(P + i);
    r.tokens = {ref.decode_tokens[i]};
    r.sample = false;
    auto res = b.step({r});
    if (after_step) after_step();
    if (!res) return res.error();
    out.decode.insert(out.decode.end(), (*res)[0].logits.begin(), (*res)[0].logits.end());
  }
  auto t2 = clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  out.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return out;
}

}  // namespace ferry::cli
