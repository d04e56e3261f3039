"""Attention contracts (FlashMLA names): MLA decode over a paged cache and its extensions, prefill."""
