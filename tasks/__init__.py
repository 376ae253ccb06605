"""Prefect tasks: thin wrappers that call nip_core, with results persisted in the run store.

``tasks.stages``: one task per pure-text stage; ``tasks.rl_block``: RL iteration blocks;
``tasks.persistence``: the run-keyed cache policy and result storage; ``tasks.locks``:
the stale-aware lock manager.
"""
