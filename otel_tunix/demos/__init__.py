"""The demos behind `otel-tunix demo`: SFT and RL on a tiny byte-level language model, on the
CPU, fully instrumented.
"""
