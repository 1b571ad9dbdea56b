"""The run folder and its checkpoints: start or resume a run, save and load DeepSpeed checkpoints with every rank's
RNG state, read a checkpoint's fp32 weights (any ZeRO stage), export them in HF format.

A checkpoint is written as checkpoints/global_stepN.partial on every rank; when all ranks are done, checkpoint.json
(every file's size and checksum, ZeRO's per-rank shards included) is written last and the folder renamed to
global_stepN. Only such a complete checkpoint counts: --resume, --init-from and export take the newest one whose
files still verify, and say which newer ones they skipped and why; pruning (--keep-last) counts only complete ones,
so it never deletes the only good checkpoint.

On several nodes the run folder must be one folder every node sees (a shared file system): every rank writes its
own files (ZeRO shards, rng_rank{global rank}.pt) into the same checkpoint folder, and global rank 0 alone writes
everything else (the lock, config.json, metrics, checkpoint.json, the rename, `latest`, pruning).
"""
import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

from bertkit.errors import DamagedFileError, regular_file
from bertkit.fileio import (
    LOCK_FILE,
    FolderLockedError,
    atomic_copy,
    atomic_write_bytes,
    atomic_write_json,
    disk_errors,
    file_entry,
    file_matches,
    folder_lock,
    read_json_or_none,
)
from bertkit.formats import (
    CHECKPOINT_MARKER,
    CHECKPOINTS,
    DEEPSPEED_CONFIG,
    MANIFEST,
    RUN_CONFIG,
    RUN_TOKENIZER,
    TOKENIZER_FILES,
    USER_DEEPSPEED_CONFIG,
    CheckpointMarker,
    ExportManifest,
    FormatError,
    InstancesManifest,
    RunConfig,
    RunError,
    listed_file,
    read_run_config,
    write_manifest,
    write_run_config,
)
from bertkit.models import build_pretraining, family_of, save_pretrained
from bertkit.models.sentence_embeddings import write_sentence_transformers_files
from bertkit.outputs import Output, refuse_other_inputs, staged_files, staging_folder, swap_in
from bertkit.pretrain.config import ConfigError, DeepSpeedSettings, PretrainConfig, TrainingError
from bertkit.pretrain.model_card import data_facts, model_card
from bertkit.rng import rng_state, set_rng_state
from bertkit.safe_load import UnsafeCheckpointError, first_unsafe_file, refusing_code, safe_load

LATEST = "latest"   # DeepSpeed's pointer, still written; bertkit chooses by checkpoint.json


@dataclass
class Chosen:
    """The checkpoint a resume, an --init-from or an export uses, and the newer ones passed over."""
    tag: str | None
    marker: CheckpointMarker | None
    skipped: list          # "global_stepN: why" for every newer checkpoint that was not usable
    unsafe: tuple | None = None   # (file, the names it would import) when the chosen one would run code

    def refuse_unsafe(self) -> None:
        if self.unsafe:
            raise UnsafeCheckpointError(*self.unsafe)


def checkpoint_steps(ckpt: Path) -> list[int]:
    """Steps of the global_stepN folders (complete or not), ascending."""
    steps = []
    for p in ckpt.glob("global_step*"):
        if p.is_dir() and p.name[len("global_step"):].isdigit():
            steps.append(int(p.name[len("global_step"):]))
    return sorted(steps)


def read_marker(folder: Path) -> CheckpointMarker | None:
    data = read_json_or_none(folder / CHECKPOINT_MARKER)
    if not isinstance(data, dict):
        return None
    try:
        return CheckpointMarker(**data)
    except TypeError:
        return None


def checkpoint_problems(folder: Path, marker: CheckpointMarker, checksums: bool = True) -> list[str]:
    """What is wrong with a complete checkpoint's files (missing, size, checksum); empty when it verifies."""
    problems = []
    for rel, entry in sorted(marker.files.items()):
        try:
            path = listed_file(folder, rel, folder / CHECKPOINT_MARKER)
        except FormatError as e:
            problems.append(str(e))
            continue
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != entry["bytes"]:
            problems.append(f"{rel} has {path.stat().st_size:,} bytes, checkpoint.json says {entry['bytes']:,}")
        elif checksums and not file_matches(path, entry["checksum"]):
            problems.append(f"{rel} does not match its checksum")
    return problems


