"""Secrets stay home: a run's config goes to ``config.json`` (secret-looking values
redacted), onto the resource only the keys ``OTEL_TUNIX_RESOURCE_CONFIG_KEYS`` names, and no
notice, message or file shows an endpoint's credentials or a header's value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from processes import child_env

import otel_tunix
from otel_tunix.settings.redact import REDACTED, is_secret_key, redact_text

_CHILD = r"""
import json, sys, time, urllib.request
import otel_tunix

info = otel_tunix.configure(
    service_name="secrets",
    output_dir=sys.argv[1],
    run_config={"api_key": "sk-SECRET1", "lr": 3e-4, "max_tokens": 512,
                "wandb": {"project": "p", "token": "SECRET2"},
                "callbacks": [{"name": "wandb", "api_key": "SECRET10"}],
                "github_pat": "ghp_SECRET11", "session_cookie": "SECRET12",
                "db": "postgres://trainer:SECRET13@db.internal:5432/runs",
                "argv": ["train.py", "--hf_token=hf_SECRET14", "--hf_token", "hf_SECRET15",
                         "--lr", "3e-4"]},
)
for n in range(5):
    with otel_tunix.step(n), otel_tunix.component("work"):
        time.sleep(0.001)
    otel_tunix.log({"loss": 1.0 / (n + 1)}, step=n)
