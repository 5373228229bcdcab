#include "model/glm5/glm5_convert.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "model/formats/half.hpp"
#include "model/glm5/hf_checkpoint.hpp"

namespace ferry::model {
namespace {

Glm5TensorSpec spec(std::string name, std::vector<uint64_t> dims, bool keep_f32 = false) {
  Glm5TensorSpec s;
  s.name = std::move(name);
  s.dims = std::move(dims);
  s.keep_f32 = keep_f32;
  return s;
}

Glm5TypePolicy policy(GgmlType type, std::optional<GgmlType> output_type = std::nullopt) {
  Glm5TypePolicy p;
  p.type = type;
  p.output_type = output_type;
  return p;
}

Glm5TypePolicy keep_all(GgmlType type) {
  Glm5TypePolicy p = policy(type);
  p.keep_f32.emplace(".");
  return p;
}

TEST(Glm5Convert, TypeFallsBackWhenRowsAreNotWholeBlocks) {
  std::string why;
  EXPECT_EQ(glm5_tensor_type(spec("blk.0.attn_norm.weight", {4096}, true), policy(GgmlType::Q4_K), &why), GgmlType::F32);
  EXPECT_EQ(why, "");
  EXPECT_EQ(glm5_tensor_type(spec("blk.0.attn_q.weight", {4096, 8192}), keep_all(GgmlType::Q4_K)), GgmlType::F32);
  EXPECT_EQ(glm5_tensor_type(spec("blk.0.attn_q.weight", {4096, 8192}), policy(GgmlType::Q4_K), &why), GgmlType::Q4_K);
  EXPECT_EQ(glm5_tensor_type(spec("blk.0.ssm_f_b.weight", {128, 8192}), policy(GgmlType::Q5_K), &why), GgmlType::Q8_0);
  EXPECT_EQ(why, "blk.0.ssm_f_b.weight: rows of 128 are not a whole number of q5_K blocks (256): stored as q8_0");
  EXPECT_EQ(glm5_tensor_type(spec("blk.0.ssm_f_b.weight", {128, 8192}), policy(GgmlType::IQ3_S), &why), GgmlType::Q8_0);
  EXPECT_EQ(glm5_tensor_type(spec("x", {16, 4}), policy(GgmlType::Q6_K), &why), GgmlType::F16);
  EXPECT_EQ(glm5_tensor_type(spec("x", {16, 4}), policy(GgmlType::Q8_0), &why), GgmlType::F16);
  EXPECT_EQ(glm5_tensor_type(spec("x", {16, 4}), policy(GgmlType::BF16), &why), GgmlType::BF16);
}

TEST(Glm5Convert, OutputHeadIsQ6KInFilesOfFourAndFiveBitTypes) {
  Glm5TensorSpec head = spec("output.weight", {4096, 154880});
  head.role = Glm5Tensor::output;
  std::string why;
  EXPECT_EQ(glm5_tensor_type(head, policy(GgmlType::Q4_K), &why), GgmlType::Q6_K);
  EXPECT_EQ(why, "output.weight: the output head is stored as q6_K in a q4_K file");
  for (GgmlType t : {GgmlType::Q5_K, GgmlType::IQ4_XS, GgmlType::IQ3_S}) {
    EXPECT_EQ(glm5_tensor_type(head, policy(t), &why), GgmlType::Q6_K) << ggml_type_traits(t).name;
  }
  EXPECT_EQ(glm5_tensor_type(head, policy(GgmlType::Q6_K), &why), GgmlType::Q6_K);
  EXPECT_EQ(why, "");
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F16, GgmlType::F32}) {
    EXPECT_EQ(glm5_tensor_type(head, policy(t), &why), t);
    EXPECT_EQ(why, "");
  }
  EXPECT_EQ(glm5_tensor_type(head, keep_all(GgmlType::Q4_K)), GgmlType::F32);  // --keep-f32 wins
  // an untied token embedding keeps the requested type
  Glm5TensorSpec embd = spec("token_embd.weight", {4096, 154880});
  embd.role = Glm5Tensor::token_embd;
  EXPECT_EQ(glm5_tensor_type(embd, policy(GgmlType::Q4_K)), GgmlType::Q4_K);
  // an explicit head type (--output-type) is taken as asked, for the head only
  EXPECT_EQ(glm5_tensor_type(head, policy(GgmlType::Q4_K, GgmlType::Q4_K), &why), GgmlType::Q4_K);
  EXPECT_EQ(why, "");
  EXPECT_EQ(glm5_tensor_type(head, policy(GgmlType::Q8_0, GgmlType::Q6_K), &why), GgmlType::Q6_K);
  EXPECT_EQ(glm5_tensor_type(embd, policy(GgmlType::Q4_K, GgmlType::F32), &why), GgmlType::Q4_K);
  // rows that are not whole Q6_K blocks fall back as any tensor's do
  Glm5TensorSpec narrow = spec("output.weight", {64, 256});
  narrow.role = Glm5Tensor::output;
  EXPECT_EQ(glm5_tensor_type(narrow, policy(GgmlType::Q4_K), &why), GgmlType::Q8_0);
}

