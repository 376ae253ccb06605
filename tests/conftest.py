"""Suite-wide settings: hermetic, single-threaded, no network, no user profiles."""

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RL_WARNINGS", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
for _var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "PREFECT_API_URL"):
    os.environ.pop(_var, None)

import torch  # noqa: E402

torch.set_num_threads(1)
