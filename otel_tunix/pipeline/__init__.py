"""The pipeline: from a finished step on the training thread to the span processors.

* :mod:`~otel_tunix.pipeline.worker`: the bounded queue of finished steps and the worker
  thread that processes them in batches (and the device-end waiter).
* :mod:`~otel_tunix.pipeline.span_builder`: a batch of step records into
  :class:`~otel_tunix.pipeline.span_builder.FinishedStep` objects (numbers now, SDK spans on
  demand) for the run's consumers.
* :mod:`~otel_tunix.pipeline.step_sinks`: the one consumer interface
  (:class:`~otel_tunix.pipeline.step_sinks.StepSink`) and the worker's list of consumers;
  span processors that are not consumers get the steps' SDK spans through ``on_end``.
* :mod:`~otel_tunix.pipeline.export_processor`: the counting batch processor in front of
  every exporter otel-tunix configures (its own bounded queue and export thread).
"""