def find_checkpoint(run_dir) -> Chosen:
    """The newest complete checkpoint whose files verify (sizes and checksums), and whether any of its pickles
    would import more than plain data (Chosen.unsafe, read from the opcodes, nothing run). A checkpoint from before
    markers existed is used only when `latest` names it and no complete one verifies (with a warning in
    `skipped`)."""
    ckpt = Path(run_dir) / CHECKPOINTS
    skipped = []
    for step in reversed(checkpoint_steps(ckpt)):
        folder = ckpt / f"global_step{step}"
        marker = read_marker(folder)
        if marker is None:
            skipped.append(f"{folder.name}: no {CHECKPOINT_MARKER} (killed while saving, or damaged)")
            continue
        problems = checkpoint_problems(folder, marker)
        if problems:
            skipped.append(f"{folder.name}: {'; '.join(problems)}")
            continue
        return Chosen(folder.name, marker, skipped, first_unsafe_file(folder))
    legacy = (ckpt / LATEST).read_text().strip() if (ckpt / LATEST).is_file() else None
    if legacy and (ckpt / legacy).is_dir() and read_marker(ckpt / legacy) is None:
        skipped.append(f"{legacy}: used without verification (written before bertkit recorded checksums)")
        return Chosen(legacy, None, skipped, first_unsafe_file(ckpt / legacy))
    return Chosen(None, None, skipped)


def choose_checkpoint(run_dir, rank: int, say=None) -> Chosen:
    """find_checkpoint on rank 0 only (it reads every file once), shared with the other ranks."""
    box = [find_checkpoint(run_dir) if rank == 0 else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    chosen = box[0]
    chosen.refuse_unsafe()  # on every rank: all stop with the same message, none waits on the others
    if rank == 0 and say is not None:
        for why in chosen.skipped:
            say(f"skipped checkpoint {why}")
    return chosen


# ---------------------------------------------------------------- starting or resuming a run

@contextlib.contextmanager
def run_folder_lock(run_dir: Path, rank: int):
    """Global rank 0 holds RUN/.bertkit.lock for the whole run; when another process holds it, every rank stops.
    Every other rank must then see that lock: a run folder that is not shared by all nodes stops here, not at the
    first checkpoint."""
    with contextlib.ExitStack() as stack:
        error, holder = None, None
        if rank == 0:
            try:
                stack.enter_context(folder_lock(run_dir, "pretrain", lambda m: print(m, file=sys.stderr)))
                holder = {"host": socket.gethostname(), "pid": os.getpid()}
            except FolderLockedError as e:
                error = str(e)
        box = [error, holder]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0)
            if box[0] is None:
                box[0] = _unshared_run_folder(run_dir, box[1])
        if box[0]:
            raise ConfigError(box[0])
        yield


def _unshared_run_folder(run_dir: Path, holder: dict) -> str | None:
    """None when every rank sees rank 0's lock in run_dir, else the error every rank raises."""
    def sees_lock():
        lock = read_json_or_none(run_dir / LOCK_FILE)
        return isinstance(lock, dict) and {k: lock.get(k) for k in holder} == holder
    me = None if wait_until(sees_lock) else f"{dist.get_rank()} (on {socket.gethostname()})"
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    blind = [who for who in everyone if who is not None]
    if not blind:
        return None
    return (f"{run_dir} is not one folder for every rank: rank(s) {', '.join(blind)} do not see the lock "
            f"{LOCK_FILE} that rank 0 holds there (on {holder['host']}). With several nodes, --out must be on a file "
            "system every node sees, at the same path")


