"""The MetricsLogger and its backends: scalars (loss, rewards, perf/...) to JSONL, OTel
instruments, TensorBoard, W&B, the console and the live line.
"""
