"""``get_metrics_summary()`` in process, and the import promise: the metrics package needs
only the OpenTelemetry SDK and numpy."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import otel_tunix
from otel_tunix.logger import status
from otel_tunix.testing import capture


def test_metrics_summary_of_a_run():
    with capture():
        counts = status.install()
        assert status.install() is counts  # idempotent
        logger = otel_tunix.get_metrics_logger()
        for n in range(4):
            with otel_tunix.step(n):
                pass
            logger.log_dict({"loss": 1.0 / (n + 1), "grad_norm": 2.0}, step=n)
        logger.log("kl", math.nan, step=3)
        otel_tunix.force_flush()
        s = status.get_metrics_summary()
    assert s["last_step"] == 3 and s["last_loss"] == 0.25
    assert s["counts"]["loss"] == 4 and s["counts"]["grad_norm"] == 4
    assert s["nonfinite"] == {"kl": 1}
    assert s["num_metrics"] == sum(s["counts"].values())
    assert s["num_metric_names"] == len(s["last_values"])
    assert s["steps"] == {"train": 4}
    assert s["last_step_time_sec"]["step"] == 3
    assert s["alerts"] == []
    assert s["run_id"]


def test_summary_without_the_counting_backend():
    logger = otel_tunix.MetricsLogger(
        otel_tunix.MetricsLoggerOptions(default_backends=False), rank=0
    )
    logger.log("loss", 0.5, step=9)
    s = status.get_metrics_summary(logger)
    assert s["last_step"] == 9 and s["last_loss"] == 0.5
    assert s["num_metrics"] is None and s["counts"] == {}


_BLOCKED = ("torch", "jax", "jaxlib", "transformers", "psutil", "pynvml", "tensorboardX",
            "tensorboard", "wandb", "datadog")  # fmt: skip


def test_metrics_import_with_only_the_sdk_and_numpy():
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {_BLOCKED!r}:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        import numpy as np
        import otel_tunix.metrics as m
        from otel_tunix.metrics import rl, training, generation, system, alerts
        from otel_tunix.logger import backends
        assert rl.rl_metrics(rewards=np.ones(3))["rewards/mean"] == 1.0
        assert m.TrainingMetrics(peak_flops_per_device=1e12, flops_per_token=1e6).step(
            tokens=1, step_time_sec=1.0)["mfu"] == 1e-6
        s = system.SystemMetricsSampler(instruments=False)
        assert s.sample().gpus == () and s.sample().process is None
        try:
            backends.TensorBoardBackend("x")
        except ImportError as e:
            assert "otel-tunix[tensorboard]" in str(e)
        else:
            raise AssertionError("no ImportError")
        try:
            generation.GenerationMetrics().generate(object())
        except ImportError as e:
            assert "otel-tunix[transformers]" in str(e)
        else:
            raise AssertionError("no ImportError")
        loaded = sorted(n for n in sys.modules if n.split(".")[0] in {_BLOCKED!r})
        assert not loaded, loaded
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