def wait_until(ready, seconds: float = 60.0) -> bool:
    """Poll ready() for up to `seconds`: a file another node just wrote can show up late on a network file system
    (cached directory attributes). Returns at once when it is already true."""
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def prepare_run_dir(cfg: PretrainConfig, manifest: InstancesManifest, chosen: Chosen) -> RunConfig | None:
    """The previous run's config when resuming from `chosen` (checked against the instances), else None."""
    run_dir = Path(cfg.out)
    if cfg.resume:
        if chosen.tag is None:
            why = f" (skipped: {'; '.join(chosen.skipped)})" if chosen.skipped else ""
            raise ConfigError(f"--resume: {run_dir} has no complete checkpoint that verifies{why}; start without "
                              "--resume, in a new --out")
        run = read_run_config(run_dir)
        if manifest.vocab_sha256 and run.vocab_sha256 and manifest.vocab_sha256 != run.vocab_sha256:
            raise ConfigError(f"--resume: {cfg.instances} uses another vocabulary than the run's instances "
                              f"{run.pretrain['instances']} (vocab sha256 {manifest.vocab_sha256[:12]}... vs "
                              f"{run.vocab_sha256[:12]}...)")
        return run
    if checkpoint_steps(run_dir / CHECKPOINTS):
        raise ConfigError(f"{run_dir} already holds checkpoints: pass --resume to continue that run, "
                          "or choose a new --out")
    return None


def write_run_folder(cfg: PretrainConfig, settings: DeepSpeedSettings, ds_config: dict, model: dict,
                     init_source: str, manifest: InstancesManifest, world: int, kernels: str, objective: str,
                     previous: RunConfig | None = None, changes=(), step: int | None = None,
                     threads: dict | None = None) -> None:
    """config.json, deepspeed_config.json and the tokenizer files (rank 0). On --resume config.json keeps the
    run's history of changes and adds this resume's (each with the step it took effect)."""
    from bertkit.pretrain.resume import manifest_id

    run_dir = Path(cfg.out)
    tok_dir = run_dir / RUN_TOKENIZER
    tok_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (Path(cfg.instances) / name).is_file():
            atomic_copy(Path(cfg.instances) / name, tok_dir / name, within=cfg.instances)
    atomic_write_json(run_dir / DEEPSPEED_CONFIG, ds_config)
    own = run_dir / USER_DEEPSPEED_CONFIG  # what a --resume reads: the path given here may not exist there
    if cfg.deepspeed_config and Path(cfg.deepspeed_config).resolve() != own.resolve():
        atomic_write_bytes(own, Path(cfg.deepspeed_config).read_bytes())  # the user's own file, a link or not
    write_run_config(run_dir, RunConfig(
        stage="pretrain", pretrain=asdict(cfg), resolved=asdict(settings), model=model,
        init_from=init_source, instances=str(Path(cfg.instances).resolve()), vocab_size=manifest.vocab_size,
        vocab_sha256=manifest.vocab_sha256, max_seq_length=manifest.max_seq_length, world_size=world,
        deepspeed=ds_config, kernels=kernels, objective=objective, instances_id=manifest_id(manifest), threads=threads,
        changes=(previous.changes if previous else []) + [
            {"step": step, "setting": c.setting, "before": c.before, "after": c.after} for c in changes]))


# ---------------------------------------------------------------- RNG state

def seed_rank(seed: int, rank: int) -> None:
    """A fresh run's per-rank generators: dropout differs per rank."""
    torch.manual_seed(seed + 1 + rank)
    np.random.seed((seed + 1 + rank) % 2**32)
    random.seed(seed + 1 + rank)


# ---------------------------------------------------------------- save and load

