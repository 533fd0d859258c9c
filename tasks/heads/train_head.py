"""Train an EAGLE-3 draft head for one layer set from the store, with checkpoints that resume exactly."""

from __future__ import annotations

import io
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from store import schema
from store.artefacts import write_bytes
from store.errors import LayerwaveError
from tasks.data import load_model
from tasks.heads.draft_head import DraftConfig, DraftHead, draft_vocabulary, target_to_draft
from tasks.heads.layer_use import LayerUse
from tasks.heads.offline_tau import simulate_documents, summarize_rounds
from tasks.heads.train_data import StoreBatches
from tasks.heads.ttt import unroll
from tasks.heads.warm_start import warm_start
from tasks.progress import rate_eta
from tasks.stage_key import without_later_defaults

PROGRESS_SECONDS = 10.0  # a training run prints at least this often


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int
    batch_size: int
    ttt_steps: int
    lr: float
    warmup_steps: int
    epochs: int
    eval_every: int
    grad_clip: float = 0.5
    weight_decay: float = 0.0
    draft_vocab_size: int = 32000
    holdout: float = 0.05
    seed: int = 0
    warm_start: bool = False  # lm_head rows and final norm from the target's (tasks/heads/warm_start.py)
    freeze_lm_head: bool = False  # keep the warm-started lm_head and final norm as the target's
    lm_head_lr_scale: float = 1.0  # their learning rate relative to the rest, when they train
    chain_depth: int = 4  # drafts per round in the offline τ recorded at each evaluation
    precision: str = "float32"  # or bfloat16: autocast over float32 master weights (tasks/precision.py)
    # The draft vocabulary: the most frequent target argmaxes over every training position ("argmax"),
    # or the most frequent loss-masked input tokens ("input", the first rule).
    draft_vocab_from: str = "argmax"
    layer_scaling: bool = False  # each layer divided by its RMS before fc (DraftHead.aux_scale)
    loss_on_prompt: bool = False  # also learn at prompt positions (the accuracy stays on replies)
    # Share of the steps that unroll one TTT step only, before the full unroll: a one-step window costs
    # about a third of a four-step one, so step 0 (the draft every round starts with) sees more
    # tokens in the same time; evaluations always unroll all `ttt_steps`.
    ttt_warmup: float = 0.0
    # Queries start equal to keys with this std (0: PyTorch's default init): attention starts on
    # the diagonal (DraftHead's Attention.attend_self).
    attend_self: float = 0.0


# Fields added to TrainConfig after heads were first published, at the value every earlier head had
# implicitly: left out of training keys and checkpoint checks there, so older heads keep theirs.
ADDED_LATER = {"precision": "float32", "layer_scaling": False, "loss_on_prompt": False, "ttt_warmup": 0.0,
               "attend_self": 0.0}


def recipe_identity(config: dict) -> dict:
    """A recipe (TrainConfig as a dict, possibly an older one) as keys and checkpoints compare it."""
    return without_later_defaults(config, ADDED_LATER)


PRESETS = {
    "smoke": TrainConfig(seq_len=64, batch_size=8, ttt_steps=3, lr=5e-3, warmup_steps=10, epochs=4, eval_every=50,
                         draft_vocab_size=4096),
    # batch 1: on a CPU's small stores the head is starved of optimizer steps, not of tokens per step;
    # prompt positions teach too, and TTT 4 trains every draft of a depth-4 chain (benchmarks/recipe.py);
    # one-step unrolls for the first 75% of steps, over twice the epochs in the same time, lift step-0
    # accuracy by 0.05 (benchmarks/ttt_warmup.py); attention that starts on the diagonal adds 0.016 to
    # the first draft and 0.04-0.05 to the later ones (benchmarks/attend_self.py)
    "quick": TrainConfig(seq_len=512, batch_size=1, ttt_steps=4, lr=1e-3, warmup_steps=30, epochs=6, eval_every=100,
                         draft_vocab_size=8192, loss_on_prompt=True, ttt_warmup=0.75, attend_self=0.05),
    "full": TrainConfig(seq_len=2048, batch_size=16, ttt_steps=7, lr=1e-4, warmup_steps=500, epochs=10,
                        eval_every=1000),
}



