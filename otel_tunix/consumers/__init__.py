"""Consumers of finished steps, fed by the pipeline's worker: the step accounting, the sinks
(OTel instruments, MetricsLogger, export_fn), spans.jsonl, the live goodput ledger, the step
histograms and the straggler comparison.
"""
