"""Pipeline presets: how much data, which filters, how many seeds and prompts per scale.

`smoke` proves the wiring on the tiny model; `quick` is the CPU-laptop run of the real model,
sized for a 2-core CPU (about 19 minutes, README); `study` is the published comparison (screening,
then finals measured along replayed target replies; hours, resumable); `scale` makes data at scale
on a CPU (1M reply tokens of the target's own text, generated and extracted in bfloat16 into a
training store of the default set's layers; hours, resumable) and trains the default head on it;
`full` is sized for a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import LayerwaveError
from store.paths import Workspace
from tasks.names import DEFAULT_STORE
from tasks.stats.token_filter import TokenFilter

# Each document's first token carries massive activations that swamp the statistics of the
# middle layers (SmolLM2: effective rank ~1.2 instead of ~175), so the pipeline drops it; sets are
# scored on this filter, and the entropy-filtered analysis runs beside it.
REFERENCE_FILTER = TokenFilter(drop_first_token=True)


@dataclass(frozen=True)
class PipelinePreset:
    store: str  # default store, so presets of one model never fight over a store
    tokens: int  # extraction budget (ShareGPT)
    max_length: int  # documents truncated to this many tokens
    entropy_quantile: float  # the token-entropy filtered analysis, beside the unfiltered one
    n_random: int  # random control sets
    candidates: int  # layer sets trained (default first, then methods, baselines, random)
    train_preset: str
    epochs: int | None  # overrides the training preset's
    seeds: tuple[int, ...]
    benches: tuple[str, ...]
    prompts: int
    max_new_tokens: int
    depth: int
    memory_gb: float = 4.0
    publish: str | None = None  # also copy the report, its plots and result rows to <publish>/<model>/
    # The target first writes its own replies to ShareGPT prompts (`layerwave generate`) and the
    # store is extracted from them: heads must predict the target's text. None: ShareGPT as is.
    generate_tokens: int | None = None  # reply-token budget of the generation
    generate_max_new_tokens: int = 256
    generate_turns: int = 1  # on a CPU, later turns re-read the whole conversation (prefill) for each reply
    generate_max_prompt_tokens: int = 512
    # Slots decoded together and conversations per committed shard: a shard ends by draining its slots,
    # so large budgets take large shards (64 slots over 256 conversations: 1.4x 32 over 64 on 2 cores).
    generate_batch_size: int = 32
    generate_shard_size: int = 64
    warm_start: bool = False  # start heads from the target's lm_head and norm; off: it did not help (README)
    # Screening (tasks/report/study.py): every candidate × seed trained for `screen_epochs` and scored by
    # τ_offline; only the `finalists` best (plus the default and the best random set) train fully.
    screen_epochs: int | None = None
    finalists: int = 4
    # τ of the benchmarks replayed along the target's own greedy replies, generated once per model
    # (tasks/decode/replay.py), instead of real decoding per head: no speed-up, but every prompt for every head.
    replay: bool = False
    # Heads train on a store of only the candidates' layers (their union) over this many tokens of the
    # same corpus: a larger budget than the all-layer analysis store's at a fraction of its bytes per
    # token. None: heads train on the analysis store.
    training_tokens: int | None = None
    # Generate and extract in bfloat16 where the device computes it natively (1.5-2x faster on a CPU
    # with avx512_bf16; the corpus and the states are then the bfloat16 model's). Elsewhere bfloat16
    # is emulated, many times slower, and the checkpoint's dtype is used instead.
    bfloat16_data: bool = False
    # The target's precision when heads are scored by real decoding (`layerwave evaluate
    # --precision`): auto is bfloat16 where native, what a user runs; float32 checks every output
    # token for token (the tiny model's presets, where bfloat16 only adds overhead).
    precision: str = "auto"

    def data_dtype(self, device) -> str:
        """`generate`/`extract --dtype` on `device` (a torch.device)."""
        from tasks.precision import bf16_native
        return "bfloat16" if self.bfloat16_data and bf16_native(device) else "auto"

    def training_store(self, store: str) -> str:
        """The store heads train on: the training store beside `store`, or `store` itself."""
        return Workspace(store).training_store() if self.training_tokens else store


PIPELINE_PRESETS = {
    "smoke": PipelinePreset(
        store="layerwave-smoke.zarr", tokens=2000, max_length=256, entropy_quantile=0.5, n_random=1, candidates=3,
        train_preset="smoke", epochs=2, seeds=(0,), benches=("mt-bench",), prompts=2, max_new_tokens=12, depth=3,
        memory_gb=1.0, generate_tokens=600, generate_max_new_tokens=24, training_tokens=2500, precision="float32"),
    "smoke-study": PipelinePreset(
        store="layerwave-smoke-study.zarr", tokens=2000, max_length=256, entropy_quantile=0.5, n_random=1,
        candidates=3, train_preset="smoke", epochs=2, seeds=(0,), benches=("mt-bench", "sharegpt"), prompts=2,
        max_new_tokens=12, depth=3, memory_gb=1.0, generate_tokens=600, generate_max_new_tokens=24,
        screen_epochs=1, finalists=1, replay=True, precision="float32"),
    "quick": PipelinePreset(
        store=DEFAULT_STORE, tokens=20000, max_length=2048, entropy_quantile=0.5, n_random=1, candidates=4,
        train_preset="quick", epochs=None, seeds=(0,), benches=("mt-bench",), prompts=5, max_new_tokens=64, depth=4,
        generate_tokens=16000),
    "study": PipelinePreset(
        store="layerwave-study.zarr", tokens=50000, max_length=2048, entropy_quantile=0.5, n_random=3, candidates=16,
        train_preset="quick", epochs=6, seeds=(0, 1, 2), benches=("mt-bench", "sharegpt"), prompts=40,
        max_new_tokens=128, depth=4, publish="results", generate_tokens=80000, screen_epochs=1, finalists=4,
        replay=True),
    "full": PipelinePreset(
        store="layerwave-full.zarr", tokens=2_000_000, max_length=2048, entropy_quantile=0.5, n_random=3,
        candidates=16, train_preset="full", epochs=None, seeds=(0, 1, 2), benches=("mt-bench", "sharegpt"),
        prompts=80, max_new_tokens=256, depth=6, memory_gb=32.0, generate_tokens=1_600_000,
        generate_turns=3, generate_max_prompt_tokens=1024),
    "scale": PipelinePreset(
        store="layerwave-scale.zarr", tokens=50000, max_length=2048, entropy_quantile=0.5, n_random=1,
        candidates=1, train_preset="quick", epochs=1, seeds=(0,), benches=("mt-bench",), prompts=40,
        max_new_tokens=128, depth=4, generate_tokens=1_000_000, generate_batch_size=128, generate_shard_size=512,
        training_tokens=1_500_000, bfloat16_data=True),
}


def preset_store(preset: str, store: str | None) -> str:
    """The store asked for, else the preset's own."""
    return store or pipeline_preset(preset).store


def pipeline_preset(name: str) -> PipelinePreset:
    if name not in PIPELINE_PRESETS:
        raise LayerwaveError(f"unknown pipeline preset {name!r}; use {', '.join(PIPELINE_PRESETS)}")
    return PIPELINE_PRESETS[name]
