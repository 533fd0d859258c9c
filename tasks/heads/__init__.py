"""Draft heads: the EAGLE-3 head in one file, its batches from the store, the TTT unroll, the
training loop and its task, warm start, export for vLLM/SGLang, and offline τ.
"""
