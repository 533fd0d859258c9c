"""Decoding: speculative decoding (chain, tree), the decoders compared side by side, the
cost-aware depth, the round profile, replayed τ, and the evaluation stage's tasks.
"""
