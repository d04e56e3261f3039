"""Names shared by the native providers."""

#: provider name of every C++ kernel of the cpu backend (priority above "reference")
NATIVE = "native"
