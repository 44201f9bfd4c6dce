"""How a run ends: at exit, whatever came before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_a_second_run_ended_by_atexit_keeps_its_steps(tmp_path):
    # atexit runs the last registered first; the SDK registers each new provider's shutdown
    # as it is made, so otel-tunix's own must be registered again after them.
    program = textwrap.dedent(
        """
        import sys
        import otel_tunix
        otel_tunix.configure(output_dir=sys.argv[1] + "/a", system_metrics=False)
        otel_tunix.configure(output_dir=sys.argv[1] + "/b", system_metrics=False)
        for n in range(3):
            with otel_tunix.step(n):
                with otel_tunix.component("work"):
                    pass
        """
    )
    subprocess.run([sys.executable, "-c", program, str(tmp_path)], check=True, timeout=120)
    lines = [json.loads(x) for x in (tmp_path / "b" / "spans.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["type"] == "step"] == [0, 1, 2]
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["scopes"][0]["steps"] == 3
