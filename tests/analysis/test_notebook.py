"""``notebooks/metrics_viewer.ipynb`` runs top to bottom (nbclient) on a real run folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "metrics_viewer.ipynb"


def test_notebook_runs_top_to_bottom(known_run: Path, tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    out = tmp_path / "figures" / "metrics.png"
    params.source = (
        f"RUNS = [{str(known_run)!r}]\nMETRICS = None\nSMOOTH = 3\nX_KEY = 'step'\n"
        f"OUT = {str(out)!r}\n"
    )
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    text = "\n".join(
        o.get("text", "") if o.output_type == "stream" else str(o.get("data", {}).get("text/plain"))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
    assert "known-sleeps: " in text and "metrics: loss, learning_rate" in text
    assert "plotting: ['loss', 'eval/loss', 'learning_rate', 'perf/train/step_time_sec']" in text
    assert f"saved {out}" in text
    assert "Goodput" in text and "productive" in text
    images = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs
        if "image/png" in o.get("data", {})
    ]  # fmt: skip
    assert images  # the figure was displayed inline
    with Image.open(out) as img:
        assert img.size[0] >= 300 and np.asarray(img.convert("L")).std() > 5
