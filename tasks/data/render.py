"""Render a conversation with the model's chat template and mark the assistant tokens.

The loss mask comes from character spans: the text of each assistant reply is what rendering
the conversation up to and including it adds to rendering it up to the generation prompt. This
works for any template that renders prefixes as prefixes, and is checked.
"""

from __future__ import annotations

import numpy as np

from store.errors import LayerwaveError


def render(tokenizer, conversation) -> tuple[np.ndarray, np.ndarray]:
    """(token ids int32, loss_mask bool): loss_mask marks assistant reply tokens, end-of-turn included.
    A generated conversation brings its own exact tokens (tasks/data/regen_corpus.py) and keeps them."""
    if hasattr(conversation, "token_ids"):
        return np.asarray(conversation.token_ids, dtype=np.int32), np.asarray(conversation.loss_mask, dtype=bool)
    messages = list(conversation)
    ends_with_prompt = messages[-1]["role"] != "assistant"
    text = _template(tokenizer, messages, add_generation_prompt=ends_with_prompt)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _template(tokenizer, messages[:i], add_generation_prompt=True)
        through = _template(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not (through.startswith(before) and text.startswith(through)):
            raise LayerwaveError("the model's chat template does not render conversations prefix by prefix; "
                                 "assistant tokens cannot be located")
        spans.append((len(before), len(through)))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(encoded["input_ids"], dtype=np.int32)
    starts = np.asarray([start for start, _ in encoded["offset_mapping"]], dtype=np.int64)
    mask = np.zeros(len(ids), dtype=bool)
    for start, end in spans:
        mask |= (starts >= start) & (starts < end)
    return ids, mask


def _template(tokenizer, messages, add_generation_prompt: bool) -> str:
    if tokenizer.chat_template is None:
        raise LayerwaveError("the model's tokenizer has no chat template; give a checkpoint with one")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