TEST(Glm5Convert, TiedEmbeddingIsStoredAtTheHeadsType) {
  // llama.cpp quantizes a tied embedding (no output tensor) with the output head's rules.
  Glm5TensorSpec embd = spec("token_embd.weight", {256, 4096});
  embd.role = Glm5Tensor::token_embd;
  Glm5TypePolicy p = policy(GgmlType::Q4_K);
  p.tied_embedding = true;
  std::string why;
  EXPECT_EQ(glm5_tensor_type(embd, p, &why), GgmlType::Q6_K);
  EXPECT_EQ(why, "token_embd.weight: the tied embedding is the output head too, stored at the head's type q6_K (as "
                 "llama.cpp stores it)");
  p.output_type = GgmlType::Q8_0;
  EXPECT_EQ(glm5_tensor_type(embd, p), GgmlType::Q8_0);
  p.type = GgmlType::Q8_0;
  p.output_type.reset();
  EXPECT_EQ(glm5_tensor_type(embd, p, &why), GgmlType::Q8_0);
  EXPECT_EQ(why, "");
  p.keep_f32.emplace("^output\\.");
  EXPECT_EQ(glm5_tensor_type(embd, p), GgmlType::F32);  // the head is kept f32: so is its tied embedding
  auto rules = Glm5TypeRules::parse({"^token_embd=q5_k"}, "test");
  ASSERT_TRUE(rules);
  p.rules = *rules;
  EXPECT_EQ(glm5_tensor_type(embd, p), GgmlType::Q5_K);  // a rule naming the embedding itself wins
}

TEST(Glm5Convert, TensorTypeRulesFirstMatchWins) {
  auto rules = Glm5TypeRules::parse({"ffn_down_exps=iq4_xs", "_exps=IQ3_S", "output\\.weight=q8_0", "^blk\\.0\\.=f16"}, "--tensor-type");
  ASSERT_TRUE(rules) << rules.error().message;
  Glm5TypePolicy p = policy(GgmlType::Q5_K);
  p.rules = *rules;
  std::string why;
  EXPECT_EQ(glm5_tensor_type(spec("blk.3.ffn_down_exps.weight", {2048, 4096, 288}), p, &why), GgmlType::IQ4_XS);
  EXPECT_EQ(why, "");
  EXPECT_EQ(glm5_tensor_type(spec("blk.3.ffn_up_exps.weight", {4096, 2048, 288}), p), GgmlType::IQ3_S);
  EXPECT_EQ(glm5_tensor_type(spec("blk.0.attn_q.weight", {4096, 8192}), p), GgmlType::F16);
  EXPECT_EQ(glm5_tensor_type(spec("blk.1.attn_q.weight", {4096, 8192}), p), GgmlType::Q5_K);
  Glm5TensorSpec head = spec("output.weight", {4096, 154880});
  head.role = Glm5Tensor::output;
  EXPECT_EQ(glm5_tensor_type(head, p, &why), GgmlType::Q8_0);
  EXPECT_EQ(why, "");
  // a rule cannot move the catalogue's small state off f32; rows that do not fit still fall back
  EXPECT_EQ(glm5_tensor_type(spec("blk.0.attn_norm.weight", {4096}, true), p), GgmlType::F32);
  EXPECT_EQ(glm5_tensor_type(spec("blk.3.ffn_down_exps.weight", {96, 4096, 8}), p, &why), GgmlType::Q8_0);
  EXPECT_EQ(why, "blk.3.ffn_down_exps.weight: rows of 96 are not a whole number of iq4_xs blocks (256): stored as q8_0");
}