def save_checkpoint(engine, run_dir: Path, step: int, rank: int, keep_last: int,
                    skipped_micro_batches: int = 0, elapsed_s: float = 0.0, extra_files: dict | None = None) -> Path:
    """Every rank writes its files into global_stepN.partial; after a barrier, global rank 0 alone finalizes it
    (finalize_checkpoint). One finalizer, not one per node: on a shared folder a second one could rmtree the folder
    the first had just renamed. The other ranks wait for rank 0's outcome, so a failure there stops every rank."""
    ckpt = run_dir / CHECKPOINTS
    tmp = f"global_step{step}.partial"
    client = {"global_step": step, "skipped_micro_batches": skipped_micro_batches}
    try:
        engine.save_checkpoint(str(ckpt), tag=tmp, client_state=client, save_latest=False)
        (ckpt / tmp).mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(rng_state(), buffer)
        atomic_write_bytes(ckpt / tmp / f"rng_rank{rank}.pt", buffer.getvalue())
        for name, data in (extra_files or {}).items():   # this rank's own files (rank 0's moving average)
            atomic_write_bytes(ckpt / tmp / name, data)
    except BaseException:
        shutil.rmtree(ckpt / tmp, ignore_errors=True)  # never complete; and a full disk gets its space back
        raise
    dist.barrier()  # every rank's files are written (and closed) before rank 0 lists them
    world = dist.get_world_size()
    failure = None
    if rank == 0:
        try:
            finalize_checkpoint(ckpt, step, world, keep_last, skipped_micro_batches, elapsed_s)
        except BaseException as e:
            failure = e
            shutil.rmtree(ckpt / tmp, ignore_errors=True)
    box = [None if failure is None else f"{type(failure).__name__}: {failure}"]
    if world > 1:
        dist.broadcast_object_list(box, src=0)  # also the barrier: nobody goes on before the rename
    if failure is not None:
        raise failure
    if box[0]:
        raise TrainingError(f"rank 0 could not finish checkpoint global_step{step} in {ckpt} ({box[0]}); "
                            "see rank 0's message")
    return ckpt / f"global_step{step}"


def finalize_checkpoint(ckpt: Path, step: int, world: int, keep_last: int, skipped_micro_batches: int,
                        elapsed_s: float = 0.0) -> None:
    """Rank 0: checkpoint.json (written last) lists every file with its checksum; the folder is renamed, `latest`
    points at it, and older complete checkpoints beyond keep_last are pruned."""
    tag, folder = f"global_step{step}", ckpt / f"global_step{step}.partial"
    expected = [folder / f"rng_rank{r}.pt" for r in range(world)]  # each rank writes its own after its shards
    if not wait_until(lambda: all(p.is_file() for p in expected)):
        missing = ", ".join(p.name for p in expected if not p.is_file())
        raise TrainingError(f"{folder}: {missing} never appeared here; every rank must write into the same folder: "
                            "with several nodes, --out must be on a file system every node sees")
    files = {p.relative_to(folder).as_posix(): file_entry(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != CHECKPOINT_MARKER}
    marker = CheckpointMarker(step=step, world_size=world, files=files, skipped_micro_batches=skipped_micro_batches,
                              elapsed_s=round(elapsed_s, 3))
    atomic_write_json(folder / CHECKPOINT_MARKER, asdict(marker))
    if (ckpt / tag).exists():
        shutil.rmtree(ckpt / tag)
    os.replace(folder, ckpt / tag)
    atomic_write_bytes(ckpt / LATEST, tag.encode())
    complete = [s for s in checkpoint_steps(ckpt) if read_marker(ckpt / f"global_step{s}") is not None]
    for old in complete[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(ckpt / f"global_step{old}", ignore_errors=True)
    for partial in ckpt.glob("*.partial"):
        shutil.rmtree(partial, ignore_errors=True)


def load_checkpoint(engine, run_dir: Path, chosen: Chosen) -> tuple[int, int, Path]:
    """Load the chosen checkpoint into the engine; returns (its global step, micro batches skipped by rollbacks
    before it, its folder)."""
    ckpt = run_dir / CHECKPOINTS
    with refusing_code():
        path, client = engine.load_checkpoint(str(ckpt), tag=chosen.tag)
    if path is None:
        raise TrainingError(f"{ckpt / chosen.tag}: DeepSpeed could not load this checkpoint")
    return int(client["global_step"]), int(client.get("skipped_micro_batches", 0)), ckpt / chosen.tag


def carry_optimizer(engine, run_dir: Path) -> str:
    """--init-optimizer: the optimizer state (moments, step counts) of run_dir's newest complete checkpoint, loaded
    into a new run's engine; the new run's own learning rate, weight decay and betas stay (the loaded groups would
    bring the old run's), and DeepSpeed's step counters restart with its schedule. Returns the checkpoint's tag."""
    chosen = find_checkpoint(run_dir)
    chosen.refuse_unsafe()
    if chosen.tag is None:
        raise ConfigError(f"--init-optimizer: {run_dir} has no complete checkpoint that verifies")
    own = [{k: v for k, v in group.items() if k != "params"} for group in engine.optimizer.param_groups]
    try:
        with refusing_code(), contextlib.redirect_stdout(io.StringIO()):
            path, _ = engine.load_checkpoint(str(Path(run_dir) / CHECKPOINTS), tag=chosen.tag,
                                             load_optimizer_states=True, load_lr_scheduler_states=False)
    except (RuntimeError, KeyError, ValueError, AssertionError) as e:
        raise ConfigError(f"--init-optimizer: the optimizer state of {run_dir} ({chosen.tag}) does not fit this run "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'no detail'}); the same "
                          "model, optimizer, ZeRO stage and ranks carry it, else start the state anew without "
                          "--init-optimizer (a plan: init_optimizer = false)") from None
    if path is None:
        raise ConfigError(f"--init-optimizer: DeepSpeed could not load {run_dir / CHECKPOINTS / chosen.tag}")
    for group, settings in zip(engine.optimizer.param_groups, own):
        group.update(settings)
    engine.global_steps = engine.global_samples = engine.skipped_steps = 0
    return chosen.tag


