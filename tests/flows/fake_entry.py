"""Deployment entrypoint for the suspend/resume test: the real flows, fake trainers."""

import torch

torch.set_num_threads(1)

import nipflow_fakes  # noqa: E402

nipflow_fakes.install()

from flows.experiment import train_experiment  # noqa: E402,F401
