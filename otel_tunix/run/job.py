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

The first step span of a later attempt links the previous attempt (:mod:`otel_tunix.model.job`):
the last step line of that attempt's spans JSONL (this rank's, in the local run folders),
else ids derived from (job id, previous attempt) that name no recorded span.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import OTELResourceDetector

from otel_tunix.model import job as _job
from otel_tunix.model import record as rs
from otel_tunix.model.job import JobInfo, PreviousAttempt
from otel_tunix.model.resource import RankInfo, new_run_id
from otel_tunix.run import folders
from otel_tunix.run.paths import NotRegularFile, open_regular, os_reason
from otel_tunix.settings import attributes as attr
from otel_tunix.settings import variables as env
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.values import Settings
from otel_tunix.support import process as _process
from otel_tunix.support.errors import warn_once

__all__ = ["attempt_run_id", "identify", "launcher_job_id"]

_logger = logging.getLogger(__name__)
_last: JobInfo | None = None  # this process's latest run's: a forked child keeps its parent's

_HEADER_MAX = 1 << 20  # a header line longer than this is not ours
_INT64_MAX = (1 << 63) - 1  # an attempt or a count must fit the int64 that OTLP carries
_DECIMAL = re.compile(r"[0-9]+")  # plain ASCII digits: no sign, float, "1_000" or "٣"
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
) -> tuple[JobInfo, str, Path | None]:
    """The run's job identity, its run id (``run_id``: the one given to ``configure()``)
    and the run folder it claimed (``None``: no folder, or a forked child's, found later).

    ``output_dir`` is the folder given to ``configure()`` (else ``OTEL_TUNIX_OUTPUT_DIR``
    says where the run folders are). The folder is claimed as the attempt is found, in one
    step (:func:`otel_tunix.run.folders.claim`): runs that start at once get their own
    folders and attempts. A forked child of a run keeps its parent's job and attempt and
    links nothing.

    Raises:
        ConfigurationError: the run folder cannot be made, naming the setting.
    """
    global _last
    given = _given_attributes(resource_attributes)
    job_id = settings.job_id or _text(given.get(attr.JOB_ID)) or launcher_job_id(settings)
    if forked and _last is not None:  # the parent's attempt, its process start included
        rid = run_id or settings.run_id or new_run_id()
        parent = _last
        info = JobInfo(parent.job_id, parent.attempt, parent.attempt_from, parent.process_start_ns)
        return info, rid, None
    explicit, explicit_source = _explicit_attempt(settings, given)
    own_id = None if job_id is not None else run_id or settings.run_id or new_run_id()
    found: dict[str, Any] = {}

    def decide(earlier: list[tuple[int, dict[str, Any], Path]]) -> dict[str, Any]:
        if explicit is not None:
            attempt, source = explicit, explicit_source
        else:
            attempt, source = _counted_attempt(settings, earlier)
        if job_id is None:
            rid = own_id or new_run_id()
        else:
            rid = run_id or settings.run_id or attempt_run_id(job_id, attempt)
        found.update(attempt=attempt, source=source, rid=rid, earlier=earlier)
        return {"job_id": job_id or rid, "attempt": attempt, "run_id": rid, "pid": os.getpid()}

    folder: Path | None = None
    where = _folders_of(job_id or own_id or "", settings, output_dir, forked)
    if where is None:
        decide(_earlier_attempts(job_id, rank, []) if job_id is not None else [])
    else:
        base, in_given = where
        try:
            folder = folders.claim(
                base,
                rank.file_suffix,
                given=in_given,
                content=lambda taken: decide(_earlier_attempts(job_id, rank, taken)),
            )
        except (OSError, ValueError) as exc:
            raise ConfigurationError(_cannot_make(base, in_given, exc)) from None
    attempt, source, rid = found["attempt"], found["source"], found["rid"]
    earlier = found["earlier"]
    final_job = job_id if job_id is not None else rid
    previous = _previous(final_job, attempt, earlier) if attempt > 1 else None
    info = JobInfo(final_job, attempt, source, _process.process_start_ns(), previous)
    _last = info
    return info, rid, folder


