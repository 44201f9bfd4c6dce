"""The pipeline: from a finished step on the training thread to the span processors.

* :mod:`~otel_tunix.pipeline.worker`: the bounded queue of finished steps and the worker
  thread that processes them in batches (and the device-end waiter).
* :mod:`~otel_tunix.pipeline.span_builder`: a batch of step records into
  :class:`~otel_tunix.pipeline.span_builder.FinishedStep` objects (numbers now, SDK spans on
  demand) for every span processor: whole steps for a
  :class:`~otel_tunix.pipeline.span_builder.StepSpanProcessor`, spans for the others.
* :mod:`~otel_tunix.pipeline.export_processor`: the counting batch processor in front of
  every exporter otel-tunix configures (its own bounded queue and export thread).
"""
