"""The EAGLE-3 draft head, in one file.

    aux hidden states of k target layers ──fc──► fused (H)
    token embedding (frozen, the target's)     │
          │                                    │
     input_layernorm                       hidden_norm
          └──────────── concat (2H) ───────────┘
                           │
                  self-attention (2H → H)  + residual (fused)
                  post_attention_layernorm → MLP + residual
                           │
                 norm → lm_head over the draft vocabulary (d2t / t2d map it to the target's)

Training-time test (TTT) feeds the head its own output hidden state for later steps; step i's
queries attend causally to step 0's keys and to their own position in steps 1..i (rotary
positions shifted by i), what the head sees when it drafts i tokens ahead at inference. Module
names follow SpecForge (`midlayer`); the vLLM export renames it `layers.0`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DraftConfig:
    layers: list[int]  # HF hidden_states indices the head reads (DESIGN.md convention)
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192

    @classmethod
    def from_target(cls, target_config, layers: list[int], draft_vocab_size: int) -> "DraftConfig":
        rope = getattr(target_config, "rope_parameters", None) or {}
        return cls(layers=list(layers), hidden_size=target_config.hidden_size,
                   intermediate_size=target_config.intermediate_size,
                   num_attention_heads=target_config.num_attention_heads,
                   num_key_value_heads=target_config.num_key_value_heads,
                   head_dim=getattr(target_config, "head_dim", None)
                   or target_config.hidden_size // target_config.num_attention_heads,
                   vocab_size=target_config.vocab_size, draft_vocab_size=draft_vocab_size,
                   rms_norm_eps=target_config.rms_norm_eps,
                   rope_theta=float(rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))),
                   max_position_embeddings=target_config.max_position_embeddings)

    def as_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rotate(x, positions, theta: float):
    """Rotary position embedding (half-split convention, as Llama)."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions[..., None].float() * inv_freq  # (B, T, half)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # (B, 1, T, half)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    @torch.no_grad()
    def attend_self(self, std: float) -> None:
        """Start each query equal to its group's key, drawn with `std`: a position's score for
        itself is then |k|² (rotation changes nothing at distance 0), so attention starts near the
        diagonal and the token just fed reaches the residual whole, where default weights average
        it over the whole window."""
        nn.init.normal_(self.k_proj.weight, std=std)
        keys = self.k_proj.weight.view(self.c.num_key_value_heads, self.c.head_dim, -1)
        groups = self.c.num_attention_heads // self.c.num_key_value_heads
        self.q_proj.weight.copy_(keys.repeat_interleave(groups, dim=0).reshape_as(self.q_proj.weight))

    def _project(self, x, positions):
        """Queries, keys and values (B, heads, T, head_dim), rotated, keys/values repeated per group."""
        b, t, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = rotate(q, positions, c.rope_theta), rotate(k, positions, c.rope_theta)
        groups = c.num_attention_heads // c.num_key_value_heads
        return q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)

    def forward(self, x, positions, cache: list):
        """x (B, T, 2H). `cache` holds (k, v) of earlier TTT steps: [step 0, step 1, ...]; this
        step's (k, v) is appended. Step 0 is causal over itself; step i > 0 also sees, at each
        position, only that position's keys of steps 1..i."""
        b, t, _ = x.shape
        q, k, v = self._project(x, positions)
        cache.append((k, v))
        k0, v0 = cache[0]
        scale = math.sqrt(self.c.head_dim)
        scores = q @ k0.transpose(-1, -2) / scale  # (B, h, T, T)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()  # right padding needs no more
        scores = scores.masked_fill(~causal, float("-inf"))
        diagonal = [(q * ki).sum(-1, keepdim=True) / scale for ki, _ in cache[1:]]
        weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
        out = weights[..., :t] @ v0
        for step, (_, vi) in enumerate(cache[1:]):
            out = out + weights[..., t + step: t + step + 1] * vi
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def decode(self, x, positions, past):
        """Plain causal attention with a KV cache, for drafting: `past` is (k, v) of earlier
        positions or None; returns the output and the extended cache."""
        b, t, _ = x.shape
        q, k, v = self._project(x, positions)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        seen = k.shape[2] - t
        mask = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=seen)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


class MLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # on the token embedding
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)  # on the fused hidden state
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, embeds, hidden, positions, cache):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = hidden + self.self_attn(x, positions, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def decode(self, embeds, hidden, positions, past):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attended, past = self.self_attn.decode(x, positions, past)
        hidden = hidden + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), past


FROZEN = {"embed_tokens.weight"}  # the target's, never trained: checkpoints leave it out


class DraftHead(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        self.fc = nn.Linear(len(c.layers) * c.hidden_size, c.hidden_size, bias=False)
        self.midlayer = DecoderLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # d2t[i]: offset so that target id = i + d2t[i]; t2d[j]: target id j is in the draft vocab.
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        # A fixed factor per input channel before fc (1/RMS of its layer in the training store, or 1):
        # without it the deepest layer's states swamp the others (SmolLM2 [2, 15, 27]: RMS 2.6, 6, 24).
        # Not saved: `build_head` recomputes it from the store, and exports fold it into fc.weight.
        self.register_buffer("aux_scale", torch.ones(len(c.layers) * c.hidden_size), persistent=False)
        for module in (self.fc, self.midlayer, self.lm_head):
            for p in module.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

    def fuse(self, aux):
        """aux (B, T, k·H): the selected target layers concatenated in `config.layers` order, cast
        to the head's dtype (a bfloat16 head drafts from the target's float32 states)."""
        return self.fc((aux * self.aux_scale).to(self.fc.weight.dtype))

    def folded_state(self) -> dict:
        """The state dict with `aux_scale` folded into fc.weight: what runtimes load, as the same
        function of the raw states."""
        state = self.state_dict()
        state["fc.weight"] = self.fc.weight.detach() * self.aux_scale.to(self.fc.weight.dtype)
        return state

    def step(self, hidden, input_ids, positions, cache):
        """One draft step: next hidden state from (hidden, token) pairs."""
        return self.midlayer(self.embed_tokens(input_ids), hidden, positions, cache)

    def decode(self, hidden, input_ids, positions, past):
        """Drafting: like `step`, but attending to every cached earlier position (KV cache)."""
        return self.midlayer.decode(self.embed_tokens(input_ids), hidden, positions, past)

    def logits(self, hidden):
        return self.lm_head(self.norm(hidden))

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def resumable_state(self) -> dict:
        """The state a checkpoint needs: all but the frozen token embedding, which the target gives
        back on resume (Gemma-3's 262k × 640 would be 670 MB in each of a head's ~20 checkpoints)."""
        return {name: value for name, value in self.state_dict().items() if name not in FROZEN}

    def resume_from(self, state: dict) -> None:
        missing, unexpected = self.load_state_dict(state, strict=False)
        if unexpected or set(missing) - FROZEN:
            raise ValueError(f"checkpoint does not fit this head: missing {missing}, unexpected {unexpected}")


def draft_vocabulary(counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for the `size` most frequent target ids (ties and unseen ids by id), in id order."""
    order = torch.sort(-counts.long(), stable=True).indices[:size]  # stable: ties keep id order
    ids = torch.sort(order).values
    t2d = torch.zeros(len(counts), dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(len(ids)), t2d


def target_to_draft(t2d: torch.Tensor) -> torch.Tensor:
    """Target id → draft id (−1 when the id is not in the draft vocabulary)."""
    index = torch.full((len(t2d),), -1, dtype=torch.long, device=t2d.device)
    index[t2d] = torch.arange(int(t2d.sum()), device=t2d.device)
    return index
