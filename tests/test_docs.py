"""The docs' Python snippets run as written (each file's blocks in order, in one namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", ["architecture.md", "adding-a-backend.md"])
def test_doc_snippets_run(name):
    text = (DOCS / name).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"{name} has no python snippets"
    namespace = {"__name__": f"docs_{name}"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{name} block {i}", "exec"), namespace)
