"""Data the stages start from: the model registry and loading, corpora, chat rendering,
evaluation prompts, and the target's own replies (`layerwave generate`).
"""
