"""Names shared by the cpu backend's modules."""

BACKEND = "cpu"
#: provider name of every C++ kernel of the cpu backend (priority above "reference")
NATIVE = "native"
