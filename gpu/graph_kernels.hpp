#pragma once
// What a captured graph launches, in order (issue 15: decode's launches a token): its kernel nodes'
// names in a topological order of the graph (the capture's stream order, where the graph is a chain),
// "(memset)", "(memcpy)" or "(node)" for other nodes.
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace ferry::gpu {

std::vector<std::string> graph_kernel_names(cudaGraph_t graph);

// Every edge of a graph, and whether it is a programmatic (PDL) one (never before CUDA 12.3, whose
// edges have no data).
struct GraphEdge {
  cudaGraphNode_t from, to;
  bool programmatic;
};
std::vector<GraphEdge> graph_edges(cudaGraph_t graph);
// A kernel's name without its namespaces, return type and parameters: "int16_kernel<5, 1>".
std::string short_kernel_name(const char* mangled);

}  // namespace ferry::gpu
