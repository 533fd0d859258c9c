"""Statistics and measures: token filters, streaming moments, the out-of-core Dask pass, matrix
entropy and CKA, and the analysis stage's tasks.
"""
