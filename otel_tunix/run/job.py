"""Which job a run belongs to and which attempt of it the run is, found at ``configure()``.

The job id: ``OTEL_TUNIX_JOB_ID``, else ``tunix.job.id`` among the resource attributes given
(``configure(resource_attributes=)``, ``OTEL_RESOURCE_ATTRIBUTES``), else the launcher's
(``torchelastic-<TORCHELASTIC_RUN_ID>``, ``slurm-<SLURM_JOB_ID>``), else none: the run is a
job of its own and its (new) run id is the job id.

The attempt (from 1): ``OTEL_TUNIX_JOB_ATTEMPT``, else ``tunix.job.attempt`` among the
resource attributes given; else the highest of the launcher's restart count + 1
(``TORCHELASTIC_RESTART_COUNT``, else ``SLURM_RESTART_COUNT``) and one more than the highest
attempt of the job that this rank's earlier runs in the local run folders wrote in their
spans JSONL headers (written and flushed at ``configure()``, so an attempt killed with
SIGKILL counts), else 1. A value that is not allowed is reported naming the variable and
ignored: the run goes on.

Ranks starting at once agree: each reads only its own rank's files (``spans-rank<r>.jsonl``),
which no other rank of the new attempt writes, so the new attempt's first ranks to start
cannot change what the later ones find. They disagree only if a rank of an earlier attempt
died before its ``configure()`` (its header is missing) or the ranks see different local
folders (one disk per host): the launcher's restart count, the same on every rank, is what
they share then; without one, set ``OTEL_TUNIX_JOB_ATTEMPT``.

The run id of a job's run: the job id for attempt 1, ``<job id>-attempt<n>`` for a later one
(``OTEL_TUNIX_RUN_ID`` or ``configure(run_id=)`` wins), so each attempt has its own, the same
on all its ranks; the ids of the job's step traces (``_ids.JobStepIds``) are derived from it
and the attempt, so two attempts never share a trace id.

The first step span of a later attempt links the previous attempt (:mod:`otel_tunix._job`):
the last step line of that attempt's spans JSONL (this rank's, in the local run folders),
else ids derived from (job id, previous attempt) that name no recorded span.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import OTELResourceDetector

from otel_tunix import _job, _process
from otel_tunix import attributes as attr
from otel_tunix import environment_variables as env
from otel_tunix import record_schema as rs
from otel_tunix._job import JobInfo, PreviousAttempt
from otel_tunix._resource import RankInfo, new_run_id
from otel_tunix.run import folders
from otel_tunix.settings import Settings

__all__ = ["attempt_run_id", "identify", "launcher_job_id"]

_logger = logging.getLogger(__name__)
_last: JobInfo | None = None  # this process's latest run's: a forked child keeps its parent's

_HEADER_MAX = 1 << 20  # a header line longer than this is not ours
_TAIL_CHUNK = 1 << 16


def launcher_job_id(settings: Settings) -> str | None:
    """``torchelastic-<id>`` or ``slurm-<id>``: the job id a launcher gave every rank."""
    for launcher, job in (
        ("torchelastic", settings.torchelastic_run_id),
        ("slurm", settings.slurm_job_id),
    ):
        if job and job != "none":  # torchrun without --rdzv-id says "none"
            return f"{launcher}-{job}"
    return None


def attempt_run_id(job_id: str, attempt: int) -> str:
    """The run id of attempt ``attempt`` of job ``job_id``."""
    return job_id if attempt == 1 else f"{job_id}-attempt{attempt}"


def identify(
    settings: Settings,
    *,
    run_id: str | None,
    rank: RankInfo,
    resource_attributes: Mapping[str, Any] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    forked: bool = False,
) -> tuple[JobInfo, str]:
    """The run's job identity and its run id (``run_id``: the one given to ``configure()``).

    ``output_dir`` is the folder given to ``configure()`` (else ``OTEL_TUNIX_OUTPUT_DIR``
    says where the run folders are). A forked child of a run keeps its parent's job and
    attempt and links nothing.
    """
    global _last
    given = _given_attributes(resource_attributes)
    job_id = settings.job_id or _text(given.get(attr.JOB_ID)) or launcher_job_id(settings)
    if forked and _last is not None:  # the parent's attempt, its process start included
        rid = run_id or settings.run_id or new_run_id()
        parent = _last
        info = JobInfo(parent.job_id, parent.attempt, parent.attempt_from, parent.process_start_ns)
        return info, rid
    attempt, source = _explicit_attempt(settings, given)
    earlier: list[tuple[int, dict[str, Any], Path]] = []
    if job_id is not None:
        earlier = _earlier_attempts(job_id, settings, rank, output_dir)
    if attempt is None:
        attempt, source = _counted_attempt(settings, earlier)
    if job_id is None:
        rid = run_id or settings.run_id or new_run_id()
        job_id = rid
    else:
        rid = run_id or settings.run_id or attempt_run_id(job_id, attempt)
    previous = _previous(job_id, attempt, earlier) if attempt > 1 else None
    info = JobInfo(job_id, attempt, source, _process.process_start_ns(), previous)
    _last = info
    return info, rid


def _given_attributes(resource_attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """``tunix.job.*`` of ``OTEL_RESOURCE_ATTRIBUTES`` (parsed by the SDK's own detector),
    under those of ``configure(resource_attributes=)``."""
    out: dict[str, Any] = dict(OTELResourceDetector().detect().attributes)
    out.update(resource_attributes or {})
    return {k: out[k] for k in (attr.JOB_ID, attr.JOB_ATTEMPT) if k in out}


def _text(value: Any) -> str | None:
    return str(value) if value is not None and str(value).strip() else None


def _number(name: str, value: Any, least: int) -> int | None:
    """``value`` as a whole number >= ``least``; otherwise reported, naming ``name``, and
    ``None`` (ignored: the run goes on)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        if isinstance(value, bool) or not float(value).is_integer():
            raise ValueError
        number = int(float(value))
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or number < least:
        _logger.warning(
            "otel-tunix: %s=%r is not allowed (a whole number >= %d); ignored, the attempt "
            "is found without it",
            name,
            value,
            least,
        )
        return None
    return number


def _explicit_attempt(settings: Settings, given: Mapping[str, Any]) -> tuple[int | None, str]:
    """The attempt the user named: ``OTEL_TUNIX_JOB_ATTEMPT``, else ``tunix.job.attempt``
    among the resource attributes given."""
    attempt = _number(env.OTEL_TUNIX_JOB_ATTEMPT, settings.job_attempt, 1)
    if attempt is not None:
        return attempt, env.OTEL_TUNIX_JOB_ATTEMPT
    attempt = _number(f"resource attribute {attr.JOB_ATTEMPT}", given.get(attr.JOB_ATTEMPT), 1)
    return attempt, "resource attribute " + attr.JOB_ATTEMPT


def _counted_attempt(
    settings: Settings, earlier: list[tuple[int, dict[str, Any], Path]]
) -> tuple[int, str]:
    """The launcher's restart count + 1, raised to one more than the highest earlier attempt
    found locally (a launcher that counts only its own restarts, started again by hand)."""
    attempt, source = 1, "first"
    for name, raw in (
        ("TORCHELASTIC_RESTART_COUNT", settings.torchelastic_restart_count),
        ("SLURM_RESTART_COUNT", settings.slurm_restart_count),
    ):
        count = _number(name, raw, 0)
        if count is not None:
            attempt, source = count + 1, name
            break
    if earlier and earlier[-1][0] + 1 > attempt:
        attempt, source = earlier[-1][0] + 1, "run folders"
    return attempt, source


def _earlier_attempts(
    job_id: str, settings: Settings, rank: RankInfo, output_dir: str | os.PathLike[str] | None
) -> list[tuple[int, dict[str, Any], Path]]:
    """``(attempt, header, spans file)`` of this rank's earlier runs of the job in the local
    run folders, by attempt (the last run of each attempt)."""
    raw = os.fspath(output_dir) if output_dir is not None else settings.output_dir
    if raw is not None and raw.strip().lower() == "none":
        return []
    if raw is None or not raw.strip():
        files = folders.earlier_runs(folders.default_base(job_id), rank.file_suffix, given=False)
    else:
        files = folders.earlier_runs(Path(raw), rank.file_suffix, given=True)
    found: dict[int, tuple[int, dict[str, Any], Path]] = {}
    for path in files:
        header = read_header(path)
        if header is None:
            continue
        resource = header.get("resource") or {}
        if str(header.get("job_id", resource.get(attr.JOB_ID))) != job_id:
            continue
        attempt = header.get("attempt", resource.get(attr.JOB_ATTEMPT))
        if isinstance(attempt, int) and attempt >= 1:
            found[attempt] = (attempt, header, path)
    return [found[a] for a in sorted(found)]


def read_header(path: Path) -> dict[str, Any] | None:
    """The ``type: "run"`` header of a spans JSONL file, or ``None`` (none, or unreadable)."""
    try:
        with path.open("rb") as f:
            line = f.readline(_HEADER_MAX)
        header = json.loads(line)
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) and header.get(rs.TYPE) == rs.TYPE_RUN else None


