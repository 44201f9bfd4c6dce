"""Recording: the hot path. step() and component() on the training thread, the records
they fill in, the step view integrations read, and the current run registered by run setup.
"""
