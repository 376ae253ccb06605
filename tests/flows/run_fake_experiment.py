"""Child process of the flow tests: run ``train_experiment`` with the fake trainers.

Usage: ``python run_fake_experiment.py '<ExperimentParameters JSON>'``.
"""

import sys

import torch

torch.set_num_threads(1)

import nipflow_fakes  # noqa: E402

nipflow_fakes.install()

from flows.experiment import train_experiment  # noqa: E402
from flows.parameters import ExperimentParameters  # noqa: E402

if __name__ == "__main__":
    state = train_experiment(**ExperimentParameters.model_validate_json(sys.argv[1]).flow_parameters(), return_state=True)
    sys.exit(0 if state.is_completed() else 1)
