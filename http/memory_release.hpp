#pragma once
// Gives the memory of a large request back to the system once it is freed. glibc's malloc serves a
// big block from mmap only until the first one is freed; after that it raises its mmap threshold and
// keeps such blocks in the arenas of the threads that freed them, so a burst of 16 MB bodies left
// ~250 MB resident for good. Trimming after a request that was large (and only then: a trim walks
// every arena) returns the free pages.
#include <cstddef>

namespace ferry::http {

// Bodies from this size on are released after use.
inline constexpr size_t kLargeBodyBytes = size_t{1} << 20;

// Returns free heap pages to the system (malloc_trim); a no-op where the C library has none.
void release_free_memory();

}  // namespace ferry::http
