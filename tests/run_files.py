"""Reading a run folder in tests: the one JSONL reader and the run folder's files.

The tests read the files as plain JSON (not through ``otel_tunix.analysis``), so what they
check is what a user's own tools would see.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(
    path: Path, *, missing_ok: bool = False, whole: bool = False
) -> list[dict[str, Any]]:
    """The records of a JSONL file, blank lines skipped.

    Args:
        path: the file.
        missing_ok: a file that does not exist reads as no records.
        whole: assert that the file ends in a newline (no torn last line) and read only
            whole lines.
    """
    if missing_ok and not path.exists():
        return []
    text = path.read_text()
    if whole:
        assert not text or text.endswith("\n"), f"{path.name} ends in a torn line"
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class RunFolder:
    """A run folder's files: ``spans.jsonl``, ``metrics.jsonl``, ``summary.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self) -> list[dict[str, Any]]:
        """Every line of ``spans.jsonl``."""
        return read_jsonl(self.path / "spans.jsonl")

    def steps(self) -> list[dict[str, Any]]:
        """The step lines of ``spans.jsonl``."""
        return [r for r in self.records() if r.get("type") == "step"]

    def metrics(self) -> list[dict[str, Any]]:
        """Every line of ``metrics.jsonl``."""
        return read_jsonl(self.path / "metrics.jsonl")

    def summary(self) -> dict[str, Any]:
        """``summary.json``."""
        data: dict[str, Any] = json.loads((self.path / "summary.json").read_text())
        return data