def _folders_of(
    key: str, settings: Settings, output_dir: str | os.PathLike[str] | None, forked: bool
) -> tuple[Path, bool] | None:
    """Where the run's folder is claimed: ``(base, given)``; ``None``: no folder (``none``,
    ``OTEL_SDK_DISABLED``) or a forked child (its folder is found in its parent's)."""
    raw = os.fspath(output_dir) if output_dir is not None else settings.output_dir
    if forked or settings.sdk_disabled or (raw is not None and raw.strip().lower() == "none"):
        return None
    if raw is None or not raw.strip():
        return folders.default_base(key), False
    return Path(raw), True


def _cannot_make(base: Path, given: bool, exc: Exception) -> str:
    if isinstance(exc, ValueError):
        reason = "a NUL character in the path"
    elif given and base.is_file():
        reason = "it is a file, not a directory"
    else:
        reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)
    if given:
        setting = f"output_dir / {env.OTEL_TUNIX_OUTPUT_DIR}={os.fspath(base)!r}"
        return f"{setting}: cannot make the run folder ({reason})"
    return (
        f"the default run folder {os.fspath(base)!r} cannot be made ({reason}); set "
        f"output_dir / {env.OTEL_TUNIX_OUTPUT_DIR} to another folder, or to none"
    )


def _given_attributes(resource_attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """``tunix.job.*`` of ``OTEL_RESOURCE_ATTRIBUTES`` (parsed by the SDK's own detector),
    under those of ``configure(resource_attributes=)``."""
    out: dict[str, Any] = dict(OTELResourceDetector().detect().attributes)
    out.update(resource_attributes or {})
    return {k: out[k] for k in (attr.JOB_ID, attr.JOB_ATTEMPT) if k in out}


def _text(value: Any) -> str | None:
    return str(value) if value is not None and str(value).strip() else None


def _number(name: str, value: Any, least: int) -> int | None:
    """``value`` as a whole number in [``least``, 2^63): an ``int``, or a string of plain
    ASCII digits (``"1e3"``, ``"1_000"``, ``"1.0"`` or ``"٣"`` are not); otherwise reported,
    naming ``name``, and ``None`` (ignored: the run goes on)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()) and len(value) < 30:
        number = int(value.strip())
    if number is None or not least <= number <= _INT64_MAX:
        _logger.warning(
            "otel-tunix: %s=%r is not allowed (a whole number of plain digits, %d to 2^63-1); "
            "ignored, the attempt is found without it",
            name,
            value if not isinstance(value, str) else value[:80],
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
    job_id: str | None, rank: RankInfo, taken: list[Path]
) -> list[tuple[int, dict[str, Any], Path]]:
    """``(attempt, header, spans file)`` of this rank's earlier runs of the job in the
    folders ``taken`` before the run's own, by attempt (the last run of each attempt): from
    each spans file's header, else from the folder's claim (a run that started at once with
    this one may not have written its header yet)."""
    if job_id is None:
        return []
    found: dict[int, tuple[int, dict[str, Any], Path]] = {}
    for folder in taken:
        path = folder / f"spans{rank.file_suffix}.jsonl"
        header = read_header(path) or folders.read_claim(folder, rank.file_suffix)
        if header is None:
            continue
        resource = header.get("resource") or {}
        if str(header.get("job_id", resource.get(attr.JOB_ID))) != job_id:
            continue
        attempt = header.get("attempt", resource.get(attr.JOB_ATTEMPT))
        if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 1:
            found[attempt] = (attempt, header, path)
    return [found[a] for a in sorted(found)]


def _skipped(path: Path, exc: NotRegularFile) -> None:
    warn_once(
        ("not-a-file", os.fspath(path)),
        "otel-tunix: %s is %s, not a file a run wrote; skipped in finding the job's attempt",
        path,
        exc.strerror,
    )


def read_header(path: Path) -> dict[str, Any] | None:
    """The ``type: "run"`` header of a spans JSONL file, or ``None`` (none, unreadable, or
    not a regular file: a FIFO is said and skipped, never waited on)."""
    try:
        with open_regular(path) as f:
            line = f.readline(_HEADER_MAX)
        header = json.loads(line)
    except NotRegularFile as exc:
        _skipped(path, exc)
        return None
    except (OSError, ValueError, RecursionError):
        return None
    return header if isinstance(header, dict) and header.get(rs.TYPE) == rs.TYPE_RUN else None


def last_step(path: Path) -> dict[str, Any] | None:
    """The last whole ``type: "step"`` line of a spans JSONL file, read from its end (a
    killed run's file may end in a torn line: it is skipped)."""
    try:
        with open_regular(path) as f:
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
    except (ValueError, RecursionError):
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
