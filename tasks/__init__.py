"""The work of every stage, one folder per stage in pipeline order: data (models, corpora, the
target's own replies) → extract → stats → select → heads → decode → report. Each folder holds
its stage's Prefect tasks and checks beside the plain functions they call (importable and
testable without Prefect); the modules here are shared by all stages: names, presets, stage
keys, progress, events, and the pipeline's own decisions."""
