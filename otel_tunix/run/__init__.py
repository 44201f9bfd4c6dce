"""Run setup: what ``configure()`` starts and ``shutdown()`` stops.

* :mod:`~otel_tunix.run.setup`: ``configure()`` / ``shutdown()`` and the run's state.
* :mod:`~otel_tunix.run.providers`: the OTel tracer, meter and logger providers (joined or
  built from ``OTEL_*``) and their exporters.
* :mod:`~otel_tunix.run.signals`: SIGTERM handling (a preempted job writes what it has).
"""
