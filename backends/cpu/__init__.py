"""CPU backend: the embedded default and the reference."""
def register(registry):
    pass
