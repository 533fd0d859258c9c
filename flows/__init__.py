"""Prefect flows: one module per pipeline stage, plus the command line that runs them in-process."""