TEST(Glm5Convert, TypeRulesAndRecipesNameWhatIsWrong) {
  auto error = [](std::vector<std::string> specs) {
    auto r = Glm5TypeRules::parse(specs, "--tensor-type");
    return r ? std::string("(accepted)") : r.error().message;
  };
  EXPECT_EQ(error({"attn_q"}), "--tensor-type: 'attn_q' is not REGEX=TYPE (e.g. 'ffn_down_exps=q5_k')");
  EXPECT_EQ(error({"=q4_k"}), "--tensor-type: '=q4_k' has an empty regular expression");
  EXPECT_EQ(error({"attn_q=q3_k"}), "--tensor-type: 'attn_q=q3_k' names type 'q3_k', expected one of f32, f16, bf16, "
                                    "q8_0, q4_K, q5_K, q6_K, iq4_xs, iq3_s");
  EXPECT_NE(error({"attn_(q=q4_k"}).find("--tensor-type: 'attn_(q' is not a valid regular expression"), std::string::npos);
  // (?=...) holds an '=': the rule splits at the last one
  auto lookahead = Glm5TypeRules::parse({"attn_(?=q)=q8_0"}, "x");
  ASSERT_TRUE(lookahead) << lookahead.error().message;
  EXPECT_EQ(lookahead->rules()[0].pattern, "attn_(?=q)");
  auto recipe = Glm5TypeRules::parse_recipe("# a comment\n\n  ffn_down_exps = q5_k  \n\t# indented comment\r\n"
                                            "_exps=iq3_s\r\n", "r.recipe");
  ASSERT_TRUE(recipe) << recipe.error().message;
  ASSERT_EQ(recipe->rules().size(), 2u);
  EXPECT_EQ(recipe->rules()[0].pattern, "ffn_down_exps");
  EXPECT_EQ(recipe->rules()[0].type, GgmlType::Q5_K);
  EXPECT_EQ(recipe->rules()[1].origin, "r.recipe:5");
  auto bad = Glm5TypeRules::parse_recipe("a=q8_0\nb\n", "r.recipe");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "r.recipe:2: 'b' is not REGEX=TYPE (e.g. 'ffn_down_exps=q5_k')");
  auto missing = Glm5TypeRules::load_recipe("/nonexistent/x.recipe");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().message, "--recipe /nonexistent/x.recipe: cannot open");
}

TEST(Glm5Convert, FileTypes) {
  EXPECT_EQ(glm5_file_type(GgmlType::F32), 0u);
  EXPECT_EQ(glm5_file_type(GgmlType::F16), 1u);
  EXPECT_EQ(glm5_file_type(GgmlType::Q8_0), 7u);
  EXPECT_EQ(glm5_file_type(GgmlType::Q4_K), 14u);
  EXPECT_EQ(glm5_file_type(GgmlType::Q5_K), 16u);
  EXPECT_EQ(glm5_file_type(GgmlType::Q6_K), 18u);
  EXPECT_EQ(glm5_file_type(GgmlType::BF16), 32u);
  EXPECT_EQ(glm5_file_type(GgmlType::IQ3_S), 26u);
  EXPECT_EQ(glm5_file_type(GgmlType::IQ4_XS), 30u);
}

SafetensorsTensor tensor(std::string name, SafetensorsDtype dtype, std::vector<uint64_t> shape, const uint8_t* data,
                         size_t n_bytes) {
  SafetensorsTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.n_elements = 1;
  for (uint64_t d : shape) t.n_elements *= d;
  t.shape = std::move(shape);
  t.n_bytes = n_bytes;
  t.data = {data, n_bytes};
  return t;
}

