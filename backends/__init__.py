"""Backend plugins. Each subpackage is one hardware family; no backend imports another."""