def last_step(path: Path) -> dict[str, Any] | None:
    """The last whole ``type: "step"`` line of a spans JSONL file, read from its end (a
    killed run's file may end in a torn line: it is skipped)."""
    try:
        with path.open("rb") as f:
            pos, stop = f.seek(0, os.SEEK_END), -1
            while pos > 0 and stop < 0:  # the newline that ends the last whole line
                size = min(_TAIL_CHUNK, pos)
                pos -= size
                f.seek(pos)
                i = f.read(size).rfind(b"\n")
                stop = pos + i if i >= 0 else -1
            pos, tail = max(stop, 0), b""
            while pos > 0:  # bytes before pos are whole lines: read them back to front
                size = min(_TAIL_CHUNK, pos)
                pos -= size
                f.seek(pos)
                lines = (f.read(size) + tail).split(b"\n")
                tail = lines.pop(0) if pos > 0 else b""  # maybe cut: joined to the next read
                for line in reversed(lines):
                    step = _step_line(line)
                    if step is not None:
                        return step
    except OSError:
        return None
    return None


_STEP_TYPE = f'"{rs.TYPE_STEP}"'.encode()


def _step_line(line: bytes) -> dict[str, Any] | None:
    if _STEP_TYPE not in line[:32]:  # "type" is each line's first key
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and obj.get(rs.TYPE) == rs.TYPE_STEP else None