def stored_target(data: StoreBatches):
    """The target `data` was extracted from, as extraction loaded it."""
    return load_model.load(data.group.attrs["model"]["argument"], "cpu", data.group.attrs["extraction"]["dtype"])


def build_head(data: StoreBatches, config: TrainConfig, target=None) -> DraftHead:
    """A fresh head for `data`'s layers: target embeddings copied in, draft vocabulary from the
    target's argmax at every position of the training documents: what the head is taught to
    predict (counted on the input tokens instead, it covered 88% of held-out reply argmaxes at 8k
    ids on SmolLM2)."""
    group, layers = data.group, data.layers
    target = target or stored_target(data)
    vocab = target.model.config.vocab_size
    training = (data.doc >= 0) & ~data.heldout_docs[np.maximum(data.doc, 0)]
    if config.draft_vocab_from == "argmax":
        counted = group[schema.TOPK_IDS][:, 0][training]
    else:
        counted = group[schema.TOKEN_ID][:][training & group[schema.LOSS_MASK][:]]
    counts = torch.from_numpy(np.bincount(counted, minlength=vocab))
    torch.manual_seed(config.seed)
    head = DraftHead(DraftConfig.from_target(target.model.config, layers, min(config.draft_vocab_size, vocab)))
    d2t, t2d = draft_vocabulary(counts, head.config.draft_vocab_size)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(target.model.get_input_embeddings().weight.float())
        if config.layer_scaling:
            head.aux_scale.copy_(torch.from_numpy(1 / data.layer_rms()).float().repeat_interleave(head.config.hidden_size))
    if config.attend_self:
        head.midlayer.self_attn.attend_self(config.attend_self)
    if config.warm_start:
        warm_start(head, target.model)
    if config.freeze_lm_head:
        for p in (*head.lm_head.parameters(), *head.norm.parameters()):
            p.requires_grad_(False)
    return head


def parameter_groups(head: DraftHead, config: TrainConfig) -> list[dict]:
    """The lm_head and final norm in a group of their own, whose learning rate is scaled."""
    output = {id(p) for p in (*head.lm_head.parameters(), *head.norm.parameters())}
    trainable = [p for p in head.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in output], "scale": 1.0},
              {"params": [p for p in trainable if id(p) in output], "scale": config.lm_head_lr_scale}]
    return [g for g in groups if g["params"]]


