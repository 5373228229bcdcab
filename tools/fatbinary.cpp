// `fatbinary` for clang's CUDA driver in the Volta build (tools/build_volta.sh): the CUDA 12 wheels on
// PyPI ship ptxas but not NVIDIA's fatbinary tool, which clang runs to pack each file's cubin and PTX
// into the fat binary the CUDA runtime loads. This does the same packing with NVIDIA's own library for
// it, libnvfatbin (the nvidia-nvfatbin-cu12 wheel), and accepts the command line clang 19 passes:
//   fatbinary [--cuda] -64 [-g] --create OUT --image=profile=sm_NN,file=CUBIN --image=profile=compute_NN,file=PTX
#include <nvFatbin.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Image {
  bool ptx = false;
  std::string arch;  // the NN of sm_NN / compute_NN
  std::string file;
};

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void check(nvFatbinResult r, const std::string& what) {
  if (r != NVFATBIN_SUCCESS) throw std::runtime_error(what + ": " + nvFatbinGetErrorString(r));
}

// "profile=sm_70,file=/tmp/x.o" or "profile=compute_70,file=/tmp/x.s".
Image parse_image(const std::string& spec) {
  const std::string profile = "profile=", file = ",file=";
  const size_t comma = spec.find(file);
  if (spec.rfind(profile, 0) != 0 || comma == std::string::npos) {
    throw std::runtime_error("--image=" + spec + ": expected profile=sm_NN|compute_NN,file=PATH");
  }
  const std::string p = spec.substr(profile.size(), comma - profile.size());
  Image im;
  im.file = spec.substr(comma + file.size());
  if (p.rfind("sm_", 0) == 0) {
    im.arch = p.substr(3);
  } else if (p.rfind("compute_", 0) == 0) {
    im.ptx = true;
    im.arch = p.substr(8);
  }
  if (im.arch.empty() || im.arch.find_first_not_of("0123456789") != std::string::npos) {
    throw std::runtime_error("--image=" + spec + ": profile '" + p + "' is not sm_NN or compute_NN");
  }
  return im;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> options;  // libnvfatbin spells them with one dash
    std::vector<Image> images;
    std::string out;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--cuda" || a == "-cuda") {
        options.push_back("-cuda");
      } else if (a == "-64" || a == "-g") {
        options.push_back(a);
      } else if (a == "--create" && i + 1 < argc) {
        out = argv[++i];
      } else if (a.rfind("--image=", 0) == 0) {
        images.push_back(parse_image(a.substr(8)));
      } else {
        throw std::runtime_error("unsupported argument '" + a + "' (this fatbinary takes what clang passes)");
      }
    }
    if (out.empty() || images.empty()) throw std::runtime_error("usage: fatbinary -64 --create OUT --image=... ...");

    std::vector<const char*> opts;
    for (const std::string& o : options) opts.push_back(o.c_str());
    nvFatbinHandle h = nullptr;
    check(nvFatbinCreate(&h, opts.data(), opts.size()), "nvFatbinCreate");
    for (const Image& im : images) {
      std::vector<char> code = read_file(im.file);
      if (im.ptx) {
        code.push_back('\0');
        check(nvFatbinAddPTX(h, code.data(), code.size(), im.arch.c_str(), im.file.c_str(), ""),
              "adding PTX " + im.file);
      } else {
        check(nvFatbinAddCubin(h, code.data(), code.size(), im.arch.c_str(), im.file.c_str()), "adding cubin " + im.file);
      }
    }
    size_t size = 0;
    check(nvFatbinSize(h, &size), "nvFatbinSize");
    std::vector<char> fatbin(size);
    check(nvFatbinGet(h, fatbin.data()), "nvFatbinGet");
    nvFatbinDestroy(&h);
    std::ofstream o(out, std::ios::binary);
    if (!o.write(fatbin.data(), static_cast<std::streamsize>(fatbin.size()))) throw std::runtime_error("cannot write " + out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fatbinary: %s\n", e.what());
    return 1;
  }
}
