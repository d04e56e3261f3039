// Layout encoders of the nvidia backend, in CUDA C++ (built by deepjit with nvcc, sm_90a / sm_100a).
//
// They write the bytes of portable_kernels.layouts' sm90_sfa_encode and
// sm100_ue8m0_encode_from_blocks on the GPU, one pass each, for prepare_inputs at ingest:
//   pk_sm90_sfa_encode:  fp32 scales [G, MN, KB] (any strides) -> fp32 storage [G, KB, TMA]
//                        (MN-major, TMA-aligned; pad rows MN..TMA written 0).
//   pk_sm100_pack:       fp32 block scales [G, ceil(MN/block_mn), KB] (any strides, powers of two)
//                        -> int32 storage [G, W, TMA], W = ceil(KB/4): word (p, n) holds the exponent
//                        bytes of K-blocks 4p..4p+3 of block row n / block_mn, little-endian; pad
//                        rows and missing blocks 0. A scale that is not a positive normal power of
//                        two sets *bad (the caller refuses the result).
// One thread per output element; rows (n) are the fastest index, so stores are coalesced.

extern "C" __global__ void pk_sm90_sfa_encode(const float* __restrict__ sf, float* __restrict__ out,
                                              int groups, int mn, int kb, int tma,
                                              long long in_stride_g, long long in_stride_mn,
                                              long long in_stride_k) {
    const long long total = (long long)groups * kb * tma;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int n = (int)(i % tma);
        const long long gk = i / tma;
        const int k = (int)(gk % kb);
        const int g = (int)(gk / kb);
        out[i] = n < mn ? sf[g * in_stride_g + n * in_stride_mn + k * in_stride_k] : 0.0f;
    }
}

__device__ __forceinline__ unsigned int pk_exponent(float s, int* bad) {
    const unsigned int bits = __float_as_uint(s);
    const unsigned int e = bits >> 23;  // includes the sign bit: negatives give e > 255
    if ((bits & 0x007FFFFFu) != 0u || e < 1u || e > 254u) {
        atomicOr(bad, 1);
        return 0u;
    }
    return e;
}

extern "C" __global__ void pk_sm100_pack(const float* __restrict__ sf, int* __restrict__ out, int* bad,
                                         int groups, int mn, int kb, int words, int tma, int block_mn,
                                         long long in_stride_g, long long in_stride_row, long long in_stride_k) {
    const long long total = (long long)groups * words * tma;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int n = (int)(i % tma);
        const long long gp = i / tma;
        const int p = (int)(gp % words);
        const int g = (int)(gp / words);
        unsigned int word = 0u;
        if (n < mn) {
            const float* row = sf + g * in_stride_g + (long long)(n / block_mn) * in_stride_row;
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int k = 4 * p + j;
                if (k < kb) word |= pk_exponent(row[k * in_stride_k], bad) << (8 * j);
            }
        }
        out[i] = (int)word;
    }
}
