"""``nipflow status``: where a run stands, readable in one screen."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from nip_core.errors import CheckpointNotFoundError, CorruptCheckpointError
from nip_core.runs import RunStore

_HEADLINE_KEYS = ("verifier.mean_episode_reward", "mean_accuracy", "test_mean_accuracy",
                  "mean_decided_accuracy", "test_mean_decided_accuracy",
                  "mean_episode_length", "prover.mean_episode_reward")
# accuracies shown besides (the solo trainer's, per class): not the spreads and per-datapoint ones
_NOT_HEADLINE = ("std_", "worst_", "datapoint")


def run_status(store: RunStore, run_id: str) -> dict[str, Any]:
    """Collect the status of a run as a plain dict."""
    params = store.load_params(run_id)
    storage = store.run_storage(run_id)
    from nip_core.runs.store import Run

    run = Run(storage, run_id, params)
    meta = run.metadata() if run.exists("metadata.json") else {}
    info: dict[str, Any] = {
        "run_id": run_id,
        "location": run.location,
        "scenario": params.scenario,
        "trainer": params.trainer,
        "protocol": params.interaction_protocol,
        "params_hash": params.params_hash(),
        "total_iterations": params.rl.num_iterations,
        "created": meta.get("created"),
        "updated": meta.get("updated"),
        "wandb": {k: meta[k] for k in ("wandb_run_id", "wandb_dir", "wandb_project") if k in meta},
    }
    try:
        state = run.read_json("state.json", "state file")
        info["iteration"] = state.get("iteration", 0)
        default_stage = "done" if info["iteration"] >= params.rl.num_iterations else "training"
        info["stage"] = state.get("train_loop_stage", default_stage)
        groups = state.get("shared_model_groups") or {}
        info["fine_tune_jobs"] = {
            name: {k: g.get(k) for k in ("fine_tune_job_id", "fine_tuned_model_name", "last_status")}
            for name, g in groups.items()
        }
    except CheckpointNotFoundError:
        info["iteration"] = 0
        info["stage"] = "not started"
    except CorruptCheckpointError as e:
        info["stage"] = f"state unreadable: {e.reason}"
    train_rows = [r for r in run.read_metrics() if r.get("kind", "train") == "train"]
    test_rows = [r for r in run.read_metrics() if r.get("kind") == "test"]
    info["last_metrics"] = train_rows[-1] if train_rows else None
    info["last_test_metrics"] = test_rows[-1] if test_rows else None
    info["checkpoints"] = run.list_checkpoints()
    info["locked_by"] = _lock_holder(run)
    return info


def _lock_holder(run) -> dict | None:
    """Who holds the run's lease now (None when free or expired)."""
    current = run.lock.view()
    if current.expired(run.lock.clock()):
        return None
    return {**current.holder, "generation": current.generation, "expires_at": current.expires_at}


def format_status(info: dict[str, Any]) -> str:
    lines = [
        f"run        {info['run_id']}  ({info['scenario']} / {info['trainer']} / {info['protocol']})",
        f"stage      {info.get('stage')}   iteration {info.get('iteration', 0)}/{info['total_iterations']}",
        f"store      {info['location']}",
        f"params     {info['params_hash']}   updated {info.get('updated')}",
    ]
    if info.get("locked_by"):
        holder = info["locked_by"]
        since = datetime.fromtimestamp(holder["since"], timezone.utc).isoformat() if holder.get("since") else "?"
        lines.append(f"running    pid {holder.get('pid')} on {holder.get('host')} since {since} "
                     f"(lease generation {holder.get('generation')})")
    if info.get("wandb"):
        lines.append("wandb      " + "  ".join(f"{k}={v}" for k, v in info["wandb"].items()))
    for name, job in (info.get("fine_tune_jobs") or {}).items():
        lines.append(f"group      {name}: job {job.get('fine_tune_job_id')} "
                     f"status {job.get('last_status')} model {job.get('fine_tuned_model_name')}")
    for title, row in (("metrics", info.get("last_metrics")), ("test", info.get("last_test_metrics"))):
        if row:
            shown = {k: row[k] for k in row if k in _HEADLINE_KEYS or (
                k.endswith("accuracy") and not any(part in k for part in _NOT_HEADLINE))}
            text = "  ".join(f"{k}={_fmt(v)}" for k, v in sorted(shown.items())[:8])
            lines.append(f"{title:<10} it {row.get('iteration')}: {text}")
    if info.get("checkpoints"):
        lines.append(f"checkpoints {', '.join(info['checkpoints'][-5:])}")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
