"""Names, version and conventions of the activation store, in one place so readers and writers agree."""

from __future__ import annotations

SCHEMA_VERSION = 1

# Dimension names as xarray shows them.
LAYER, TOKEN, HIDDEN, TOPK, SHARD = "layer", "token", "hidden", "topk", "shard"

# The hidden-state array is called `hidden_states` (HF's name) because xarray turns a variable
# that shares its name with one of its dimensions (`hidden`) into a coordinate.
HIDDEN_STATES = "hidden_states"
TOKEN_ID, DOC, POSITION = "token_id", "doc", "position"
ENTROPY, LOSS_MASK = "entropy", "loss_mask"
TOPK_IDS, TOPK_LOGPROBS = "target_topk_ids", "target_topk_logprobs"
SHARD_COMMITTED = "shard_committed"

LAYER_CONVENTION = (
    "hf-output-hidden-states: layer 0 = embedding output, layer k = output of decoder layer k-1 "
    "(input of decoder layer k), layer N = last entry (after the final norm for Llama-family "
    "models). EAGLE-3 default = [2, N//2, N-3]. SGLang/SpecForge ids = layer - 1; vLLM "
    "speculators ids = layer."
)

LABELS_DOC = (
    "target_topk_ids/target_topk_logprobs at token t: the target model's top-k next-token ids and "
    "log-probabilities after reading tokens 0..t of the document (full-vocabulary log-softmax). "
    "entropy at t: predictive entropy of that same distribution, in nats. The full distribution "
    "can be recomputed from hidden_states at layer N with the target's lm_head."
)

