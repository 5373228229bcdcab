// ferry_quant_probe: lets the Python tests drive model/formats/quant.hpp on raw files.
//   ferry_quant_probe dequant TYPE IN OUT   IN: whole blocks of TYPE; OUT: little-endian f32
//   ferry_quant_probe quant TYPE IN OUT [W] IN: little-endian f32 (whole blocks); OUT: blocks of TYPE;
//                                           W: f32 importance weights, as many as IN (IQ types)
// TYPE is a ggml type name (q4_K, iq3_s, bf16, ...). Exit status 2 with a message on bad input.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/formats/ggml_type.hpp"
#include "model/formats/quant.hpp"

using namespace ferry::model;

namespace {

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) throw std::runtime_error("cannot write " + path);
}

int run(const std::string& mode, const std::string& type_name, const std::string& in_path,
        const std::string& out_path, const std::string& weights_path) {
  const auto type = ggml_type_from_name(type_name);
  if (!type) throw std::runtime_error("unknown ggml type '" + type_name + "'");
  const auto traits = ggml_type_traits(*type);
  const std::vector<char> in = read_all(in_path);
  if (mode == "dequant") {
    if (!can_dequantize(*type)) throw std::runtime_error("cannot dequantize " + type_name);
    if (in.size() % traits.block_bytes != 0) {
      throw std::runtime_error(in_path + ": " + std::to_string(in.size()) + " bytes is not a whole number of " +
                               type_name + " blocks of " + std::to_string(traits.block_bytes) + " bytes");
    }
    std::vector<float> out(in.size() / traits.block_bytes * traits.block_elems);
    dequantize_row(*type, in.data(), out.data(), out.size());
    write_all(out_path, out.data(), out.size() * sizeof(float));
    return 0;
  }
  if (mode == "quant") {
    if (!can_quantize(*type)) throw std::runtime_error("cannot quantize to " + type_name);
    const size_t n = in.size() / sizeof(float);
    const auto bytes = ggml_bytes(*type, n);
    if (in.size() % sizeof(float) != 0 || !bytes) {
      throw std::runtime_error(in_path + ": " + std::to_string(in.size()) + " bytes is not a whole number of " +
                               type_name + " blocks of " + std::to_string(traits.block_elems) + " f32 values");
    }
    std::vector<float> values(n);
    std::memcpy(values.data(), in.data(), in.size());
    std::vector<float> weights;
    if (!weights_path.empty()) {
      const std::vector<char> w = read_all(weights_path);
      if (w.size() != in.size()) throw std::runtime_error(weights_path + ": expected as many f32 weights as values");
      weights.resize(n);
      std::memcpy(weights.data(), w.data(), w.size());
    }
    std::vector<unsigned char> out(*bytes);
    quantize_row(*type, values.data(), out.data(), n, weights.empty() ? nullptr : weights.data());
    write_all(out_path, out.data(), out.size());
    return 0;
  }
  throw std::runtime_error("unknown mode '" + mode + "' (expected dequant or quant)");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s dequant|quant TYPE IN OUT [WEIGHTS]\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1], argv[2], argv[3], argv[4], argc == 6 ? argv[5] : "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry_quant_probe: %s\n", e.what());
    return 2;
  }
}
