// layout_checks.cpp — native checks of layout values on CPU tensors, for the contracts' argument
// checks (their torch forms stay the definition and write the error messages).
#include "pk_native.h"

// m_indices int32 [n] against the contiguous layout of its own counts for `align` rows: groups
// ascending, each group's rows one run starting at a multiple of align, -1 up to the next multiple,
// then only -1 (ops/gemm/grouped.py). Returns -1 when it is that layout, else the first row where it
// is not (n when its last segment needs more rows than there are).
PK_EXPORT int64_t pk_check_m_indices(const int32_t* m, int64_t n, int64_t groups, int64_t align) {
  int64_t pos = 0, prev = -1;
  while (pos < n) {
    const int64_t g = m[pos];
    if (g == -1) {  // the trailing padding
      for (int64_t r = pos; r < n; ++r)
        if (m[r] != -1) return r;
      return -1;
    }
    if (g < 0 || g >= groups || g <= prev || pos % align != 0) return pos;
    int64_t end = pos;
    while (end < n && m[end] == g) ++end;
    const int64_t next = (end + align - 1) / align * align;
    for (int64_t r = end; r < std::min(next, n); ++r)
      if (m[r] != -1) return r;
    if (next > n) return n;
    prev = g;
    pos = next;
  }
  return -1;
}
