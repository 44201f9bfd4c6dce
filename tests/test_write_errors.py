"""A disk that fills up and frees again: never raised, whole lines, every lost record counted.

The disk is "full" through ``RLIMIT_FSIZE`` in a child process with ``SIGXFSZ`` ignored: a
write past the limit writes what fits and then fails with ``EFBIG``, as a write to a full
disk fails with ``ENOSPC`` (no mount needed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from processes import child_env
from run_files import read_jsonl

PROGRAM = textwrap.dedent(
    """
    import resource, signal, sys, time
    import otel_tunix

    out, limit = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process
    try:  # a streamed Perfetto trace too, with the perfetto extra
        import perfetto
        trace = out + "/trace"
    except ImportError:
        trace = "none"
    perf = otel_tunix.PerformanceMetricsConfig(process_interval_ms=5, perfetto_trace_dir=trace)
    otel_tunix.configure(output_dir=out, system_metrics=False, alerts=False, perf=perf)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    logger = otel_tunix.get_metrics_logger()

    def run(steps):
        for n in steps:
            with otel_tunix.step(n):
                with otel_tunix.component("work"):
                    time.sleep(0.0005)
            logger.log("loss", 1.0, step=n)

    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))  # the disk fills
    run(range(0, 400))
    otel_tunix.force_flush()
    if sys.argv[3] == "frees":
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space comes back
    run(range(400, 500))
    otel_tunix.shutdown()
    print("shutdown returned")
    """
)

# Without a limit the run writes: spans.jsonl a run line, 500 step lines, a session line;
# metrics.jsonl a header, 500 loss records, 500 perf/... records, a session rate record, and
# the goodput records (at steps 100, 200, 300, 400 and at the end).
SPANS_RECORDS = 502
METRICS_RECORDS = 1007


def _run(out: Path, limit: int, space: str, quiet: bool = True) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env["OTEL_TUNIX_QUIET"] = "true" if quiet else "false"
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(out), str(limit), space],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_disk_that_fills_and_frees_loses_only_counted_whole_records(tmp_path):
    out = tmp_path / "run"
    proc = _run(out, 64 * 1024, "frees")
    assert proc.returncode == 0 and "shutdown returned" in proc.stdout, proc.stderr
    assert "Traceback" not in proc.stderr

    summary = json.loads((out / "summary.json").read_text())
    errors = summary["write_errors"]
    spans, metrics = str(out / "spans.jsonl"), str(out / "metrics.jsonl")
    assert errors[spans]["error"] == errors[metrics]["error"] == "File too large"
    for path in (spans, metrics):  # reported once each, in words, naming the file
        assert proc.stderr.count(f"cannot write {path}: File too large") == 1

    lines = read_jsonl(out / "spans.jsonl", whole=True)
    assert len(lines) + errors[spans]["records_lost"] == SPANS_RECORDS
    steps = [x["step"] for x in lines if x["type"] == "step"]
    assert 0 < errors[spans]["records_lost"] < 400
    assert steps[-100:] == list(range(400, 500))  # written again once space came back
    assert [x["type"] for x in lines][-1] == "session"

    logged = read_jsonl(out / "metrics.jsonl", whole=True)
    assert len(logged) + errors[metrics]["records_lost"] == METRICS_RECORDS
    assert [x["step"] for x in logged if "loss" in x.get("metrics", {})][-100:] == list(
        range(400, 500)
    )
    assert summary["scopes"][0]["steps"] == 500
    # "complete" means nothing was lost: the records not written are said so
    lost = sum(e["records_lost"] for e in errors.values())
    assert summary["complete"] is False and summary["lost"]["records_not_written"] == lost
    for trace in (out / "trace").glob("*.pftrace"):  # the streamed trace: counted too
        assert errors[str(trace)]["error"] == "File too large"
        assert errors[str(trace)]["records_lost"] > 0
        assert proc.stderr.count(f"cannot write {trace}: File too large") == 1


def test_a_disk_that_stays_full_never_raises_out_of_shutdown(tmp_path):
    out = tmp_path / "run"
    proc = _run(out, 1024, "stays full", quiet=False)  # the summary does not fit either
    assert proc.returncode == 0 and "shutdown returned" in proc.stdout, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count(f"cannot write {out / 'summary.json'}: File too large") == 1
    # Issue #36 case 6: the warnings said the losses were "counted in summary.json", which
    # could not be written. Now the summary's own warning gives the counts, and the end
    # notice names every file and its records lost.
    (said,) = [x for x in proc.stderr.splitlines() if f"cannot write {out / 'summary.json'}" in x]
    assert "not in summary.json" in said and "counted in summary.json" not in said
    assert "here and in the end notice" in said
    lost = int(said.split("not in summary.json: ")[1].split(" records not written")[0])
    assert lost > 0
    notice = proc.stderr[proc.stderr.index("otel-tunix: run ") :]
    notice = notice[notice.index(" finished: ") :]
    assert f"{out / 'summary.json'} not written (File too large)" in notice
    for name in ("spans.jsonl", "metrics.jsonl"):
        assert f"{out / name}: " in notice  # "<n> records not written (File too large)"
    in_notice = {
        x.split(": ")[0].strip(): int(x.split(": ")[-1].split(" records")[0])
        for x in notice.splitlines()[1].split("; ")
        if "records not written" in x
    }
    files = [str(out / "spans.jsonl"), str(out / "metrics.jsonl")]
    assert sum(in_notice[f] for f in files) == lost  # the same count, said in both places
    assert "nothing dropped or failed" not in notice
    assert not (out / "summary.json.tmp").exists()
    for name in ("spans.jsonl", "metrics.jsonl"):
        assert read_jsonl(out / name, whole=True)  # what was written before the disk filled, whole


COUNTED = textwrap.dedent(
    """
    import json, resource, signal, sys, time
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    import otel_tunix
    from otel_tunix.support.linefile import write_errors

    out = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    reader = InMemoryMetricReader()
    perf = otel_tunix.PerformanceMetricsConfig(process_interval_ms=5)
    otel_tunix.configure(output_dir=out, system_metrics=False, alerts=False, perf=perf,
                         metric_readers=[reader])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # the disk fills
    for n in range(200):
        with otel_tunix.step(n), otel_tunix.component("work"):
            pass
        otel_tunix.log({"loss": 1.0}, step=n)
    otel_tunix.force_flush()
    seen = {
        p.attributes["file"]: p.value
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "tunix.telemetry.records_not_written"
        for p in m.data.data_points
    }
    lost = {k.rsplit("/", 1)[-1]: v["records_lost"] for k, v in write_errors().items()}
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    otel_tunix.shutdown()
    print(json.dumps({"metric": seen, "lost": lost}))
    """
)


def test_records_not_written_are_a_metric_too(tmp_path):
    """Issue #36 ("counted where the user looks"): the same counts as summary.json's
    write_errors, as tunix.telemetry.records_not_written by file name."""
    env = child_env()
    env["OTEL_TUNIX_QUIET"] = "true"
    proc = subprocess.run(
        [sys.executable, "-c", COUNTED, str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["lost"]["spans.jsonl"] > 0 and got["lost"]["metrics.jsonl"] > 0
    assert got["metric"] == got["lost"]
