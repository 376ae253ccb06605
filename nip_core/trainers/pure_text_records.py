"""What a pure-text run writes to the run store besides its state.

:class:`RolloutRecords` owns the paths and the write-once rules:

* ``rollouts/{name}.json``: the rollouts of an iteration (``name = "3"``) or of a test loop
  (``"test_3"``), written once; a stage that finds the file reuses it;
* ``transcripts/raw_{name}.{yaml|json}``: readable transcripts of the same rollouts;
* ``models/iter_{i}.json``: the model each shared model group sampled iteration ``i``
  with (written once; a rerun-tests run replays them);
* ``stages/it{i}_{stage}.json``: the summary of each finished stage.

A trainer without a run store (or with ``settings.test_run``) hands a
:class:`~nip_core.runs.NullRun`: nothing is written, nothing is found.
"""

from __future__ import annotations

from typing import Any, Callable

import yaml

from nip_core.environments.nested_array_dict import NestedArrayDict
from nip_core.trainers.pure_text_stats import raw_transcript


def rollouts_path(name: str) -> str:
    return f"rollouts/{name}.json"


def models_path(iteration: int) -> str:
    return f"models/iter_{iteration}.json"


def summary_path(iteration: int, stage: str) -> str:
    return f"stages/it{iteration}_{stage}.json"


class RolloutRecords:
    """Rollouts, transcripts, per-iteration models and stage summaries of one run.

    Parameters
    ----------
    run
        The run in the run store, or a ``NullRun`` (nothing is persisted).
    text_rl
        The ``text_rl`` hyper-parameters (``save_transcripts``, ``transcript_format``).
    agent_names
        The protocol's agents, in order (transcripts name them).
    log_artifact
        ``(prefix, artifact_type, rel_paths)``: logs written files as an artifact version.
    """

    def __init__(self, run: Any, text_rl: Any, agent_names: list[str],
                 log_artifact: Callable[[str, str, list[str]], None]):
        self.run = run
        self.text_rl = text_rl
        self.agent_names = agent_names
        self.log_artifact = log_artifact
        self._cache: tuple[str, list[NestedArrayDict]] | None = None

    # -- rollouts ----------------------------------------------------------------------------

    def has_rollouts(self, name: str) -> bool:
        return self.run.exists(rollouts_path(name))

    def load_rollouts(self, name: str) -> list[NestedArrayDict]:
        """The stored rollouts ``name`` (read from the run store)."""
        return [NestedArrayDict.from_dict(d) for d in self.run.read_json(rollouts_path(name), "rollouts")]

    def keep(self, name: str, rollouts: list[NestedArrayDict]) -> None:
        """Hold ``rollouts`` in memory as those of ``name`` (the training rollouts of the iteration)."""
        self._cache = (name, rollouts)

    def rollouts(self, name: str) -> list[NestedArrayDict]:
        """The rollouts ``name``, from memory when they are the ones kept, else from the store."""
        if self._cache is None or self._cache[0] != name:
            self._cache = (name, self.load_rollouts(name))
        return self._cache[1]

    def save_rollouts(self, name: str, rollouts: list[NestedArrayDict]) -> None:
        """Write the rollouts (and their transcripts when asked) and log them as artifacts."""
        if not self.run.persistent:
            return  # not even serialised
        # Written once (Run.write_once): a driver that lost the run while paused cannot
        # replace what the driver that took over wrote (and built its fine-tune jobs from).
        self.run.write_json_once(rollouts_path(name), [r.to_dict() for r in rollouts], "rollouts")
        self.log_artifact("full_rollouts", "full_rollouts", [rollouts_path(name)])
        self._save_transcripts(name, rollouts)

    def reuse_rollouts(self, name: str) -> list[NestedArrayDict]:
        """The rollouts ``name`` an interrupted attempt stored, completed with their transcripts.

        That attempt may have stopped (or been paused and taken over) between the rollouts
        and their transcripts: this driver writes the transcripts then, so that the old one,
        if it wakes, finds them (their bytes follow from the rollouts: equal bytes, no-op).
        """
        rollouts = self.load_rollouts(name)
        if self.run.persistent:
            self._save_transcripts(name, rollouts)
        return rollouts

    def _save_transcripts(self, name: str, rollouts: list[NestedArrayDict]) -> None:
        if not self.text_rl.save_transcripts:
            return
        data = [raw_transcript(r, self.agent_names) for r in rollouts]
        ext = self.text_rl.transcript_format
        path = f"transcripts/raw_{name}.{ext}"
        if ext == "yaml":
            created = self.run.write_once(path, yaml.safe_dump(data, sort_keys=False).encode(), "transcripts")
        else:
            created = self.run.write_json_once(path, data, "transcripts")
        if created:
            self.log_artifact("raw_transcript", "raw_transcript", [path])

    # -- models and stage summaries ----------------------------------------------------------

    def record_models(self, iteration: int, models: dict[str, str]) -> None:
        """Write ``models/iter_{iteration}.json`` unless it exists (written once)."""
        if not self.run.exists(models_path(iteration)):
            self.run.write_json_once(models_path(iteration), models, "models record")

    def write_summary(self, iteration: int, stage: str, summary: dict[str, Any]) -> dict[str, Any]:
        """Write the stage's summary once; the summary that stands (the first one written).

        A stage is run again only when its process died after the summary and before the
        state moved on; the first summary is kept then (what orchestrators may already have
        read). A driver that lost its lease gets ``LeaseLostError`` instead.
        """
        if not self.run.persistent:
            return summary
        return self.run.write_json_keep_first(summary_path(iteration, stage), summary, "stage summary")

    def stored_summary(self, iteration: int, stage: str) -> dict[str, Any] | None:
        if not self.run.exists(summary_path(iteration, stage)):
            return None
        return self.run.read_json(summary_path(iteration, stage), "stage summary")