otel_tunix.force_flush()
scrape = urllib.request.urlopen(info.endpoints["prometheus"], timeout=5).read().decode()
otel_tunix.shutdown()
print("SCRAPE-BEGIN\n" + scrape + "SCRAPE-END")
"""


def test_no_secret_of_the_config_endpoint_or_headers_leaves_in_any_output(
    tmp_path: Path, rotel_collector
) -> None:
    base = rotel_collector.http_endpoint.replace("http://", "http://user:SECRET3@")
    env = child_env(
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=base + "/v1/traces?token=SECRET4",
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=base + "/v1/metrics?token=SECRET4",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer SECRET5,x-tenant=7",
        OTEL_RESOURCE_ATTRIBUTES="deploy.auth_token=SECRET6,team=ml",
        OTEL_TUNIX_RESOURCE_CONFIG_KEYS="lr,api_key,wandb.*,github_pat,session_cookie,db",
        OTEL_METRICS_EXPORTER="prometheus,otlp",
        OTEL_TUNIX_PROMETHEUS_PORT="0",
        OTEL_TUNIX_SYSTEM_METRICS_INTERVAL="0",
        OTEL_METRIC_EXPORT_INTERVAL="200",
    )
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(run)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    received = rotel_collector.wait_for_spans("train_step", "work")
    # the run went out as usual, its resource with the allowed keys only, secrets redacted
    (step,) = [s for s in received.spans_named("train_step") if s.attributes["tunix.step"] == 0]
    resource = step.resource
    assert resource["tunix.config.lr"] == 3e-4
    assert resource["tunix.config.api_key"] == REDACTED
    assert resource["tunix.config.wandb.token"] == REDACTED
    assert resource["tunix.config.wandb.project"] == "p"
    assert "tunix.config.max_tokens" not in resource  # not named
    assert resource["tunix.config.github_pat"] == REDACTED
    assert resource["tunix.config.session_cookie"] == REDACTED
    assert resource["tunix.config.db"] == "postgres://[REDACTED]@db.internal:5432/runs"
    assert resource["deploy.auth_token"] == REDACTED and resource["team"] == "ml"
    # nothing anywhere holds a secret: files, stderr (the notices), the scrape, the collector
    texts = {p.name: p.read_text(errors="replace") for p in run.iterdir() if p.is_file()}
    texts["stderr"] = proc.stderr
    texts["stdout (the /metrics scrape)"] = proc.stdout
    texts["collector"] = rotel_collector.output()
    for where, text in texts.items():
        assert "SECRET" not in text, where
    assert "target_info" in proc.stdout and 'deploy_auth_token="[REDACTED]"' in proc.stdout
    config = json.loads((run / "config.json").read_text())
    assert config == {
        "api_key": REDACTED, "lr": 3e-4, "max_tokens": 512,
        "wandb": {"project": "p", "token": REDACTED},
        "callbacks": [{"name": "wandb", "api_key": REDACTED}],  # inside a list
        "github_pat": REDACTED, "session_cookie": REDACTED,
        "db": "postgres://[REDACTED]@db.internal:5432/runs",  # the DSN's user info
        "argv": ["train.py", "--hf_token=[REDACTED]", "--hf_token", REDACTED, "--lr", "3e-4"],
    }  # fmt: skip
    # the start notice names the collector, without its credentials
    assert (
        f"{rotel_collector.http_endpoint.replace('http://', 'http://[REDACTED]@')}" in proc.stderr
    )
    summary = json.loads((run / "summary.json").read_text())
    # config.json's eight, the resource's one, the endpoint's user info and query in the
    # notice (spans and metrics: two lines)
    assert summary["safety"]["secrets_redacted"] == 8 + 1 + 4
    assert f"{summary['safety']['secrets_redacted']} secrets redacted" in proc.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "user:SECRET7@collector:4317"),  # no scheme
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector:4317/?token=SECRET8"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:SECRET9@collector:port"),
    ],
)
def test_a_refused_endpoint_is_named_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(otel_tunix.ConfigurationError, match=variable) as err:
        otel_tunix.configure(output_dir="none", system_metrics=False)
    assert "SECRET" not in str(err.value)
    assert "collector" in str(err.value)  # still says which value it refused


def test_secret_looking_keys_and_messages() -> None:
    secret = [
        "api_key",
        "apiKey",
        "OPENAI_API_KEY",
        "wandb_token",
        "accessToken",
        "password",
        "db_passwd",
        "aws_secret_access_key",
        "credentials",
        "auth",
        "Authorization",
        "github_pat",
        "session_cookie",
        "sessionCookie",
    ]
    plain = [
        "lr",
        "max_tokens",
        "tokens_per_sec",
        "monkey",
        "keyboard_layout",
        "author",
        "num_keys",
        "batch_size",
        "path",
        "pattern",
    ]
    assert [k for k in secret if not is_secret_key(k)] == []
    assert [k for k in plain if is_secret_key(k)] == []
    text = "export failed to https://u:pw@h:4318/v1/traces?sig=abc (api_key=sk-1, lr=3)"
    assert redact_text(text) == (
        "export failed to https://[REDACTED]@h:4318/v1/traces?[REDACTED] (api_key=[REDACTED], lr=3)"
    )
    # a request path's query as the requests library quotes it, without scheme and host
    bare = "Max retries exceeded with url: /v1/traces?sig=abc (Caused by X), ratio 3/4?"
    assert redact_text(bare) == (
        "Max retries exceeded with url: /v1/traces?[REDACTED] (Caused by X), ratio 3/4?"
    )


LEAKY_RUN = """
import time, otel_tunix
otel_tunix.configure(output_dir="none", system_metrics=False, alerts=False)
for n in range(3):
    with otel_tunix.step(n):
        time.sleep(0.01)
otel_tunix.force_flush()  # the export fails, and the SDK retries (and says so) meanwhile
time.sleep(2)
otel_tunix.shutdown()
"""


def test_the_sdk_exporters_own_failure_messages_are_redacted() -> None:
    """A collector that refuses the connection: the OTel SDK's own retry message quotes the
    request URL (its query too); otel-tunix's filter on the exporters' loggers redacts it."""
    proc = subprocess.run(
        [sys.executable, "-c", LEAKY_RUN],
        env=child_env(
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://127.0.0.1:9/v1/traces?sig=SECRET7",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_TIMEOUT="3",  # room for a retry after 1 s: the SDK says so
        ),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Transient error" in proc.stderr  # the SDK's message was written
    assert "/v1/traces?[REDACTED]" in proc.stderr
    assert "SECRET7" not in proc.stderr + proc.stdout