def learning_rate(step: int, total: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10%."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@torch.no_grad()
def held_out_metrics(head: DraftHead, data: StoreBatches, config: TrainConfig, eos: int | None,
                     use: LayerUse | None = None) -> dict:
    """Held-out loss and accuracy per TTT step, and τ_offline of chain drafting along the held-out
    replies (meaningful when they are the target's own: a store of a regen: corpus); one read of the
    held-out shards serves both. `accuracy` is over every reply position (draft argmax = target
    argmax; an argmax outside the draft vocabulary is a miss), `coverage` the share of them whose
    argmax the draft vocabulary holds, `accuracy_in_vocab` the accuracy over those alone; with
    `use`, also `layer_use` (tasks/heads/layer_use.py) from the same batches."""
    index = target_to_draft(head.t2d)
    steps = config.ttt_steps
    loss, correct, covered, positions = (np.zeros(steps) for _ in range(4))
    gains = []
    for batches, documents in data.heldout_shards():
        for batch in batches:
            batch = batch.to(index.device)
            for i, r in enumerate(unroll(head, batch, index, steps)):
                loss[i] += float(r.loss) * r.covered
                correct[i] += r.correct
                covered[i] += r.covered
                positions[i] += r.positions
            if use:
                use.add(batch, index)
        gains += simulate_documents(head, documents, config.chain_depth, eos)
    if not positions.any():
        raise LayerwaveError("the held-out split has no loss-masked tokens; extract more --tokens")
    accuracy = correct / np.maximum(positions, 1)
    metrics = {"loss": (loss / np.maximum(covered, 1)).tolist(), "accuracy": accuracy.tolist(),
               "accuracy_in_vocab": (correct / np.maximum(covered, 1)).tolist(),
               "coverage": (covered / np.maximum(positions, 1)).tolist(), "tokens": positions.astype(int).tolist(),
               "tau_offline": summarize_rounds(gains, config.chain_depth)}
    return metrics | ({"layer_use": use.summary(float(accuracy[0]), int(positions[0]))} if use else {})


def train(store: str, model_key: str, layers: list[int], out: Path, config: TrainConfig,
          log: Callable[[str], None] = print, stop_after: int | None = None,
          device: torch.device = torch.device("cpu")) -> tuple[DraftHead, dict]:
    """Train (or resume) on `device`; returns the head (on the CPU) and its training record.
    `stop_after` ends early, as a kill after that step's checkpoint would."""
    data = StoreBatches(store, model_key, layers, seq_len=config.seq_len, batch_size=config.batch_size,
                        seed=config.seed, holdout=config.holdout)
    per_epoch = len(data.plan(0))
    if per_epoch == 0 and not data.loss_mask.any():
        raise LayerwaveError("no training windows: the store holds no assistant reply to learn from (a prompt-only "
                             "corpus such as mt-bench?); extract a corpus with replies: sharegpt or regen:DIR")
    if per_epoch == 0:
        raise LayerwaveError("no training windows: the store has no training documents; extract more --tokens")
    total = per_epoch * config.epochs
    source = data.group.attrs["plan_hash"]
    checkpoint = out / "checkpoint.pt"
    target = stored_target(data)  # loaded once: its embeddings seed the head, its EOS ends replies
    head = build_head(data, config, target).to(device)
    eos = target.tokenizer.eos_token_id
    # the fused kernel: one pass over the weights instead of a dozen foreach passes, a sixth of a
    # one-step unroll on a 2-core CPU (benchmarks/train.py)
    optimizer = torch.optim.AdamW(parameter_groups(head, config), lr=config.lr, weight_decay=config.weight_decay,
                                  fused=device.type in ("cpu", "cuda"))
    step, history, untrained, passes_before, seconds_before = 0, [], None, 0, 0.0
    if checkpoint.exists():
        state = torch.load(io.BytesIO(checkpoint.read_bytes()), weights_only=False, map_location=device)
        if ((state["layers"], recipe_identity(state["config"]), state["source"])
                != (layers, recipe_identity(asdict(config)), source)):
            raise LayerwaveError(f"{checkpoint} belongs to another run (layers, preset or data differ); "
                                 "use another --out or delete it")
        head.resume_from(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        step, history, untrained = state["step"], state["history"], state["untrained"]
        passes_before, seconds_before = state.get("token_passes", 0), state.get("training_seconds", 0.0)
        log(f"resuming from step {step}/{total}")
    else:
        untrained = held_out_metrics(head, data, config, eos)
    index = target_to_draft(head.t2d)
    weights = [0.8 ** i for i in range(config.ttt_steps)]
    warmup_steps = round(config.ttt_warmup * total)
    started, tokens, first_step = time.perf_counter(), 0, step
    evaluated = 0.0  # seconds of held-out evaluation, left out of the training rate
    progress_every = max(1, math.ceil(total / 10))  # a resume point
    last_line = started

    def so_far() -> tuple[int, float]:
        """Token-passes and training seconds since the head's first step, across resumes."""
        return passes_before + tokens, seconds_before + time.perf_counter() - started - evaluated

    def progress_line() -> str:
        elapsed = time.perf_counter() - started
        return (f"step {step}/{total} loss {loss.item():.3f}, {tokens / elapsed:.0f} training tokens/s"
                + rate_eta(step - first_step, total - first_step, elapsed))
    while step < total and (stop_after is None or step < stop_after):
        epoch, offset = divmod(step, per_epoch)
        for batch in data.batches(data.plan(epoch), skip=offset):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, total, config) * group["scale"]
            with torch.autocast(device.type, torch.bfloat16, enabled=config.precision == "bfloat16"):
                unrolled = 1 if step < warmup_steps else config.ttt_steps
                results = unroll(head, batch.to(device), index, unrolled, everywhere=config.loss_on_prompt,
                                 scored=False)
                loss = sum(w * r.loss for w, r in zip(weights, results))
            if not torch.isfinite(loss):
                raise LayerwaveError(f"training loss became {loss.item()} at step {step}; the last good checkpoint "
                                     f"is {checkpoint if checkpoint.exists() else 'not written yet'}; lower the lr")
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in head.parameters() if p.requires_grad], config.grad_clip)
            optimizer.step()
            step, tokens = step + 1, tokens + batch.tokens
            if step % config.eval_every == 0 or step == total:
                evaluating = time.perf_counter()
                metrics = held_out_metrics(head, data, config, eos, LayerUse(head, config.seed) if step == total else None)
                evaluated += time.perf_counter() - evaluating
                history.append({"step": step, "train_loss": loss.item(), **metrics})
                log(f"step {step}/{total} loss {loss.item():.3f} held-out accuracy per TTT step "
                    + " ".join(f"{a:.3f}" for a in metrics["accuracy"])
                    + f", τ_offline {metrics['tau_offline']['tau']:.3f} ({metrics['tau_offline']['rounds']} rounds)")
                _save(checkpoint, head, optimizer, step, history, untrained, layers, config, source, so_far())
                last_line = time.perf_counter()
            elif step % progress_every == 0:  # between evaluations: a progress line and a resume point
                log(progress_line())
                _save(checkpoint, head, optimizer, step, history, untrained, layers, config, source, so_far())
                last_line = time.perf_counter()
            elif time.perf_counter() - last_line >= PROGRESS_SECONDS:
                log(progress_line())
                last_line = time.perf_counter()
            if step >= total or (stop_after is not None and step >= stop_after):
                break
    token_passes, seconds = so_far()
    _save(checkpoint, head, optimizer, step, history, untrained, layers, config, source, (token_passes, seconds))
    use = history[-1].get("layer_use") if history else None
    if use:
        log("held-out step-0 accuracy with one layer's states shuffled: "
            + ", ".join(f"layer {layer} {value:.3f}" for layer, value in use["shuffled"].items())
            + f" (none shuffled {use['accuracy']:.3f})")
    return head.cpu(), {"layers": layers, "model": model_key, "data_plan_hash": source, "config": asdict(config),
            "steps": step, "total_steps": total, "trainable_parameters": head.trainable_parameters(),
            "untrained": untrained, "history": history, "final": history[-1] if history else untrained,
            "token_passes": token_passes, "tokens_per_s": token_passes / seconds if seconds > 0 else None,
            "finished": step >= total}


