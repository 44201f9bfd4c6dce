"""Support code any layer above settings may use: the internal-error policy, ids, JSON
lines, append-only line files, text cleaning, fork handling, the process start, and every
private-API shortcut in one place.
"""
