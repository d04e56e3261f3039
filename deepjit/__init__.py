"""deepjit: runtime compilation, content-hash build cache and loading (standalone)."""
