"""Names shared by the cpu backend's modules."""

BACKEND = "cpu"
