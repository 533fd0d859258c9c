"""One shard's forward passes: every hidden state of every layer, plus the target's labels.

Pure torch, no Prefect or Zarr: documents in, float32 arrays out, so it can be tested against a
direct Hugging Face forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

CPU_BATCH_TOKENS = 2048


@dataclass
class ShardOutputs:
    hidden: torch.Tensor  # float32 (layers, tokens, hidden)
    entropy: np.ndarray  # float32 (tokens,) nats
    topk_ids: np.ndarray  # int32 (tokens, k)
    topk_logprobs: np.ndarray  # float32 (tokens, k)


def auto_batch_tokens(device: torch.device, n_layers: int, hidden_size: int, vocab_size: int) -> int:
    """Tokens per forward: fixed on CPU, sized to a quarter of free memory on CUDA."""
    if device.type != "cuda":
        return CPU_BATCH_TOKENS
    free, _ = torch.cuda.mem_get_info(device)
    per_token = 4 * (n_layers * hidden_size + 3 * vocab_size)
    budget = free // 4 // per_token
    return int(max(CPU_BATCH_TOKENS, min(1 << 17, 1 << (int(budget).bit_length() - 1))))


def batches(documents: list[tuple[int, int]], batch_tokens: int) -> list[list[tuple[int, int]]]:
    """Group documents (longest first, to pad little) so each padded batch fits `batch_tokens`."""
    ordered = sorted(documents, key=lambda d: (-(d[1] - d[0]), d[0]))
    groups, current = [], []
    for document in ordered:
        longest = (current[0][1] - current[0][0]) if current else document[1] - document[0]
        if current and longest * (len(current) + 1) > batch_tokens:
            groups.append(current)
            current = []
        current.append(document)
    return groups + ([current] if current else [])


def next_token_labels(logits: torch.Tensor, topk: int, rows: int = 64):
    """(entropy in nats, top-k log-probs, top-k ids) per position, in float32.

    Done a few rows at a time: full-vocabulary temporaries for a whole batch cost more in memory
    traffic than the arithmetic itself.
    """
    entropy, values, indices = [], [], []
    for part in logits.float().split(rows):
        peak = part.max(dim=-1, keepdim=True).values
        weights = torch.exp(part - peak)  # one exponential pass serves both sums
        total = weights.sum(-1, keepdim=True)
        log_normalizer = peak + torch.log(total)
        entropy.append(log_normalizer[:, 0] - (weights * part).sum(-1) / total[:, 0])
        top_values, top_indices = part.topk(topk, dim=-1)
        values.append(top_values - log_normalizer)
        indices.append(top_indices)
    return torch.cat(entropy), torch.cat(values), torch.cat(indices)


def padded_batch(token_id: np.ndarray, group: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of documents (offsets into `token_id`), right-padded."""
    width = max(stop - start for start, stop in group)
    input_ids = torch.zeros((len(group), width), dtype=torch.long)
    attention = torch.zeros((len(group), width), dtype=torch.long)
    for row, (start, stop) in enumerate(group):
        input_ids[row, : stop - start] = torch.from_numpy(token_id[start:stop].astype(np.int64))
        attention[row, : stop - start] = 1
    return input_ids, attention


@torch.inference_mode()
def forward_shard(model, device: torch.device, token_id: np.ndarray, documents, batch_tokens: int, topk: int,
                  layers: list[int] | None = None) -> ShardOutputs:
    """Run the model over a shard's documents (offsets into `token_id`) and gather its outputs:
    the hidden states of `layers` (HF indices; None: every one). Positions outside every document
    (padding) keep what the store's arrays are filled with: zeros, NaN entropy, no labels."""
    n_tokens = len(token_id)
    kept = layers if layers is not None else list(range(model.config.num_hidden_layers + 1))
    hidden = torch.zeros((len(kept), n_tokens, model.config.hidden_size), dtype=torch.float32)
    entropy = np.full(n_tokens, np.nan, dtype=np.float32)
    topk_ids = np.full((n_tokens, topk), -1, dtype=np.int32)
    topk_logprobs = np.full((n_tokens, topk), np.nan, dtype=np.float32)
    for group in batches(documents, batch_tokens):
        input_ids, attention = padded_batch(token_id, group)
        out = model(input_ids=input_ids.to(device), attention_mask=attention.to(device), output_hidden_states=True)
        for row, (start, stop) in enumerate(group):
            n = stop - start
            for slot, layer in enumerate(kept):
                hidden[slot, start:stop] = out.hidden_states[layer][row, :n].float().cpu()
            row_entropy, values, indices = next_token_labels(out.logits[row, :n], topk)
            entropy[start:stop] = row_entropy.cpu().numpy()
            topk_ids[start:stop] = indices.cpu().numpy()
            topk_logprobs[start:stop] = values.cpu().numpy()
    return ShardOutputs(hidden, entropy, topk_ids, topk_logprobs)
