"""Extraction: documents planned into shards, the forward pass, and the tasks that write every
layer's hidden states into the store shard by shard.
"""