def _save(path: Path, head, optimizer, step, history, untrained, layers, config, source, so_far) -> None:
    """Write the checkpoint whole or not at all: a kill mid-write leaves the previous one intact.
    `so_far` (token-passes, training seconds) lets a resumed head's record count the whole run."""
    buffer = io.BytesIO()
    torch.save({"head": head.resumable_state(), "optimizer": optimizer.state_dict(), "step": step, "history": history,
                "untrained": untrained, "layers": layers, "config": asdict(config), "source": source,
                "token_passes": so_far[0], "training_seconds": so_far[1]}, buffer)
    write_bytes(path, buffer.getvalue())


def preset(name: str, **overrides) -> TrainConfig:
    if name not in PRESETS:
        raise LayerwaveError(f"unknown --preset {name!r}; use {', '.join(PRESETS)}")
    for option in ("epochs", "ttt_steps"):
        if overrides.get(option) is not None and overrides[option] < 1:
            raise LayerwaveError(f"--{option.replace('_', '-')} must be at least 1 (got {overrides[option]})")
    if overrides.get("seed") is not None and overrides["seed"] < 0:
        raise LayerwaveError(f"--seed must be >= 0 (got {overrides['seed']})")
    if overrides.get("lm_head_lr_scale") is not None and overrides["lm_head_lr_scale"] < 0:
        raise LayerwaveError(f"--lm-head-lr-scale must be >= 0 (got {overrides['lm_head_lr_scale']})")
    if overrides.get("ttt_warmup") is not None and not 0 <= overrides["ttt_warmup"] < 1:
        raise LayerwaveError(f"--ttt-warmup is a share of the steps, in [0, 1) (got {overrides['ttt_warmup']})")
    if overrides.get("attend_self") is not None and overrides["attend_self"] < 0:
        raise LayerwaveError(f"--attend-self is the std of the shared query/key init, >= 0 (got {overrides['attend_self']})")
    if overrides.get("draft_vocab_from") not in (None, "argmax", "input"):
        raise LayerwaveError(f"draft_vocab_from must be argmax or input (got {overrides['draft_vocab_from']!r})")
    config = replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})
    if config.freeze_lm_head and not config.warm_start:
        raise LayerwaveError("--freeze-lm-head keeps the lm_head as it starts; it needs --warm-start")
    return config
