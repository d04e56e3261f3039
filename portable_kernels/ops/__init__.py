"""The op families, one module or package each, named by meaning: gemm/, quant/, attention/, topk,
swiglu, moe_routing/, ep/. Each holds its contracts (argument roles, checks, reference math,
tolerance) and the public functions; none imports a backend."""