def _previous(
    job_id: str, attempt: int, earlier: list[tuple[int, dict[str, Any], Path]]
) -> PreviousAttempt:
    """Where the first step span links: the previous attempt's last recorded step, else
    derived ids."""
    prev = attempt - 1
    for number, header, path in earlier:
        if number != prev:
            continue
        run_id = _text(header.get("run_id"))
        step = last_step(path)
        if step is not None:
            try:
                trace_id = int(str(step[rs.TRACE_ID]), 16)
                span_id = int(str(step[rs.SPAN_ID]), 16)
                if not (trace_id and span_id):
                    raise ValueError
                return PreviousAttempt(
                    prev,
                    trace_id,
                    span_id,
                    _job.FROM_RUN_FOLDER,
                    run_id=run_id,
                    scope=_text(step.get(rs.SCOPE)),
                    step=n if isinstance(n := step.get(rs.STEP), int) else None,
                )
            except (KeyError, ValueError):
                pass  # a line of a version that did not write the step's span id
        trace_id, span_id = _job.derived_ids(job_id, prev)
        return PreviousAttempt(prev, trace_id, span_id, _job.DERIVED, run_id=run_id)
    trace_id, span_id = _job.derived_ids(job_id, prev)
    return PreviousAttempt(prev, trace_id, span_id, _job.DERIVED)
