#include "gpu/graph_kernels.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <utility>

#include "gpu/cuda_check.hpp"

namespace ferry::gpu {
namespace {

void erase_all(std::string& s, const std::string& what) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at)) s.erase(at, what.size());
}

std::string node_name(cudaGraphNode_t node) {
  cudaGraphNodeType type{};
  FERRY_CUDA(cudaGraphNodeGetType(node, &type));
  if (type == cudaGraphNodeTypeMemset) return "(memset)";
  if (type == cudaGraphNodeTypeMemcpy) return "(memcpy)";
  if (type != cudaGraphNodeTypeKernel) return "(node)";
  cudaKernelNodeParams p{};
  FERRY_CUDA(cudaGraphKernelNodeGetParams(node, &p));
  const char* name = nullptr;
  if (cudaFuncGetName(&name, p.func) != cudaSuccess || name == nullptr) {
    cudaGetLastError();
    return "(kernel)";
  }
  return short_kernel_name(name);
}

}  // namespace

std::string short_kernel_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  erase_all(s, "(anonymous namespace)::");
  erase_all(s, "ferry::gpu::");
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  // Cut at the parameter list: the first '(' outside template arguments.
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) return s.substr(0, i);
  }
  return s;
}

std::vector<GraphEdge> graph_edges(cudaGraph_t graph) {
  // A query without edge data fails on a graph with programmatic edges; CUDA 13 gave
  // cudaGraphGetEdges the edge data that 12.3 added as cudaGraphGetEdges_v2.
#if CUDART_VERSION >= 13000
  auto get = [&](cudaGraphNode_t* from, cudaGraphNode_t* to, cudaGraphEdgeData* data, size_t* n) {
    return cudaGraphGetEdges(graph, from, to, data, n);
  };
#elif CUDART_VERSION >= 12030
  auto get = [&](cudaGraphNode_t* from, cudaGraphNode_t* to, cudaGraphEdgeData* data, size_t* n) {
    return cudaGraphGetEdges_v2(graph, from, to, data, n);
  };
#else
  auto get = [&](cudaGraphNode_t* from, cudaGraphNode_t* to, void*, size_t* n) {
    return cudaGraphGetEdges(graph, from, to, n);
  };
#endif
  size_t n = 0;
  FERRY_CUDA(get(nullptr, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<GraphEdge> e(n);
#if CUDART_VERSION >= 12030
  std::vector<cudaGraphEdgeData> data(n);
  FERRY_CUDA(get(from.data(), to.data(), data.data(), &n));
  for (size_t i = 0; i < n; ++i) e[i] = {from[i], to[i], data[i].type == cudaGraphDependencyTypeProgrammatic};
#else
  FERRY_CUDA(get(from.data(), to.data(), nullptr, &n));
  for (size_t i = 0; i < n; ++i) e[i] = {from[i], to[i], false};
#endif
  e.resize(n);
  return e;
}

std::vector<std::string> graph_kernel_names(cudaGraph_t graph) {
  size_t n = 0;
  FERRY_CUDA(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  FERRY_CUDA(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::map<cudaGraphNode_t, size_t> index;
  for (size_t i = 0; i < n; ++i) index[nodes[i]] = i;
  std::vector<size_t> preds(n, 0);
  std::vector<std::vector<size_t>> next(n);
  for (const GraphEdge& e : graph_edges(graph)) {
    next[index.at(e.from)].push_back(index.at(e.to));
    ++preds[index.at(e.to)];
  }
  // Kahn's order, the lowest node index first among the ready ones.
  std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> ready;
  for (size_t i = 0; i < n; ++i) {
    if (preds[i] == 0) ready.push(i);
  }
  std::vector<std::string> names;
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    names.push_back(node_name(nodes[i]));
    for (size_t j : next[i]) {
      if (--preds[j] == 0) ready.push(j);
    }
  }
  return names;
}

}  // namespace ferry::gpu
