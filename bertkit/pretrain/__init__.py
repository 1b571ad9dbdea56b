"""Pretraining: `pretrain(PretrainConfig(...))` trains BERT (MLM + NSP) on an instances folder under DeepSpeed;
`export(run_dir, out_dir)` writes a checkpoint in HF format.

  config.py       PretrainConfig (the flags) and their merge with a DeepSpeed config into DeepSpeedSettings
  train.py        the loop on one screen: micro-steps -> roll back? -> log -> evaluate -> save -> stop?
  run.py          start_run: settings, engine, run folder, resumed state, data -> the Run the loop drives
  start.py        the model a run starts from (its family, --init-from, the resumed run's shape)
  divergence.py   non-finite losses and spikes: stop, or roll back to the last good checkpoint
  checkpoints.py  the run folder: start/resume checks, checkpoints with RNG state, fp32 weights, export
  resume.py       what a --resume keeps, applies and records; budget.py time budgets; plateau.py the plateau note
  metrics.py      Meter, MetricsLog (JSON lines, TensorBoard, progress bar), MFU

The run folder (names in bertkit.formats):
  config.json              the resolved settings, the model shape and the vocabulary's sha256 (checked on --resume)
  deepspeed_config.json    the DeepSpeed config actually used (generated from flags, merged with --deepspeed-config)
  deepspeed_user_config.json  --deepspeed-config as given, what --resume reads (outputs it names kept inside the run)
  tokenizer/               the instances folder's vocabulary and tokenizer files (export copies them)
  checkpoints/global_stepN DeepSpeed checkpoints + per-rank RNG state; written as global_stepN.partial, then renamed;
  checkpoints/latest       the last complete one (written atomically after the rename)
  metrics.jsonl            one JSON object per logged step / evaluation; a resumed run appends (later lines win)
  tensorboard/             when tensorboard is installed
"""
from bertkit.pretrain.checkpoints import export, load_run_state_dict
from bertkit.pretrain.config import ConfigError, DeepSpeedSettings, PretrainConfig, TrainingError
from bertkit.pretrain.train import pretrain

__all__ = ["ConfigError", "DeepSpeedSettings", "PretrainConfig", "TrainingError", "export", "load_run_state_dict",
           "pretrain"]
