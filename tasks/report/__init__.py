"""Reporting: result tables and statistics across sets and seeds, plots, the study's rounds,
and the task that writes a model's report.
"""
