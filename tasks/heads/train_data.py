"""Draft-training batches streamed from the store, one shard at a time (memory bounded by a shard).

A head for layers S reads `hidden_states[S]` and the target's labels; the target model never runs.
Documents are split into windows of at most `seq_len` tokens; a seeded share of documents is held
out for evaluation. The order of batches is a pure function of (seed, epoch), so a resumed run
sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from store import paths, schema
from store.access import open_group
from store.dtypes import decode
from store.layout import Layout
from tasks.extract.plan import documents_in
from tasks.select.layer_ids import check_stored


@dataclass
class Batch:
    aux: torch.Tensor  # float32 (B, T, k·H): selected layers concatenated in the order asked
    input_ids: torch.Tensor  # long (B, T)
    positions: torch.Tensor  # long (B, T): position in the document
    valid: torch.Tensor  # bool (B, T): inside the window (not padding)
    loss_mask: torch.Tensor  # bool (B, T)
    label_ids: torch.Tensor  # long (B, T, K): the target's top-K next-token ids at each token
    label_logprobs: torch.Tensor  # float32 (B, T, K)

    @property
    def tokens(self) -> int:
        return int(self.valid.sum())

    def to(self, device: torch.device) -> "Batch":
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def heldout_documents(n_docs: int, fraction: float, seed: int) -> np.ndarray:
    """A seeded share of documents held out (at least one and, below a fraction of 1, at most all
    but one); a fraction of 1 holds out every document: a store kept for evaluation only."""
    if fraction >= 1:
        return np.ones(n_docs, dtype=bool)
    count = min(n_docs - 1, max(1, round(fraction * n_docs))) if n_docs >= 2 else 0
    heldout = np.zeros(n_docs, dtype=bool)
    heldout[np.random.default_rng([seed, 1]).permutation(n_docs)[:count]] = True
    return heldout


class StoreBatches:
    def __init__(self, store: str, model_key: str, layers: list[int], *, seq_len: int, batch_size: int, seed: int,
                 holdout: float = 0.05):
        self.group = open_group(store, paths.activations(model_key))
        self.layout = Layout(**self.group.attrs["layout"])
        self.layers, self.seq_len, self.batch_size, self.seed = list(layers), seq_len, batch_size, seed
        stored = self.layout.stored_layers  # a training store keeps only some layers: find each by its HF index
        check_stored(self.layers, stored, store, model_key)
        self.slots = [stored.index(layer) for layer in self.layers]
        self.doc = self.group[schema.DOC][:]  # read once: every epoch's plan splits it again
        self.loss_mask = self.group[schema.LOSS_MASK][:]
        self.n_docs = int(self.doc.max()) + 1 if len(self.doc) else 0
        self.heldout_docs = heldout_documents(self.n_docs, holdout, seed)

    def windows(self, shard: int, heldout: bool) -> list[tuple[int, int]]:
        """(start, stop) store token ranges of this shard's windows in the chosen split; windows
        that teach nothing (no loss-masked token with a next token) are left out."""
        start, stop = self.layout.shard_range(shard)
        doc = self.doc[start:stop]
        out = []
        for a, b in documents_in(doc):
            if self.heldout_docs[doc[a]] != heldout:
                continue
            spans = [(start + w, start + min(w + self.seq_len, b)) for w in range(a, b, self.seq_len)]
            out += [(w, e) for w, e in spans if e - w >= 2 and self.loss_mask[w: e - 1].any()]
        return out

    def plan(self, epoch: int, heldout: bool = False) -> list[tuple[int, list[tuple[int, int]]]]:
        """(shard, windows) per batch, in training order: shards and windows shuffled per epoch."""
        rng = np.random.default_rng([self.seed, epoch])
        order = range(self.layout.n_shards) if heldout else rng.permutation(self.layout.n_shards)
        plan = []
        for shard in order:
            windows = self.windows(int(shard), heldout)
            if not heldout:
                windows = [windows[i] for i in rng.permutation(len(windows))]
            plan += [(int(shard), windows[i: i + self.batch_size]) for i in range(0, len(windows), self.batch_size)]
        return plan

    def batches(self, plan, skip: int = 0):
        """Materialise planned batches (after skipping `skip`), reading each shard once."""
        cached_shard, arrays = None, None
        for shard, windows in plan[skip:]:
            if shard != cached_shard:
                cached_shard, arrays = shard, self._read_shard(shard)
            yield self._batch(arrays, self.layout.shard_range(shard)[0], windows)

    def heldout_shards(self):
        """Each shard holding held-out documents, its arrays read once: (its held-out batches, as
        `batches(plan(0, heldout=True))` gives them, lazily; its held-out documents as
        (aux, token_id, position, loss_mask)), so every held-out measure shares one read."""
        for shard in range(self.layout.n_shards):
            start, stop = self.layout.shard_range(shard)
            doc = self.doc[start:stop]
            spans = [(a, b) for a, b in documents_in(doc) if self.heldout_docs[doc[a]]]
            if not spans:
                continue
            arrays = self._read_shard(shard)
            windows = self.windows(shard, heldout=True)
            batches = (self._batch(arrays, start, windows[i: i + self.batch_size])
                       for i in range(0, len(windows), self.batch_size))
            yield batches, [tuple(arrays[name][a:b] for name in ("aux", "token_id", "position", "loss_mask"))
                            for a, b in spans]

    def layer_rms(self, max_tokens: int = 65536) -> np.ndarray:
        """RMS of each layer asked (in order) over the training documents' tokens of the first
        shards, up to `max_tokens`; each document's first token is left out (its massive
        activations would set the scale alone)."""
        hidden, position = self.group[schema.HIDDEN_STATES], self.group[schema.POSITION]
        sums, count = np.zeros(len(self.slots)), 0
        for shard in range(self.layout.n_shards):
            start, stop = self.layout.shard_range(shard)
            doc = self.doc[start:stop]
            keep = (doc >= 0) & ~self.heldout_docs[np.maximum(doc, 0)] & (position[start:stop] > 0)
            for i, slot in enumerate(self.slots):
                states = decode(hidden[slot, start:stop])[keep].astype(np.float64)
                sums[i] += np.square(states).mean(-1).sum()
            count += int(keep.sum())
            if count >= max_tokens:
                break
        return np.sqrt(sums / max(count, 1))

    def _read_shard(self, shard: int) -> dict:
        start, stop = self.layout.shard_range(shard)
        hidden = self.group[schema.HIDDEN_STATES]
        # one read per layer, in the order asked (a head reads exactly the layers it was built for)
        aux = np.concatenate([decode(hidden[slot, start:stop]) for slot in self.slots], axis=-1)
        return {"aux": aux, "token_id": self.group[schema.TOKEN_ID][start:stop],
                "position": self.group[schema.POSITION][start:stop],
                "loss_mask": self.group[schema.LOSS_MASK][start:stop],
                "label_ids": self.group[schema.TOPK_IDS][start:stop],
                "label_logprobs": self.group[schema.TOPK_LOGPROBS][start:stop]}

    def _batch(self, arrays: dict, offset: int, windows) -> Batch:
        width = max(b - a for a, b in windows)
        rows = len(windows)

        def take(name, fill, dtype):
            source = arrays[name]
            out = np.full((rows, width) + source.shape[1:], fill, dtype=dtype)
            for r, (a, b) in enumerate(windows):
                out[r, : b - a] = source[a - offset: b - offset]
            return torch.from_numpy(out)

        valid = torch.zeros(rows, width, dtype=torch.bool)
        for r, (a, b) in enumerate(windows):
            valid[r, : b - a] = True
        return Batch(aux=take("aux", 0.0, np.float32), input_ids=take("token_id", 0, np.int64),
                     positions=take("position", 0, np.int64), valid=valid,
                     loss_mask=take("loss_mask", False, bool), label_ids=take("label_ids", 0, np.int64),
                     label_logprobs=take("label_logprobs", -np.inf, np.float32))
