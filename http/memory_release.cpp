#include "http/memory_release.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ferry::http {

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace ferry::http
