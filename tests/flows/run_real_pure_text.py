"""Child process of ``test_pure_text_flow_real.py``: ``train_experiment`` with the real trainers.

Usage: ``python run_real_pure_text.py '<ExperimentParameters JSON>' TAG``. The flow run is
tagged ``TAG`` so that the test finds it through the Prefect API even when this process
SIGKILLs itself (``NIPFLOW_TEST_KILL_AT``, read by :mod:`tests.kill_points`, which
registers a killing point hook in this process) before the flow run ends.
"""

import sys

import torch

torch.set_num_threads(1)

from prefect import tags  # noqa: E402

from flows.experiment import train_experiment  # noqa: E402
from flows.parameters import ExperimentParameters  # noqa: E402
from tests.kill_points import install_from_env  # noqa: E402

if __name__ == "__main__":
    install_from_env()
    with tags(sys.argv[2]):
        state = train_experiment(**ExperimentParameters.model_validate_json(sys.argv[1]).flow_parameters(), return_state=True)
    sys.exit(0 if state.is_completed() else 1)