def restore_rng(checkpoint: Path, rank: int) -> None:
    set_rng_state(safe_load(checkpoint / f"rng_rank{rank}.pt"))


# ---------------------------------------------------------------- weights and export

def load_run_state_dict(run_dir, tag: str | None = None, say=None) -> tuple[dict, RunConfig, str]:
    """fp32 weights of a run's checkpoint, ZeRO-3 partitions included: `tag`, or the newest complete one whose files
    verify (`say` hears about newer ones passed over). Returns (state_dict, the run's config, tag)."""
    run_dir = Path(run_dir)
    ckpt = run_dir / CHECKPOINTS
    run = read_run_config(run_dir)
    if tag is None:
        chosen = find_checkpoint(run_dir)
        chosen.refuse_unsafe()
        for why in chosen.skipped:
            if say is not None:
                say(f"skipped checkpoint {why}")
        if chosen.tag is None:
            why = f": {'; '.join(chosen.skipped)}" if chosen.skipped else ""
            raise ConfigError(f"{run_dir}: no complete checkpoint that verifies{why}")
        tag = chosen.tag
    elif not (ckpt / tag).is_dir():
        have = sorted(p.name for p in ckpt.glob("global_step*") if not p.name.endswith(".partial"))
        raise ConfigError(f"{ckpt / tag}: no such checkpoint; the run has {', '.join(have) or 'none'}")
    else:
        marker = read_marker(ckpt / tag)
        problems = checkpoint_problems(ckpt / tag, marker) if marker else []
        if problems:
            raise ConfigError(f"{ckpt / tag}: damaged ({'; '.join(problems)}); choose another --checkpoint, or "
                              "leave it out to take the newest one that verifies")
        if unsafe := first_unsafe_file(ckpt / tag):
            raise UnsafeCheckpointError(*unsafe)
    other = "choose another --checkpoint, or leave it out to take the newest one that verifies"
    try:
        state = _model_states(ckpt, tag, run.zero_stage)
    except FormatError:
        raise
    except Exception as e:  # a file that passed the scan but is not what DeepSpeed or bertkit wrote
        raise DamagedFileError(ckpt / tag, f"its model states cannot be read ({type(e).__name__}: "
                                           f"{str(e).splitlines()[0][:200] if str(e) else 'no detail'})",
                               other) from None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise DamagedFileError(ckpt / tag, "its model states are not a dictionary of tensors", other)
    return {k: v.float() for k, v in state.items()}, run, tag


def _model_states(ckpt: Path, tag: str, zero_stage: int):
    with refusing_code():
        if zero_stage >= 1:
            # zero_to_fp32's prints and bars are DeepSpeed's chatter, not the user's business
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                return get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=tag)
        files = sorted((ckpt / tag).glob("mp_rank_*_model_states.pt"))
        if not files:
            raise FileNotFoundError("no mp_rank_*_model_states.pt")
        return safe_load(files[0])["module"]


