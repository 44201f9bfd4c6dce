"""A run's place in its job: the job id, the attempt (1-based), and the previous attempt.

A job is the runs that share a job id (a launcher's restarts, a resumed preemption); each run
is one attempt of it. Run setup finds the identity (:mod:`otel_tunix.run.job`); this module
holds it as plain data for the layers below: the resource attributes ``tunix.job.id`` and
``tunix.job.attempt``, the fields that the spans JSONL header, ``metrics.jsonl``'s meta line
and ``summary.json`` carry, and the link from the run's first step span to the previous
attempt.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from opentelemetry.trace import Link

from otel_tunix.settings import attributes as attr
from otel_tunix.support.shortcuts import new_span_context

__all__ = ["JobInfo", "PreviousAttempt", "derived_ids"]

FROM_RUN_FOLDER = "run_folder"
"""``tunix.link.source`` of a link to the previous attempt's last recorded step, read from
its spans JSONL in the local run folders."""
DERIVED = "derived"
"""``tunix.link.source`` of a link whose ids are derived from (job id, previous attempt):
no local record of that attempt was found, so it names no recorded span; its attributes
say which run to look for."""
PREVIOUS_ATTEMPT = "previous_attempt"
"""``tunix.link.type`` of the link from a run's first step span to the previous attempt."""


def derived_ids(job_id: str, attempt: int) -> tuple[int, int]:
    """``(trace id, span id)`` that stand for attempt ``attempt`` of job ``job_id`` when no
    span of it is known: the same on every rank and every host (a keyed BLAKE2b hash)."""
    digest = hashlib.blake2b(
        f"{job_id}\0{attempt}".encode("utf-8", "surrogatepass"),
        digest_size=24,
        person=b"otel-tunix-job",
    ).digest()
    return int.from_bytes(digest[:16]) or 1, int.from_bytes(digest[16:]) or 1


@dataclass(frozen=True, slots=True)
class PreviousAttempt:
    """Where the first step span of a run links: the previous attempt of its job."""

    attempt: int
    trace_id: int
    span_id: int
    source: str
    """:data:`FROM_RUN_FOLDER` (its last recorded step) or :data:`DERIVED`."""
    run_id: str | None = None
    scope: str | None = None
    step: int | None = None

    def attributes(self, job_id: str) -> dict[str, str | int]:
        """The link's attributes: what it points at and how that was found."""
        out: dict[str, str | int] = {
            attr.LINK_TYPE: PREVIOUS_ATTEMPT,
            attr.LINK_SOURCE: self.source,
            attr.JOB_ID: job_id,
            attr.JOB_ATTEMPT: self.attempt,
        }
        if self.run_id is not None:
            out[attr.RUN_ID] = self.run_id
        if self.scope is not None:
            out[attr.SCOPE] = self.scope
        if self.step is not None:
            out[attr.STEP] = self.step
        return out


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A run's job identity, found once at ``configure()``."""

    job_id: str
    attempt: int
    attempt_from: str
    """Where the attempt number came from: a variable's name, ``run folders`` (the earlier
    runs of the job found locally), or ``first`` (nothing said otherwise)."""
    process_start_ns: int
    """When this process started (Unix ns): where its ``initialization`` begins."""
    previous: PreviousAttempt | None = None

    def resource_attributes(self) -> dict[str, str | int]:
        return {attr.JOB_ID: self.job_id, attr.JOB_ATTEMPT: self.attempt}

    def header(self) -> dict[str, object]:
        """The fields of the spans JSONL header, ``metrics.jsonl``'s meta line and
        ``summary.json``: ``job_id``, ``attempt``, ``process_start_ns``, and ``link`` (the
        first step span's link to the previous attempt, :meth:`link_json`) in a later
        attempt."""
        out: dict[str, object] = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "process_start_ns": self.process_start_ns,
        }
        link = self.link_json()
        if link is not None:
            out["link"] = link
        return out

    def link(self) -> Link | None:
        """The first step span's link to the previous attempt (``None`` for a first one)."""
        prev = self.previous
        if prev is None:
            return None
        ctx = new_span_context(prev.trace_id, prev.span_id)
        return Link(ctx, prev.attributes(self.job_id))

    def link_json(self) -> dict[str, object] | None:
        """The same link as the spans JSONL header's ``link`` field."""
        prev = self.previous
        if prev is None:
            return None
        return {
            "trace_id": f"{prev.trace_id:032x}",
            "span_id": f"{prev.span_id:016x}",
            "attributes": prev.attributes(self.job_id),
        }
