"""The model: plain data that the layers above make and read. Step summaries, component
times and span infos, the metric catalog, alert rules, the run's resource and
its place in a job.
"""
