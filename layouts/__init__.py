"""Per-chip byte formats as pure encode/decode pairs on torch tensors (imports torch only)."""