TEST(HfCheckpointRead, Fp8BlocksIncludingPartialOnes) {
  // A 3 x 5 e4m3 weight in 2 x 2 blocks: scales 2 x 3, the last row and column blocks partial.
  std::vector<uint8_t> w(15);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(0x30 + i * 3 + (i % 2 ? 0x80 : 0));
  const std::vector<float> s = {0.5f, 2.0f, -1.0f, 4.0f, 0.25f, 8.0f};
  const SafetensorsTensor weight = tensor("w.weight", SafetensorsDtype::F8_E4M3, {3, 5}, w.data(), w.size());
  const SafetensorsTensor scale =
      tensor("w.weight_scale_inv", SafetensorsDtype::F32, {2, 3}, reinterpret_cast<const uint8_t*>(s.data()), 24);
  const HfFp8Scale fs{&scale, 3, 5, 2, 2};
  std::vector<float> all(15);
  hf_read_f32(weight, 0, 15, all.data(), &fs);
  for (uint64_t r = 0; r < 3; ++r) {
    for (uint64_t c = 0; c < 5; ++c) {
      EXPECT_EQ(all[r * 5 + c], fp8_e4m3_to_f32(w[r * 5 + c]) * s[(r / 2) * 3 + c / 2]) << r << "," << c;
    }
  }
  std::vector<float> part(6);
  hf_read_f32(weight, 7, 6, part.data(), &fs);  // starts mid-row, crosses a row and a block
  for (int i = 0; i < 6; ++i) EXPECT_EQ(part[i], all[7 + i]);
}

TEST(HfCheckpointRead, HalfFormats) {
  const std::vector<uint16_t> h = {f32_to_fp16(1.5f), f32_to_fp16(-0.25f)};
  const std::vector<uint16_t> b = {f32_to_bf16(3.0f), f32_to_bf16(-1e-3f)};
  const SafetensorsTensor th = tensor("h", SafetensorsDtype::F16, {2}, reinterpret_cast<const uint8_t*>(h.data()), 4);
  const SafetensorsTensor tb = tensor("b", SafetensorsDtype::BF16, {2}, reinterpret_cast<const uint8_t*>(b.data()), 4);
  float out[2];
  hf_read_f32(th, 0, 2, out);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -0.25f);
  hf_read_f32(tb, 1, 1, out);
  EXPECT_EQ(out[0], bf16_to_f32(b[1]));
}

class HfCheckpointOpen : public ::testing::Test {
 protected:
  std::filesystem::path dir_ =
      std::filesystem::temp_directory_path() / ("hf_checkpoint_test_" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write(const std::string& file, const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
    std::ofstream f(dir_ / file, std::ios::binary);
    const uint64_t len = claimed_len ? claimed_len : header.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << header << std::string(data_bytes, '\0');
  }
  std::string error() {
    auto r = HfCheckpoint::open(dir_);
    return r ? std::string("(opened)") : r.error().message;
  }
};

TEST_F(HfCheckpointOpen, ReadsTheIndexedShardsAndExtraFiles) {
  write("a.safetensors", R"({"x": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}})", 12);
  write("b.safetensors", R"({"y": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, "__metadata__": {}})", 4);
  write("mtp.safetensors",
        R"({"z": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}, "x": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
        12);
  std::ofstream(dir_ / "model.safetensors.index.json") << R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})";
  auto r = HfCheckpoint::open(dir_);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_NE(r->find("x"), nullptr);
  EXPECT_EQ(r->find("x")->dtype, SafetensorsDtype::BF16);  // the index's tensor wins over the extra file's
  EXPECT_EQ(r->find("x")->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(r->find("y")->n_elements, 1u);
  ASSERT_NE(r->find("z"), nullptr);
  EXPECT_FALSE(hf_readable(r->find("z")->dtype));
  EXPECT_EQ(r->tensors().size(), 3u);
}

TEST_F(HfCheckpointOpen, Errors) {
  EXPECT_NE(error().find("no model.safetensors, model.safetensors.index.json or other *.safetensors file"),
            std::string::npos);
  EXPECT_NE(HfCheckpoint::open(dir_ / "nope").error().message.find("not a directory"), std::string::npos);
  write("one.safetensors", R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 16);
  write("two.safetensors", R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 16);
  EXPECT_NE(error().find("two.safetensors: tensor x is also in another *.safetensors file"), std::string::npos)
      << error();
  std::filesystem::remove(dir_ / "two.safetensors");
  ASSERT_TRUE(HfCheckpoint::open(dir_));
  write("model.safetensors", R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  EXPECT_NE(error().find("model.safetensors"), std::string::npos) << error();  // the reader names the file
}

}  // namespace
}  // namespace ferry::model