def check_run_model(run_dir, run, state: dict | None) -> None:
    """The model a run folder's config.json describes, built on the meta device (no memory taken): its settings in
    range and, given the checkpoint's tensors, every shape theirs; RunError naming config.json otherwise."""
    where = Path(run_dir) / RUN_CONFIG
    try:
        with torch.device("meta"):
            skeleton = build_pretraining(run.model, run.objective)
    except (ValueError, TypeError, KeyError) as e:
        raise RunError(f"{where}: its model settings cannot be built ({e}); the run folder is damaged or not "
                       "bertkit's") from None
    if state is None:
        return
    for name, want in skeleton.state_dict().items():
        have = state.get(name)
        if have is not None and tuple(have.shape) != tuple(want.shape):
            raise RunError(f"{where}: its model gives {name} the shape {tuple(want.shape)}, but the checkpoint holds "
                           f"{tuple(have.shape)}; the two do not belong together")


def weights_kind(random_seed: int | None, ema: bool = False) -> str:
    if ema:
        return "the moving average of the trained weights"
    return "trained weights" if random_seed is None else f"random weights (seed {random_seed})"


def export(run_dir, out_dir, tag: str | None = None, say=None, overwrite: bool = False,
           random_seed: int | None = None, ema: bool = False) -> Path:
    """Write the HF format (config.json, model.safetensors, tokenizer files) of a run's checkpoint (`tag`, or the
    newest one that verifies), and manifest.json with every file's checksum, written last. An ELECTRA run: the
    discriminator (ElectraForPreTraining) in out_dir, the generator (ElectraForMaskedLM) in out_dir/generator.
    random_seed: the run's architecture and tokenizer with fresh weights drawn as `pretrain --seed` draws them (at
    the run's own seed: the weights a run begun from random started from), the baseline its pretraining is judged
    against; no checkpoint is read. ema: the checkpoint's moving average of the weights (pretrain --ema)."""
    model, run, tag = model_to_export(run_dir, tag, say, random_seed, ema)
    tok = Path(run_dir) / RUN_TOKENIZER
    for name in TOKENIZER_FILES:  # a folder from someone else: no link in it is followed, none copied out
        if (tok / name).exists() or (tok / name).is_symlink():
            regular_file(tok / name, within=run_dir)
    # the run by its folder's name and a digest of where it is: no path of this machine in a published folder
    run_id = export_run_id(run_dir)
    extra = {"bertkit": {"run": Path(run_dir).resolve().name, "checkpoint": tag, "vocab_sha256": run.vocab_sha256,
                         "objective": run.objective}}
    corpus = data_facts(run)["corpus"]
    if corpus is not None:   # the evaluation files its corpus was cleaned of (finetune records it beside each score)
        extra["bertkit"]["decontaminated_against"] = sorted(corpus.get("decontamination", {}).get("files", {}))
    out_dir = Path(out_dir)
    # a new or empty folder, or an earlier export; never another's folder. The new export is written whole beside
    # the old one and swapped in: a kill at any moment leaves one of the two, and only bertkit's files are replaced.
    with folder_lock(out_dir, "export"), disk_errors(out_dir, "free space, then run the same export again"):
        earlier = read_json_or_none(out_dir / MANIFEST)
        if isinstance(earlier, dict):   # the run by name and digest (an export from before recorded its path)
            run_id_then = earlier.get("run_id") or export_run_id(str(earlier.get("run")))
            earlier = {**earlier, "kind": weights_kind(earlier.get("random_seed"), bool(earlier.get("ema"))),
                       "run": f"{Path(str(earlier.get('run'))).name} ({run_id_then})"}
        refuse_other_inputs(out_dir, "export", {"run": f"{Path(run_dir).resolve().name} ({run_id})",
                                                "kind": weights_kind(random_seed, ema)}, earlier, overwrite)
        output, staging = Output(out_dir, "export", manifest_files=True), staging_folder(out_dir)
        tokenizer = tok if (tok / "vocab.txt").is_file() else None
        # an ELECTRA pair: the discriminator here, the generator in generator/
        save_pretrained(model, staging, tokenizer_dir=tokenizer, extra_config=extra,
                        masked_lm_only=run.objective == "none")
        trained_length = min(model.cfg.max_length, run.max_seq_length or model.cfg.max_length)
        if run.objective == "none" and tokenizer is not None:  # read through the mean: a sentence encoder too
            write_sentence_transformers_files(staging, model.cfg.hidden_size, trained_length)
        card = out_dir / "README.md"
        if (card.exists() or card.is_symlink()) and "README.md" not in output.ours():
            if say:   # a model card of the user's own: kept, never replaced by bertkit's
                say(f"export: {card} is yours: kept, and bertkit's model card not written (move it to get one)")
        else:
            config = json.loads((staging / "config.json").read_text(encoding="utf-8"))
            atomic_write_bytes(staging / "README.md", model_card(run_dir, run, config, tag, random_seed).encode())
        files = {name: file_entry(staging / name) for name in staged_files(staging) if name != MANIFEST}
        write_manifest(staging, ExportManifest(stage="export", complete=True, run=Path(run_dir).resolve().name,
                                               run_id=run_id, checkpoint=tag, random_seed=random_seed, files=files,
                                               ema=ema))
        swap_in(output, staging, last=MANIFEST)
        if (note := output.finish()) and say:
            say(note)
    return out_dir


