"""Datadog tags: ``key:value`` strings from attributes and from the run's OTel resource.

See :mod:`otel_tunix.exporters.datadog` for the order in which tags are applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource

from otel_tunix.settings import attributes as attr

__all__ = ["RESOURCE_TAGS", "TagsLike", "resource_tags"]

RESOURCE_TAGS: Final[Mapping[str, str]] = {
    SERVICE_NAME: "service",
    "deployment.environment.name": "env",
    "deployment.environment": "env",
    SERVICE_VERSION: "version",
    attr.RUN_ID: "run_id",
    attr.RANK: "rank",
    "host.name": "host",
}
"""Resource attribute -> Datadog tag key. The first attribute present wins for a tag key;
``service``, ``env`` and ``version`` are Datadog's reserved unified-service tags and
``host`` sets the metric's host in the Agent."""

TagsLike = Iterable[str] | Mapping[str, object] | None
"""Tags as ``"key:value"`` strings or as a mapping of key to value."""


def _tag_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _tag_list(tags: TagsLike) -> list[str]:
    """``"key:value"`` strings from a list of tags or a mapping (sequence values repeat)."""
    if tags is None:
        return []
    if isinstance(tags, str):
        return [tags]
    if isinstance(tags, Mapping):
        out: list[str] = []
        for key, value in tags.items():
            if isinstance(value, list | tuple):
                out.extend(f"{key}:{_tag_value(v)}" for v in value)
            else:
                out.append(f"{key}:{_tag_value(value)}")
        return out
    return [str(tag) for tag in tags]


def _tag_key(tag: str) -> str:
    return tag.split(":", 1)[0]


def resource_tags(resource: Resource | None, *, exclude: Iterable[str] = ()) -> list[str]:
    """Datadog tags of a resource, following :data:`RESOURCE_TAGS`.

    The SDK's placeholder ``unknown_service...`` service name is not turned into a tag.

    Args:
        resource: The OTel resource (``None`` gives no tags).
        exclude: Tag keys that are already set elsewhere (constant tags), skipped here.

    Returns:
        ``"key:value"`` strings, at most one per tag key.
    """
    if resource is None:
        return []
    taken = set(exclude)
    out: list[str] = []
    for key, tag in RESOURCE_TAGS.items():
        value = resource.attributes.get(key)
        if tag in taken or value is None or value == "":
            continue
        if key == SERVICE_NAME and str(value).startswith("unknown_service"):
            continue
        taken.add(tag)
        out.append(f"{tag}:{_tag_value(value)}")
    return out
