"""nip_core: the domain library of nipflow (no Prefect imports, ever).

``build_trainer(params, settings).train()`` runs a whole experiment in-process.
"""

import os as _os
import warnings as _warnings

# torchrl's C++ extension does not load with torch 2.13 (no prioritized replay; PPO does
# not need it). Silence the import-time warning it prints.
_warnings.filterwarnings("ignore", message=r".*torchrl.*C\+\+.*", category=UserWarning)
_warnings.filterwarnings("ignore", message=r".*Failed to import torchrl C\+\+ binaries.*")
_os.environ.setdefault("WANDB_SILENT", "true")
_os.environ.setdefault("RL_WARNINGS", "0")

__version__ = "0.1.0"