def export_run_id(run_dir) -> str:
    """Which run an export came from, without saying where it lies: a digest of the run folder's full path."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def averaged(checkpoint: Path, state: dict) -> dict:
    """The moving average a checkpoint keeps (pretrain --ema), each tensor one of the weights' own shape."""
    from bertkit.pretrain.ema import EMA_FILE, read_ema

    if not (checkpoint / EMA_FILE).is_file():
        raise ConfigError(f"{checkpoint}: keeps no moving average of the weights; pretrain with --ema DECAY (a "
                          "--resume may add it), or export without --ema")
    average = read_ema(checkpoint)
    wrong = [k for k, v in average.items() if k not in state or state[k].shape != v.shape]
    if wrong:
        raise DamagedFileError(checkpoint / EMA_FILE, f"holds {wrong[0]!r}, not a weight of the run's model",
                               "choose another --checkpoint, or export without --ema")
    return {k: v.float() for k, v in average.items()}


def model_to_export(run_dir, tag: str | None, say, random_seed: int | None, ema: bool = False):
    """(model, run config, tag): the checkpoint's weights (or their moving average) in the run's model (or fresh
    ones drawn at random_seed), with the dropout and the classifier pooling an export writes."""
    if random_seed is None:
        state, run, tag = load_run_state_dict(run_dir, tag, say)
        if ema:
            state = {**state, **averaged(Path(run_dir) / CHECKPOINTS / tag, state)}
        check_run_model(run_dir, run, state)
        model = build_pretraining(run.model, run.objective)
    else:
        state, run, tag = None, read_run_config(run_dir), f"random-seed{random_seed}"
        check_run_model(run_dir, run, None)
        with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
            torch.manual_seed(random_seed)
            model = build_pretraining(run.model, run.objective)
        if say:
            began = ("the weights this run began from" if run.init_from == "random initialisation" and
                     random_seed == run.pretrain.get("seed") else
                     f"not the weights this run began from ({run.init_from}, seed {run.pretrain.get('seed')})")
            say(f"export: random weights drawn at seed {random_seed}, {began}; no checkpoint read")
    if dropout := run.model.get("export_dropout"):  # pretrained with --dropout: fine-tuning gets the model's own
        for shape in family_of(model).encoder_configs(model):  # ELECTRA's generator too
            shape.set_dropout(dropout["hidden"], dropout["attention"])
        if say:
            say(f"export: dropout {dropout['hidden']:g} (attention {dropout['attention']:g}) in config.json, the "
                f"model's own for fine-tuning; pretraining ran with {run.pretrain.get('dropout')}")
    # no sentence task trained [CLS]: classifiers read the mean (measured:
    # docs/studies/2026-11-23-transfer-benchmark.md); set either way, as a run started --init-from such an export
    # inherits its config
    model.cfg.set_pooling("mean" if run.objective == "none" else "cls")
    if run.objective == "none" and say:
        say("export: classifier_pooling mean in config.json (pretrained without NSP/SOP, so [CLS] learnt nothing); "
            "finetune --pooling cls overrides it")
    missing, unexpected = model.load_state_dict(state, strict=False) if state is not None else ([], [])
    if missing or unexpected:
        raise TrainingError(f"{run_dir} ({tag}): checkpoint does not fit the model "
                            f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    return model, run, tag
