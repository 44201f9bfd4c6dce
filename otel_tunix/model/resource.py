"""The OTel Resource of a run: service and its instance, run id, job id and attempt, host,
pid, rank and world size."""

from __future__ import annotations

import datetime as _dt
import os
import secrets
import socket
import sys
import threading
import uuid
from dataclasses import dataclass

from opentelemetry.sdk.resources import (
    SERVICE_INSTANCE_ID,
    SERVICE_NAME,
    OTELResourceDetector,
    Resource,
)

from otel_tunix.model.job import JobInfo
from otel_tunix.settings import attributes as attr
from otel_tunix.settings import tally as _tally
from otel_tunix.settings.redact import REDACTED, is_secret_key
from otel_tunix.settings.values import Settings


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Where this process sits in a distributed job (rank 0 of 1 when it is alone)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def file_suffix(self) -> str:
        """``-rank<r>`` in a distributed job (the run folder's file names), else nothing."""
        return f"-rank{self.rank}" if self.distributed else ""


def detect_rank(settings: Settings) -> RankInfo:
    """Rank and world size from launcher variables (torchrun, MPI, SLURM), an initialised
    ``torch.distributed`` process group, or JAX (in that order)."""
    rank = settings.launcher_rank
    world = settings.launcher_world_size
    local = settings.launcher_local_rank
    if rank is None and "torch.distributed" in sys.modules:
        # An initialised process group knows its rank even without launcher variables.
        try:
            dist = sys.modules["torch.distributed"]
            if dist.is_available() and dist.is_initialized():
                rank, world = int(dist.get_rank()), int(dist.get_world_size())
        except Exception:  # torch present but no usable process group
            rank = None
    if rank is None and "jax" in sys.modules:
        # Only when the program already imported JAX: asking earlier would start a backend.
        try:
            jax = sys.modules["jax"]
            rank, world = int(jax.process_index()), int(jax.process_count())
        except Exception:  # JAX present but not usable: treat the process as alone
            rank = None
    if rank is None:
        return RankInfo(local_rank=local)
    return RankInfo(rank=rank, world_size=max(world or 1, rank + 1), local_rank=local)


def new_run_id() -> str:
    """A fresh run id, ``<date>-<time>-<random>``: a run that is no attempt of a job named
    elsewhere (see :mod:`otel_tunix.run.job`)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


_instance_lock = threading.Lock()
_instance: tuple[int, str] | None = None


def service_instance_id() -> str:
    """This process's ``service.instance.id``: a random UUID made once per process (a
    forked child makes its own), so each rank and each attempt of a job is one instance, and
    every run and signal of the process names the same one, whatever the OTel SDK adds."""
    global _instance
    pid = os.getpid()
    with _instance_lock:
        if _instance is None or _instance[0] != pid:
            _instance = (pid, str(uuid.uuid4()))
        return _instance[1]


def resource_attributes(
    *,
    service_name: str | None,
    run_id: str,
    rank: RankInfo,
    extra: dict[str, str | int | float | bool] | None = None,
    job: JobInfo | None = None,
) -> dict[str, str | int | float | bool]:
    """The attributes otel-tunix adds to the Resource (``service.name`` only if given)."""
    ours: dict[str, str | int | float | bool] = {
        attr.RUN_ID: run_id,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
    }
    if job is not None:
        ours.update(job.resource_attributes())
    if rank.distributed or rank.rank:
        ours[attr.RANK] = rank.rank
        ours[attr.WORLD_SIZE] = rank.world_size
    if rank.local_rank is not None:
        ours[attr.LOCAL_RANK] = rank.local_rank
    if SERVICE_INSTANCE_ID not in OTELResourceDetector().detect().attributes:
        ours[SERVICE_INSTANCE_ID] = service_instance_id()  # OTEL_RESOURCE_ATTRIBUTES' wins
    if extra:
        ours.update(extra)
    if service_name:
        ours[SERVICE_NAME] = service_name
    return ours


def build_resource(attributes: dict[str, str | int | float | bool]) -> Resource:
    """Our attributes merged over the SDK's (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``).

    An explicit ``service_name`` wins over ``OTEL_SERVICE_NAME``, which wins over the SDK's
    ``unknown_service`` default: ``Resource.create`` reads both variables and lets the
    attributes passed to it win. The values of secret-looking keys (``api_key``,
    ``auth_token``, ...; from either source) are redacted: the resource goes with every
    export.
    """
    resource = Resource.create(attributes)
    secrets = [k for k, v in resource.attributes.items() if is_secret_key(k) and v != REDACTED]
    if not secrets:
        return resource
    _tally.add("secrets_redacted", len(secrets))
    redacted = {k: REDACTED if k in secrets else v for k, v in resource.attributes.items()}
    return Resource(redacted, resource.schema_url)
