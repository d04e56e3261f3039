"""The machinery every op shares: contracts, the registry and dispatch, providers, tensors and
Formats, prepare_inputs and conversions, errors, argument checks, the oracle, numerics, the native
build helpers. Nothing here names an op family or a backend."""
