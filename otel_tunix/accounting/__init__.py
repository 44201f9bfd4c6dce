"""Accounting: pure functions over recorded steps: busy / blocked / idle of a step, the
per-session totals, the goodput categories and their arithmetic.
"""
