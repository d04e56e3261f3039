// selftest_main.cpp — runs every family's self-test; exit status 0 when every check passed.
#include "selftest.h"

#if defined(__aarch64__)
static const char* kTarget = "aarch64";
#elif defined(__x86_64__)
static const char* kTarget = "x86_64";
#else
static const char* kTarget = "other";
#endif

#if defined(__AVX512F__)
static const char* kVector = "avx512";
#elif defined(__AVX2__)
static const char* kVector = "avx2";
#elif defined(__ARM_NEON)
static const char* kVector = "neon";
#else
static const char* kVector = "generic";
#endif

int main() {
  std::printf("portable_kernels cpu kernel self-test: %s, %s build\n", kTarget, kVector);
  const int failures = selftest_mla() + selftest_gemm() + selftest_casts() + selftest_topk() + selftest_routing() +
                       selftest_mhc();
  std::printf("%s: %d failed\n", failures ? "FAILED" : "all ok", failures);
  return failures ? 1 : 0;
}
