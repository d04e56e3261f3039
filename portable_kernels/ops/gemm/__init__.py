"""GEMM contracts (DeepGEMM names): dense nt, the transposed nn/tn/tt, m-grouped contiguous/masked,
FP8xFP4, k-grouped, and the hyper-connection prenorm GEMM (hc_prenorm)."""
